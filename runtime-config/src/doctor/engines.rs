//! The doctor's engine lines: for each engine (or the one `--runtime` names), whether its files carry vgpu's
//! entry, by the engine's own `ownership` (the check configure makes before writing). Not here: changing
//! anything (`vgpuctl runtime configure` does).

use super::checks;
use super::host::Host;
use super::report::{Report, Verdict};
use crate::engines::api::{Context, DynEngine, Install};
use crate::engines::ownership::Ownership;
use clap::ArgMatches;
use std::path::{Path, PathBuf};
use vgpu_ledger::keys;

/// The program that says an engine is installed when its files are not there yet.
fn program(engine: &str) -> &str {
    match engine {
        "docker" => "dockerd",
        other => other,
    }
}

/// The file or folder the engine's entry is in: the option given (`--config`, `--hooks-dir`), else its
/// default.
fn where_(e: &dyn DynEngine, m: &ArgMatches) -> PathBuf {
    ["config", "hooks_dir"]
        .iter()
        .find_map(|id| m.try_get_one::<PathBuf>(id).ok().flatten().cloned())
        .unwrap_or_else(|| PathBuf::from(e.default_paths()[0]))
}

pub fn check(h: &Host, r: &mut Report) {
    let install = Install::default();
    let cx = Context {
        files: h.files,
        record: &h.record,
        install: &install,
        force: false,
    };
    let vgpu_cdi = !checks::specs_of_kind(&h.cdi_dirs, keys::cdi::KIND).is_empty();
    for (e, m) in &h.engines {
        let name = e.name();
        let at = where_(*e, m);
        let given = at != Path::new(e.default_paths()[0]);
        match e.ownership(m, &cx) {
            Ok(Ownership::Ours) => {
                r.push(Verdict::Ok, "engine", format!("{name}: vgpu's entry in {}", at.display()))
            }
            Ok(Ownership::Foreign { path, why }) => r.push(
                Verdict::Fail,
                "engine",
                format!(
                    "{name}: {} has an entry named vgpu that is not vgpu's ({why}): containers asking for vgpu get it",
                    path.display()
                ),
            ),
            Ok(Ownership::Absent) => {
                let installed = given
                    || at.exists()
                    || checks::find_program(program(name), &h.program_dirs).is_some();
                if !installed {
                    r.push(Verdict::Info, "engine", format!("{name}: not installed"));
                } else if name == "podman" && vgpu_cdi {
                    r.push(
                        Verdict::Ok,
                        "engine",
                        format!(
                            "{name}: no hooks in {}; vgpu's CDI spec serves --device {}=…",
                            at.display(),
                            keys::cdi::KIND
                        ),
                    );
                } else {
                    r.push(
                        Verdict::Warn,
                        "engine",
                        format!(
                            "{name}: no vgpu entry in {} (vgpuctl runtime configure --runtime={name})",
                            at.display()
                        ),
                    );
                }
            }
            Err(err) => r.push(Verdict::Fail, "engine", format!("{name}: {err:#}")),
        }
    }
}
