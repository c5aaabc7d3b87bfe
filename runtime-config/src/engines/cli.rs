//! `vgpuctl runtime configure|unconfigure`: the command line built from the registry (the options every
//! engine takes, then each engine's own), the one check that an option given belongs to the engine named,
//! then the engine's change list applied atomically (or printed for `--dry-run`) and the restart hint.
use super::api::{Context, DynEngine, Install};
use super::change::{apply, preview, Change};
use super::error::{EngineError, Result};
use super::files::Disk;
use super::lower;
use super::record;
use super::registry::{find, ENGINES};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

const CONFIGURE_ABOUT: &str =
    "Add the vgpu runtime (Docker, containerd, CRI-O) or hooks (Podman) to the engine's config.";
const CONFIGURE_LONG: &str = "Add the vgpu runtime (Docker, containerd, CRI-O) or hooks (Podman) to the engine's config.

Every other setting and comment of the engine's files is kept; files are written atomically; the engine is never \
restarted (the command says what to restart). What unconfigure must restore that the engine's files cannot hold \
(the default runtime --set-as-default replaced, containerd's drop-in and the `imports` entry added for it) goes to \
vgpuctl's record, /var/lib/vgpu/engines.json (VGPUCTL_STATE_DIR moves the folder).";
const UNCONFIGURE_ABOUT: &str =
    "Remove what `configure` added, and only that: an entry named vgpu that vgpuctl did \
not write is left as it is (an error says so).";
const UNCONFIGURE_LONG: &str = "Remove what `configure` added, and only that: an entry named vgpu that vgpuctl did \
not write is left as it is (an error says so).

The default runtime --set-as-default replaced is put back from vgpuctl's record (or, for configs of older vgpuctl \
versions, from their comment in containerd's file or the hidden file beside daemon.json), and the record's entry \
removed. containerd: vgpuctl's drop-in is removed with the `imports` entry vgpuctl added for it; a foreign vgpu \
handler in the main file is then left as it is, without an error.";

/// `vgpuctl runtime <verb>`, with its matches.
pub enum RuntimeCmd {
    Configure(ArgMatches),
    Unconfigure(ArgMatches),
}

/// One verb's command line: `--runtime`, each engine's options once, and the common ones.
fn verb(name: &'static str, configure: bool) -> Command {
    let engines: Vec<String> = ENGINES
        .iter()
        .map(|e| format!("{} ({})", e.name(), e.default_paths().join(", ")))
        .collect();
    let mut cmd = Command::new(name).arg(
        Arg::new("runtime")
            .long("runtime")
            .value_name("RUNTIME")
            .display_order(0)
            .required(true)
            .value_parser(clap::builder::PossibleValuesParser::new(
                ENGINES.iter().map(|e| e.name()),
            ))
            .help(format!(
                "The engine to configure (or unconfigure), and the files or folder it edits by default: {}",
                engines.join(", ")
            )),
    );
    let mut seen = BTreeSet::new();
    for e in ENGINES {
        for a in e.args(configure) {
            if seen.insert(a.get_id().clone()) {
                cmd = cmd.arg(a.display_order(seen.len()));
            }
        }
    }
    cmd = cmd.arg(
        Arg::new("dry_run")
            .long("dry-run")
            .action(ArgAction::SetTrue)
            .help(
                "Change nothing: print each file as it would be written on stdout, and what would be written, \
                 recorded or removed where on stderr",
            ),
    );
    if !configure {
        return cmd.about(UNCONFIGURE_ABOUT).long_about(UNCONFIGURE_LONG);
    }
    cmd = cmd.arg(Arg::new("force").long("force").action(ArgAction::SetTrue).help(
        "Replace an existing entry named vgpu that vgpuctl did not write (by default it is refused and left as \
         it is). Unconfigure never removes such an entry. containerd: a vgpu handler in an imported file is \
         never edited; --force lets vgpu's drop-in override one read before it, never one read after",
    ));
    cmd = cmd.arg(
        Arg::new("no_nvidia_lower_runtime")
            .long("no-nvidia-lower-runtime")
            .action(ArgAction::SetTrue)
            .help(
                "Docker, containerd, CRI-O: leave lower_runtime in vgpu's config as it is. By default, where \
                 NVIDIA's runtime is installed (/usr/bin, /usr/local/bin, /usr/sbin, the GPU Operator's \
                 /usr/local/nvidia/toolkit, the PATH) and lower_runtime is unset, runc or NVIDIA's by name, \
                 configure writes its absolute path there, so that NVIDIA's GPU injection still happens under vgpu",
            ),
    );
    Install::augment_args(cmd)
        .about(CONFIGURE_ABOUT)
        .long_about(CONFIGURE_LONG)
}

