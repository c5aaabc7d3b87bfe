//! `vgpuctl doctor`: a node's pre-flight check, one line per check and an exit status for scripts (0: all
//! well, 1: a check failed, 2: warnings only). Run by the package after install (never failing it), and by
//! an operator before a rollout. Not here: fixing anything (every line that is not ok says what to run).
//!
//! * `report`: the lines, their verdicts, the exit status and the text.
//! * `checks`: the config, NVML and the driver, NVIDIA's runtime and CDI spec, vgpu's CDI spec, the state
//!   root's filesystem, the installed files. Each takes its inputs through [`Host`], so that tests run it
//!   on a fake NVML and temporary folders.
//! * `engines`: whether each container engine's files carry vgpu's entry (the engines' own `ownership`).
//! * `cli`: `vgpuctl doctor`'s options (which engine, where its files are).

pub mod checks;
pub mod cli;
pub mod engines;
pub mod report;
#[cfg(test)]
mod tests;

pub use report::{Line, Report, Verdict};

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

/// Every check, in the order the lines are printed.
pub fn run(h: &Host) -> Report {
    let mut r = Report::default();
    let cfg = checks::config(h, &mut r);
    engines::check(h, &mut r);
    let gpus = checks::nvml(h, &cfg, &mut r);
    checks::nvidia(h, &cfg, &mut r);
    checks::vgpu_cdi(h, gpus.as_deref(), &mut r);
    checks::state_root(&cfg, &mut r);
    checks::installed(h, &cfg, &mut r);
    r
}
