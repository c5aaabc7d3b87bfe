//! `vgpuctl doctor`'s command line: which engine to look at (`--runtime`, with that engine's own options
//! saying where its files are, as `vgpuctl runtime` takes them; every engine at its defaults without it),
//! and the NVML library. Builds the [`Host`] of the real machine and runs the checks.

use super::{run, Host, Report};
use crate::engines::error::EngineError;
use crate::engines::files::Disk;
use crate::engines::registry::{find, ENGINES};
use crate::engines::{cli::refuse_other_engines_options, record};
use clap::{Arg, ArgMatches, Command, FromArgMatches};
use std::collections::BTreeSet;
use std::path::PathBuf;
use vgpu_host::config::Config;

/// Why doctor did not run: its options, not the node (what it finds on the node is in the report).
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// `--runtime` names no engine vgpuctl knows.
    #[error("unknown engine {0}")]
    UnknownEngine(String),
    /// An engine's option (`--config`, `--drop-in`, ...) without `--runtime` to say whose.
    #[error("{0} names an engine's files: give --runtime too")]
    NeedsRuntime(String),
    /// An option of another engine than the one named, or options that do not fit the engine's.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// An engine's options at their defaults that clap would not take.
    #[error(transparent)]
    Args(#[from] clap::Error),
}

/// `vgpuctl doctor`'s matches.
pub struct DoctorArgs(ArgMatches);

impl FromArgMatches for DoctorArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(DoctorArgs(m.clone()))
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.0 = m.clone();
        Ok(())
    }
}

impl clap::Args for DoctorArgs {
    fn augment_args(cmd: Command) -> Command {
        let mut cmd = cmd
            .arg(
                Arg::new("runtime")
                    .long("runtime")
                    .value_name("RUNTIME")
                    .value_parser(clap::builder::PossibleValuesParser::new(
                        ENGINES.iter().map(|e| e.name()),
                    ))
                    .help("Check only this engine, at the files its options name (default: every engine at its default files)"),
            )
            .arg(
                Arg::new("nvml_library")
                    .long("nvml-library")
                    .value_name("LIB")
                    .help("NVML library to check (default: the config's nvml_library)"),
            );
        let mut seen = BTreeSet::new();
        for e in ENGINES {
            for a in e.args(false) {
                if seen.insert(a.get_id().clone()) {
                    cmd = cmd.arg(a);
                }
            }
        }
        cmd
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl DoctorArgs {
    /// Runs every check on this machine; the report says the exit status.
    pub fn run(&self) -> Result<Report, DoctorError> {
        let m = &self.0;
        let engines = match m.get_one::<String>("runtime") {
            Some(name) => {
                let e = find(name).ok_or_else(|| DoctorError::UnknownEngine(name.clone()))?;
                refuse_other_engines_options(e, m, false)?;
                vec![(e, m.clone())]
            }
            None => {
                let given: Vec<String> = ENGINES
                    .iter()
                    .flat_map(|e| e.args(false))
                    .filter(|a| {
                        m.value_source(a.get_id().as_str())
                            == Some(clap::parser::ValueSource::CommandLine)
                    })
                    .map(|a| format!("--{}", a.get_long().unwrap_or_default()))
                    .collect();
                if let Some(o) = given.first() {
                    return Err(DoctorError::NeedsRuntime(o.clone()));
                }
                ENGINES
                    .iter()
                    .map(|e| {
                        let cmd = e
                            .args(false)
                            .into_iter()
                            .fold(Command::new("doctor"), |c, a| c.arg(a));
                        Ok((*e, cmd.try_get_matches_from(["doctor"])?))
                    })
                    .collect::<Result<_, clap::Error>>()?
            }
        };
        let (config_path, config_must_exist) = Config::path();
        let mut program_dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        program_dirs.extend(super::cdi::NVIDIA_DIRS.iter().map(PathBuf::from));
        let open = |lib: &str| vgpu_host::nvml::open(lib);
        let host = Host {
            config_path,
            config_must_exist,
            open_nvml: &open,
            nvml_library: m.get_one::<String>("nvml_library").cloned(),
            engines,
            files: &Disk,
            record: record::default_path(),
            program_dirs,
            cdi_dirs: vgpu_host::cdi::SPEC_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
        };
        Ok(run(&host))
    }
}