impl FromArgMatches for RuntimeCmd {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        match m.subcommand() {
            Some(("configure", s)) => Ok(RuntimeCmd::Configure(s.clone())),
            Some(("unconfigure", s)) => Ok(RuntimeCmd::Unconfigure(s.clone())),
            _ => Err(clap::Error::new(clap::error::ErrorKind::MissingSubcommand)),
        }
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Subcommand for RuntimeCmd {
    fn augment_subcommands(cmd: Command) -> Command {
        cmd.subcommand(verb("configure", true))
            .subcommand(verb("unconfigure", false))
            .subcommand_required(true)
    }
    fn augment_subcommands_for_update(cmd: Command) -> Command {
        Self::augment_subcommands(cmd)
    }
    fn has_subcommand(name: &str) -> bool {
        matches!(name, "configure" | "unconfigure")
    }
}

/// "a", "a and b", "a, b and c".
fn and_list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Refuses an option of another engine, rather than ignoring it silently.
pub(crate) fn refuse_other_engines_options(
    engine: &dyn DynEngine,
    m: &ArgMatches,
    configure: bool,
) -> Result<()> {
    let own: BTreeSet<clap::Id> = engine
        .args(configure)
        .iter()
        .map(|a| a.get_id().clone())
        .collect();
    let mut checked = BTreeSet::new();
    for a in ENGINES.iter().flat_map(|e| e.args(configure)) {
        let id = a.get_id().clone();
        if own.contains(&id) || !checked.insert(id.clone()) {
            continue;
        }
        if m.value_source(id.as_str()) != Some(ValueSource::CommandLine) {
            continue;
        }
        let long = a.get_long().unwrap_or(id.as_str());
        if let Some(why) = engine.refusal(long) {
            return Err(EngineError::Refused(why));
        }
        let owners: Vec<&str> = ENGINES
            .iter()
            .filter(|e| e.args(configure).iter().any(|x| x.get_id() == &id))
            .map(|e| e.name())
            .collect();
        return Err(EngineError::OtherEnginesOption {
            long: long.to_string(),
            owners: and_list(&owners),
        });
    }
    Ok(())
}

impl RuntimeCmd {
    /// Runs the verb: plan, then write (or print) and say what to restart.
    pub fn run(&self, out: &mut dyn Write) -> Result<()> {
        let (m, configure) = match self {
            RuntimeCmd::Configure(m) => (m, true),
            RuntimeCmd::Unconfigure(m) => (m, false),
        };
        let name = m.get_one::<String>("runtime").expect("required");
        let engine = find(name).expect("clap checked the name");
        refuse_other_engines_options(engine, m, configure)?;
        let dry_run = m.get_flag("dry_run");
        let mut install = Install::default();
        if configure {
            install = Install::from_arg_matches(m)?;
            // Hooks must find the same vgpu config as the operator who configured them.
            if !install
                .hook_env
                .iter()
                .any(|e| e.starts_with("VGPU_CONFIG="))
            {
                install
                    .hook_env
                    .extend(vgpu_host::config::Config::env_for_hooks());
            }
        }
        let record = record::default_path();
        let cx = Context {
            files: &Disk,
            record: &record,
            install: &install,
            force: configure && m.get_flag("force"),
        };
        // Held from reading the files to writing them: runs at once keep each other's changes.
        let _lock = (!dry_run).then(|| record::lock(&record)).transpose()?;
        if configure {
            let mut changes = engine.configure(m, &cx)?;
            // NVIDIA's runtime under the shim (`lower`): the engines the shim serves, not Podman's hooks.
            let lower = (engine.name() != "podman" && !m.get_flag("no_nvidia_lower_runtime"))
                .then(|| {
                    lower::change(
                        &Disk,
                        &vgpu_host::config::Config::path().0,
                        &lower::search_dirs(std::env::var("PATH").ok().as_deref()),
                    )
                })
                .flatten();
            let nvidia_found = lower.is_some()
                || Path::new(&vgpu_host::config::Config::lower_runtime_despite_errors())
                    .file_name()
                    .is_some_and(|n| n == lower::NVIDIA_RUNTIME);
            if let Some((change, line)) = lower {
                changes.push(change);
                if !dry_run {
                    eprintln!("{line}");
                }
            }
            finish(&changes, dry_run, engine, "configured", out)?;
            for n in engine.notes(m, &cx) {
                // The advice to run NVIDIA's runtime underneath is taken already.
                if !(nvidia_found && n.contains(lower::NVIDIA_RUNTIME)) {
                    eprintln!("{n}");
                }
            }
            Ok(())
        } else {
            let changes = engine.unconfigure(m, &cx)?;
            finish(&changes, dry_run, engine, "not configured", out)
        }
    }
}

/// Applies the changes and says what to restart, or with `dry_run` prints the new files on stdout and
/// everything else on stderr.
fn finish(
    changes: &[Change],
    dry_run: bool,
    engine: &dyn DynEngine,
    state: &str,
    out: &mut dyn Write,
) -> Result<()> {
    if changes.is_empty() {
        let line = format!(
            "{} is already {state} for vgpu: nothing to change",
            engine.title()
        );
        if dry_run {
            eprintln!("{line}");
        } else {
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    if dry_run {
        return preview(changes, out, &mut std::io::stderr());
    }
    apply(changes, out)?;
    // Only vgpu's own files changed (its config's lower_runtime, the record): the shim and the hook read
    // them at each container's creation, and the engine has nothing new to load.
    if changes.iter().any(|c| c.record.is_none()) {
        writeln!(out, "{}", engine.restart_hint())?;
    } else {
        writeln!(
            out,
            "{}'s own config is unchanged: no restart needed (vgpu reads its config at each container's creation)",
            engine.title()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RuntimeCmd, clap::Error> {
        let cmd = <RuntimeCmd as clap::Subcommand>::augment_subcommands(Command::new("runtime"));
        RuntimeCmd::from_arg_matches(&cmd.try_get_matches_from(args)?)
    }

    fn refused(args: &[&str]) -> String {
        let (RuntimeCmd::Configure(m) | RuntimeCmd::Unconfigure(m)) = parse(args).unwrap();
        let configure = args[1] == "configure";
        let e = find(m.get_one::<String>("runtime").unwrap()).unwrap();
        format!(
            "{:#}",
            refuse_other_engines_options(e, &m, configure).unwrap_err()
        )
    }

    /// Each engine's options are its own: given to another engine, one line naming whose they are.
    #[test]
    fn options_of_another_engine_are_refused() {
        assert_eq!(
            refused(&["runtime", "configure", "--runtime=docker", "--drop-in"]),
            "--drop-in is for containerd only"
        );
        assert_eq!(
            refused(&[
                "runtime",
                "unconfigure",
                "--runtime=crio",
                "--hooks-dir",
                "/x"
            ]),
            "--hooks-dir is for podman only"
        );
        assert_eq!(
            refused(&[
                "runtime",
                "configure",
                "--runtime=containerd",
                "--drop-in-dir",
                "/x"
            ]),
            "--drop-in-dir is for crio only"
        );
        assert!(refused(&[
            "runtime",
            "configure",
            "--runtime=podman",
            "--set-as-default"
        ])
        .starts_with("--set-as-default has no meaning for podman"));
        assert!(
            refused(&["runtime", "configure", "--runtime=podman", "--config", "/x"])
                .starts_with("--config has no meaning for podman")
        );
        // Options every engine takes (an installer passes both paths whatever the engine).
        let RuntimeCmd::Configure(m) = parse(&[
            "runtime",
            "configure",
            "--runtime=podman",
            "--runtime-path",
            "/x/vgpu-container-runtime",
            "--hook-path",
            "/x/vgpu-hook",
            "--force",
            "--dry-run",
        ])
        .unwrap() else {
            panic!()
        };
        assert!(refuse_other_engines_options(find("podman").unwrap(), &m, true).is_ok());
        // Configure's options are not unconfigure's.
        assert!(parse(&[
            "runtime",
            "unconfigure",
            "--runtime=docker",
            "--set-as-default"
        ])
        .is_err());
    }

    #[test]
    fn lists_read_as_english() {
        assert_eq!(and_list(&["a"]), "a");
        assert_eq!(and_list(&["a", "b", "c"]), "a, b and c");
    }
}
