//! `vgpu-container-runtime`: edits the spec of a container with a quota, then runs the lower runtime. Not
//! here: its command line (`crate::args`), the lower runtime (`crate::lower`), the create steps (`crate::create`).
//!
//! Only `create` (and `run`, which creates) is acted on; every other verb is passed straight through, even
//! when vgpu's config cannot be loaded. A container without a quota is passed through with its
//! `config.json` untouched, byte for byte.

use crate::args::{parse_args, Invocation};
use crate::create::{self, Create};
use crate::edits::{self, ContainerEdits};
use crate::lower;
use crate::provision::{Owner, Provisioned};
use crate::request::SpecFacts;
use crate::spec::Spec;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use vgpu_host::atomic::{write_atomic, WriteOptions};
use vgpu_host::config::Config;
use vgpu_host::keys::host::RUNTIME_BIN;
use vgpu_host::state_root::StateRoot;

/// Writes one error line to stderr and, when the engine gave `--log`, to that file in its format (Docker
/// and containerd read the runtime's last error from there).
pub fn report_error(inv: &Invocation, msg: &str) {
    let line = format!("vgpu: {msg}");
    eprintln!("{line}");
    let Some(log) = &inv.log else { return };
    let time = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
    let entry = if inv.log_format.as_deref() == Some("json") {
        serde_json::json!({"level": "error", "msg": line, "time": time}).to_string()
    } else {
        format!("time={time:?} level=error msg={line:?}")
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "{entry}");
    }
}

/// The shim's whole run; returns only on error (success execs the lower runtime).
pub fn run(args: Vec<OsString>) -> Result<std::convert::Infallible> {
    let strs: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let inv = parse_args(&strs);
    if inv.verb.is_none() && strs.iter().any(|a| a == "--version" || a == "-v") {
        version(&args);
    }
    let result = if matches!(inv.verb.as_deref(), Some("create") | Some("run")) {
        create(&inv, &args)
    } else {
        pass_through(&inv, &args)
    };
    let e = result.unwrap_err();
    report_error(&inv, &format!("{e:#}"));
    Err(e)
}

/// `--version`: the lower runtime's own lines first, unchanged (Docker reads the runtime's name, version
/// and `commit:` from them), then one line of vgpu's, without the word "version" that Docker's parser
/// would take for the runtime's; the lower runtime's exit status.
fn version(args: &[OsString]) -> ! {
    let lower_name = Config::lower_runtime_despite_errors();
    let status = lower::resolve_lower(&lower_name)
        .map_err(anyhow::Error::from)
        .and_then(|lower| {
            std::process::Command::new(&lower)
                .arg0(&lower_name)
                .args(&args[1..])
                .status()
                .with_context(|| format!("cannot run {}", lower.display()))
        });
    let code = match status {
        Ok(st) => st.code().unwrap_or(1),
        Err(e) => {
            eprintln!("vgpu: {e:#}");
            1
        }
    };
    println!(
        "{RUNTIME_BIN} {} over {lower_name}",
        vgpu_host::version::LONG
    );
    std::process::exit(code);
}

/// Every verb but `create` and `run`: straight to the lower runtime, whatever vgpu's config says. A
/// config that cannot be loaded must not keep an engine from listing, killing or deleting containers
/// (those without a quota included): its error goes to stderr once, and the lower runtime is the one
/// the file still names, else `runc`.
fn pass_through(inv: &Invocation, args: &[OsString]) -> Result<std::convert::Infallible> {
    let lower_name = match Config::load() {
        Ok(cfg) => {
            if let (Some("delete"), Some(id)) = (inv.verb.as_deref(), inv.id.as_deref()) {
                delete_ownerless(&cfg, id);
            }
            cfg.lower_runtime
        }
        Err(e) => {
            let name = Config::lower_runtime_despite_errors();
            eprintln!(
                "vgpu: {e:#} (ignored for `{}`: passed through to {name})",
                inv.verb.as_deref().unwrap_or("")
            );
            name
        }
    };
    let lower = lower::resolve_lower(&lower_name)?;
    let err = std::process::Command::new(&lower)
        .arg0(&lower_name)
        .args(&args[1..])
        .exec();
    bail!("cannot exec lower runtime {}: {err}", lower.display());
}

