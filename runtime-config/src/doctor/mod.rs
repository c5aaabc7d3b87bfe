//! `vgpuctl doctor`: a node's pre-flight check, one line per check and an exit status for scripts (0: all
//! well, 1: a check failed, 2: warnings only). Run by the package after install (never failing it), and by
//! an operator before a rollout. Not here: fixing anything (every line that is not ok says what to run).
//!
//! * `report`: the lines, their verdicts, the exit status and the text.
//! * `checks`: the config, NVML and the driver, the state root's filesystem, the installed files. Each
//!   takes its inputs through [`Host`], so that tests run it on a fake NVML and temporary folders.
//! * `cdi`: NVIDIA's runtime and CDI spec, vgpu's CDI spec, through [`Host`] likewise.
//! * `engines`: whether each container engine's files carry vgpu's entry (the engines' own `ownership`).
//! * `host`: what the checks read ([`Host`]), each seam replaceable.
//! * `cli`: `vgpuctl doctor`'s options (which engine, where its files are).

pub mod cdi;
pub mod checks;
pub mod cli;
pub mod engines;
pub mod host;
pub mod report;
#[cfg(test)]
mod tests;

pub use report::{Line, Report, Verdict};

pub use host::{Host, OpenNvml};

/// Every check, in the order the lines are printed.
pub fn run(h: &Host) -> Report {
    let mut r = Report::default();
    let cfg = checks::config(h, &mut r);
    engines::check(h, &mut r);
    let gpus = checks::nvml(h, &cfg, &mut r);
    cdi::nvidia(h, &cfg, &mut r);
    cdi::vgpu_cdi(h, gpus.as_deref(), &mut r);
    checks::state_root(&cfg, &mut r);
    checks::installed(h, &cfg, &mut r);
    r
}
