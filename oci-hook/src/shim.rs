//! `vgpu-container-runtime`: an OCI runtime that edits the spec of a container with a quota and then execs
//! the real (lower) runtime with the same arguments.
//!
//! Only `create` (and `run`, which creates) is acted on; every other verb is passed straight through. A
//! container without a quota is passed through with its `config.json` untouched, byte for byte.

use crate::config::Config;
use crate::edit;
use crate::plan::{self, SpecFacts};
use crate::provision::{self, Owner};
use crate::rootfs::Rootfs;
use crate::spec::Spec;
use crate::nvml;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use vgpu_ledger::atomic::{write_atomic, WriteOptions};
use vgpu_ledger::layout::{self, StateRoot};

/// What the shim needs from runc-style command-line arguments.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The subcommand (`create`, `start`, `delete`, …), if any.
    pub verb: Option<String>,
    /// `--log FILE`: where the engine reads the runtime's errors from.
    pub log: Option<PathBuf>,
    /// `--log-format text|json`.
    pub log_format: Option<String>,
    /// `--bundle`/`-b` of create/run.
    pub bundle: Option<PathBuf>,
    /// crun's `--config`/`-f` of create/run (a spec file other than `<bundle>/config.json`).
    pub config_file: Option<PathBuf>,
    /// The container id (first positional argument after the verb).
    pub id: Option<String>,
}

// Global flags of runc and crun that take a value; all others are switches.
const GLOBAL_VALUE_FLAGS: &[&str] = &["root", "log", "log-format", "criu", "rootless", "cgroup-manager", "log-level"];
// Flags of create/run that take a value.
const CREATE_VALUE_FLAGS: &[&str] = &["bundle", "b", "console-socket", "pid-file", "preserve-fds", "config", "f"];

/// Splits `-x`, `--x`, `--x=v` into (name, inline value); `None` for positional arguments.
fn flag(arg: &str) -> Option<(&str, Option<&str>)> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')).filter(|b| !b.is_empty())?;
    Some(match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    })
}

/// Parses runc/crun-style arguments (without argv[0]).
pub fn parse_args(args: &[String]) -> Invocation {
    let mut inv = Invocation::default();
    let mut i = 0;
    // Global flags, up to the verb.
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        match flag(a) {
            Some((name, inline)) => {
                let takes = GLOBAL_VALUE_FLAGS.contains(&name);
                let value = if takes && inline.is_none() {
                    i += 1;
                    args.get(i).map(String::as_str)
                } else {
                    inline
                };
                match name {
                    "log" => inv.log = value.map(PathBuf::from),
                    "log-format" => inv.log_format = value.map(str::to_string),
                    _ => {}
                }
                i += 1;
            }
            None => break,
        }
    }
    let Some(verb) = args.get(i) else { return inv };
    inv.verb = Some(verb.clone());
    i += 1;
    if verb != "create" && verb != "run" {
        return inv;
    }
    let mut only_positional = false;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if !only_positional && a == "--" {
            only_positional = true;
            continue;
        }
        match flag(a).filter(|_| !only_positional) {
            Some((name, inline)) => {
                let value = if CREATE_VALUE_FLAGS.contains(&name) && inline.is_none() {
                    i += 1;
                    args.get(i - 1).cloned()
                } else {
                    inline.map(str::to_string)
                };
                match name {
                    "bundle" | "b" => inv.bundle = value.map(PathBuf::from),
                    "config" | "f" => inv.config_file = value.map(PathBuf::from),
                    _ => {}
                }
            }
            None if inv.id.is_none() => inv.id = Some(a.clone()),
            None => {}
        }
    }
    inv
}