/// `delete`: the state of a create that never finished (no owner recorded: its shim was killed) goes
/// with it; a live container's state is its poststop's. Never fails the delete: one line on error.
fn delete_ownerless(cfg: &Config, id: &str) {
    let root = StateRoot::new(cfg.state_root.clone());
    if let Err(e) = vgpu_host::abandoned::remove_ownerless(&root, id) {
        eprintln!("vgpu: delete {id}: {e:#}");
    }
}

/// `create` and `run`: the quota provisioned and the spec edited, then the lower runtime.
fn create(inv: &Invocation, args: &[OsString]) -> Result<std::convert::Infallible> {
    let cfg = Config::load()?;
    vgpu_host::logging::init(RUNTIME_BIN, &cfg);
    tracing::debug!(id = %inv.id.as_deref().unwrap_or(""), lower = %cfg.lower_runtime, "create");
    let lower_name = cfg.lower_runtime.clone();
    let provisioned = prepare_create(inv, &cfg)?;
    let lower = lower::resolve_lower(&lower_name)?;
    let mut cmd = std::process::Command::new(&lower);
    cmd.arg0(&lower_name).args(&args[1..]);
    let Some(provisioned) = provisioned else {
        let err = cmd.exec();
        bail!("cannot exec lower runtime {}: {err}", lower.display());
    };
    // State was provisioned: stay as the lower runtime's parent, so that if it fails to create the
    // container (after our checks passed) the state goes with it instead of waiting for the collector.
    let code =
        lower::run_child(cmd).with_context(|| format!("lower runtime {}", lower.display()))?;
    // A failed create/run has no container; a `run` whose container exited non-zero already had its
    // poststop. Only the folder this invocation made is removed: by now the id may be another
    // container's (after that poststop).
    if code != 0 {
        let _ = provisioned.remove();
    }
    std::process::exit(code);
}

/// How the edited `config.json` replaces the engine's: same mode, not synced (a bundle does not outlive a
/// machine crash, and the rename alone keeps readers from ever seeing half a file; an fsync here cost
/// milliseconds per container start).
const SPEC_WRITE: WriteOptions = WriteOptions::with_mode(0o644).keep_mode();

/// The `create` work: plan, provision, edit. Leaves nothing behind on failure, and never touches state it
/// did not make (a live container's with the same id). Returns the state it provisioned.
fn prepare_create(inv: &Invocation, cfg: &Config) -> Result<Option<Provisioned>> {
    let bundle = match &inv.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir()
            .context("cannot find the working directory (the default bundle)")?,
    };
    let spec_path = match &inv.config_file {
        Some(f) if f.is_absolute() => f.clone(),
        Some(f) => bundle.join(f),
        None => bundle.join("config.json"),
    };
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("cannot read {}", spec_path.display()))?;
    let mut spec = Spec::parse(&text, &spec_path)?;
    let facts = SpecFacts::of(&spec);
    let Some(plan) = create::plan(&facts, cfg)? else {
        return Ok(None);
    };
    let id = inv
        .id
        .as_deref()
        .ok_or_else(|| anyhow!("create: no container id on the command line"))?;
    let root = StateRoot::new(cfg.state_root.clone());
    let create = Create::new(cfg, &root, id, plan)?;
    // Everything that can fail without side effects, first.
    lower::resolve_lower(&cfg.lower_runtime)?;
    let image = create.read_image(&spec, &bundle)?;
    // A bundle the shim already edited (a retried create, a bundle run again, maybe under another id):
    // take out the earlier edit first, so there is exactly one set of mounts and hooks, for this id.
    if edits::shim_ran(&facts.annotations) {
        ContainerEdits::strip_from_spec(&mut spec);
    }
    create.edits()?.apply_to_spec(&mut spec)?;
    let provisioned = create.provision(Owner::default(), &image)?;
    if let Err(e) = write_atomic(&spec_path, spec.to_text().as_bytes(), SPEC_WRITE) {
        let _ = provisioned.remove();
        return Err(e.into());
    }
    Ok(Some(provisioned))
}

/// argv[0] as the engine called us, for messages.
pub fn program_name(args: &[OsString]) -> String {
    args.first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .unwrap_or(OsStr::new(RUNTIME_BIN))
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_in_the_engine_format() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("log.json");
        let inv = Invocation {
            log: Some(log.clone()),
            log_format: Some("json".into()),
            ..Default::default()
        };
        report_error(&inv, "bad \"quota\"");
        let v: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "vgpu: bad \"quota\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }
}
