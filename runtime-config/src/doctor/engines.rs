//! The doctor's engine lines: for each engine (or the one `--runtime` names), whether its files carry vgpu's
//! entry, by the engine's own `ownership` (the check configure makes before writing). Not here: changing
//! anything (`vgpuctl runtime configure` does).

use super::checks;
use super::host::Host;
use super::report::{Report, Verdict};
use crate::engines::api::{Context, DynEngine, Install};
use crate::engines::error::EngineError;
use crate::engines::ownership::Ownership;
use clap::ArgMatches;
use std::path::{Path, PathBuf};

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

/// Other places an engine's entry may be when its options name none: Podman's and CRI-O's hooks folder of
/// the administrator (`/etc/containers/oci/hooks.d`, which the package's removal looks in too).
fn elsewhere(engine: &str) -> &'static [&'static [&'static str]] {
    match engine {
        "podman" => &[&["--hooks-dir", ETC_HOOKS_DIR]],
        _ => &[],
    }
}

/// The administrator's hooks folder, read before the vendor's.
pub const ETC_HOOKS_DIR: &str = "/etc/containers/oci/hooks.d";

/// The engine's ownership at its given or default files, else (when absent there and no option was given)
/// at the first of its other places that has an entry, with where it was found.
fn ownership_anywhere(
    e: &dyn DynEngine,
    m: &ArgMatches,
    cx: &Context,
) -> (PathBuf, Result<Ownership, EngineError>) {
    let at = where_(e, m);
    let first = e.ownership(m, cx);
    if !matches!(first, Ok(Ownership::Absent)) || at != Path::new(e.default_paths()[0]) {
        return (at, first);
    }
    for args in elsewhere(e.name()) {
        let cmd = e
            .args(false)
            .into_iter()
            .fold(clap::Command::new("doctor"), |c, a| c.arg(a));
        let Ok(m2) =
            cmd.try_get_matches_from(std::iter::once("doctor").chain(args.iter().copied()))
        else {
            continue;
        };
        match e.ownership(&m2, cx) {
            Ok(Ownership::Absent) => {}
            other => return (where_(e, &m2), other),
        }
    }
    (at, first)
}

pub fn check(h: &Host, r: &mut Report) {
    let install = Install::default();
    let cx = Context {
        files: h.files,
        record: &h.record,
        install: &install,
        force: false,
    };
    let vgpu_cdi = !super::cdi::specs_of_kind(&h.cdi_dirs, vgpu_host::keys::cdi::KIND).is_empty();
    for (e, m) in &h.engines {
        let name = e.name();
        let given = where_(*e, m) != Path::new(e.default_paths()[0]);
        let (at, ownership) = ownership_anywhere(*e, m, &cx);
        match ownership {
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
                            vgpu_host::keys::cdi::KIND
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