/// Finds the lower runtime: an absolute path, or a name looked up in `PATH`. Refuses to find the shim
/// itself (which would exec itself forever).
pub fn resolve_lower(name: &str) -> Result<PathBuf> {
    let found = if name.contains('/') {
        let p = PathBuf::from(name);
        is_executable(&p).then_some(p)
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| is_executable(p)))
            .unwrap_or(None)
    };
    let Some(p) = found else {
        bail!("lower runtime {name:?} not found or not executable (config key lower_runtime)");
    };
    if let (Ok(me), Ok(it)) = (std::fs::canonicalize("/proc/self/exe"), std::fs::canonicalize(&p)) {
        if me == it {
            bail!("lower runtime {name:?} is vgpu-container-runtime itself (config key lower_runtime)");
        }
    }
    Ok(p)
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

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
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{entry}");
    }
}

/// The shim's whole run; returns only on error (success execs the lower runtime).
pub fn run(args: Vec<OsString>) -> Result<std::convert::Infallible> {
    let strs: Vec<String> = args.iter().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    let inv = parse_args(&strs);
    let result = (|| -> Result<std::convert::Infallible> {
        let cfg = Config::load()?;
        let lower_name = cfg.lower_runtime.clone();
        let provisioned = if matches!(inv.verb.as_deref(), Some("create") | Some("run")) {
            prepare_create(&inv, &cfg)?
        } else {
            None
        };
        let lower = resolve_lower(&lower_name)?;
        let mut cmd = std::process::Command::new(&lower);
        cmd.arg0(&lower_name).args(&args[1..]);
        let Some((root, id)) = provisioned else {
            let err = cmd.exec();
            bail!("cannot exec lower runtime {}: {err}", lower.display());
        };
        // State was provisioned: stay as the lower runtime's parent, so that if it fails to create the
        // container (after our checks passed) the state goes with it instead of waiting for the collector.
        let code = run_child(cmd).with_context(|| format!("lower runtime {}", lower.display()))?;
        // A failed create/run has no container; a `run` whose container exited non-zero already had its
        // poststop, so removing again is a no-op.
        if code != 0 {
            let _ = provision::remove(&root, &id);
        }
        std::process::exit(code);
    })();
    let e = result.unwrap_err();
    report_error(&inv, &format!("{e:#}"));
    Err(e)
}

/// Runs the lower runtime as a child, passing on the signals an engine sends to its runtime, and returns
/// its exit status the way a shell reports it (128 + signal when killed).
fn run_child(mut cmd: std::process::Command) -> Result<i32> {
    use nix::sys::signal::{SigSet, Signal};
    use std::os::unix::process::ExitStatusExt;
    const FORWARDED: [Signal; 7] = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
    ];
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().chain([Signal::SIGCHLD].iter()) {
        set.add(*s);
    }
    // Blocked here and taken with sigwait; the child starts with an empty mask (std resets it).
    set.thread_block()?;
    let mut child = cmd.spawn()?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        match set.wait()? {
            Signal::SIGCHLD => {
                if let Some(st) = child.try_wait()? {
                    return Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
                }
            }
            sig => {
                let _ = nix::sys::signal::kill(pid, sig);
            }
        }
    }
}

/// How the edited `config.json` replaces the engine's: same mode, not synced (a bundle does not outlive a
/// machine crash, and the rename alone keeps readers from ever seeing half a file; an fsync here cost
/// milliseconds per container start).
const SPEC_WRITE: WriteOptions = WriteOptions::with_mode(0o644).keep_mode();

