//! What the doctor's checks read, as one value ([`Host`]): the config file, NVML, the engines and their
//! files, the folders searched for programs and CDI specs. `cli` builds the real machine's; tests build
//! one of temporary folders and a fake NVML. Not here: the checks.

use crate::engines::api::DynEngine;
use crate::engines::files::Files;
use clap::ArgMatches;
use std::path::PathBuf;
use vgpu_host::nvml::{Nvml, NvmlError};

/// Opens NVML by name or path (`vgpu_host::nvml::open`, or a fake in tests).
pub type OpenNvml<'a> = &'a dyn Fn(&str) -> Result<Box<dyn Nvml>, NvmlError>;

/// Everything the checks read, so that each can be pointed elsewhere.
pub struct Host<'a> {
    /// The vgpu config file and whether it must exist (`VGPU_CONFIG` names one that must).
    pub config_path: PathBuf,
    pub config_must_exist: bool,
    /// NVML, when the config's (or `--nvml-library`'s) library is asked for.
    pub open_nvml: OpenNvml<'a>,
    /// Overrides the config's `nvml_library`.
    pub nvml_library: Option<String>,
    /// The engines to check, each with its options (where its files are).
    pub engines: Vec<(&'static dyn DynEngine, ArgMatches)>,
    /// What the engines read.
    pub files: &'a dyn Files,
    /// vgpuctl's record of engine changes.
    pub record: PathBuf,
    /// Folders searched for programs (NVIDIA's runtime, the lower runtime, the engines'): `PATH`, then
    /// where NVIDIA's installers put the runtime.
    pub program_dirs: Vec<PathBuf>,
    /// Folders engines read CDI specs from.
    pub cdi_dirs: Vec<PathBuf>,
}