/// The `create` work: plan, provision, edit. Leaves nothing behind on failure. Returns the state root and
/// container id when state was provisioned.
fn prepare_create(inv: &Invocation, cfg: &Config) -> Result<Option<(StateRoot, String)>> {
    let bundle = match &inv.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context("cannot find the working directory (the default bundle)")?,
    };
    let spec_path = match &inv.config_file {
        Some(f) if f.is_absolute() => f.clone(),
        Some(f) => bundle.join(f),
        None => bundle.join("config.json"),
    };
    let text = std::fs::read_to_string(&spec_path).with_context(|| format!("cannot read {}", spec_path.display()))?;
    let mut spec = Spec::parse(&text, &spec_path)?;
    let (env, annotations, devices) = (spec.env(), spec.annotations(), spec.device_paths());
    let facts = SpecFacts { env: &env, annotations: &annotations, devices: &devices };
    let Some(plan) = plan::plan(&facts, || nvml::list_gpus(&cfg.nvml_library))? else {
        return Ok(None);
    };
    let id = inv.id.as_deref().ok_or_else(|| anyhow!("create: no container id on the command line"))?;
    let root = StateRoot::new(cfg.state_root.clone());
    root.container_dir(id)?;
    // Everything that can fail without side effects, first.
    resolve_lower(&cfg.lower_runtime)?;
    edit::check_library(cfg)?;
    let rootfs = spec.rootfs(&bundle)?;
    let image_preload = Rootfs::open(&rootfs)?.read_small_file(Path::new(layout::CONTAINER_PRELOAD_PATH))?;
    // A bundle the shim already edited (a retried create, a bundle run again, maybe under another id):
    // take out the earlier edit first, so there is exactly one set of mounts and hooks, for this id.
    if edit::shim_ran(&annotations) {
        edit::strip_shim_edit(&mut spec);
    }
    edit::shim_edit(&mut spec, &plan, &root, id, cfg)?;
    provision::provision(&root, id, &plan, Owner::default(), image_preload.as_deref())?;
    if let Err(e) = write_atomic(&spec_path, spec.to_text().as_bytes(), SPEC_WRITE) {
        let _ = provision::remove(&root, id);
        return Err(e.into());
    }
    Ok(Some((root, id.to_string())))
}

/// argv[0] as the engine called us, for messages.
pub fn program_name(args: &[OsString]) -> String {
    args.first().map(|a| Path::new(a).file_name().unwrap_or(OsStr::new("vgpu-container-runtime")).to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Invocation {
        parse_args(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn docker_style_create() {
        let inv = p("--root /var/run/docker/runtime-runc/moby --log /run/x/log.json --log-format json --systemd-cgroup create --bundle /b --pid-file /p --console-socket /s abc123");
        assert_eq!(inv.verb.as_deref(), Some("create"));
        assert_eq!(inv.log, Some(PathBuf::from("/run/x/log.json")));
        assert_eq!(inv.log_format.as_deref(), Some("json"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.id.as_deref(), Some("abc123"));
    }

    #[test]
    fn inline_values_short_flags_and_crun_config() {
        let inv = p("--log=/l --debug create -b=/b --no-pivot -f other.json c1");
        assert_eq!(inv.log, Some(PathBuf::from("/l")));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.config_file, Some(PathBuf::from("other.json")));
        assert_eq!(inv.id.as_deref(), Some("c1"));
        let inv = p("run -d --bundle /x c2");
        assert_eq!((inv.verb.as_deref(), inv.id.as_deref()), (Some("run"), Some("c2")));
        assert_eq!(inv.bundle, Some(PathBuf::from("/x")));
    }

    #[test]
    fn other_verbs_and_ids_after_double_dash() {
        let inv = p("--root /r delete -f abc");
        assert_eq!(inv.verb.as_deref(), Some("delete"));
        assert_eq!(inv.id, None);
        let inv = p("create -- -weird");
        assert_eq!(inv.id.as_deref(), Some("-weird"));
        assert_eq!(p("--version").verb, None);
    }

    #[test]
    fn log_lines_in_the_engine_format() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("log.json");
        let inv = Invocation { log: Some(log.clone()), log_format: Some("json".into()), ..Default::default() };
        report_error(&inv, "bad \"quota\"");
        let v: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "vgpu: bad \"quota\"");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn lower_runtime_lookup() {
        assert!(resolve_lower("/bin/sh").is_ok());
        let e = resolve_lower("no-such-runtime-xyz").unwrap_err().to_string();
        assert!(e.contains("no-such-runtime-xyz") && e.contains("lower_runtime"), "{e}");
    }
}
