//! The command lines of `vgpu-hook` and `vgpu-container-runtime` as clap `Command`s, for their man pages
//! (vgpuctl generates them with its own: `vgpuctl generate-docs`). The hook parses its arguments with
//! [`HookCli`]. The shim takes runc's command line as it is and has no parser of its own ([`crate::args`]
//! reads it); [`shim_command`] only describes it, from the same lists of flags `args` uses, so the page says
//! what the shim does.

use crate::args::{CREATE_VALUE_FLAGS, GLOBAL_VALUE_FLAGS};
use clap::{Arg, ArgAction, Command, CommandFactory, Parser};
use vgpu_host::config::{CONFIG_ENV, DEFAULT_CONFIG_PATH};
use vgpu_host::keys::host::{HOOK_BIN, RUNTIME_BIN};

/// vgpu OCI hook: provisions and removes a container's GPU memory quota state.
#[derive(Parser)]
#[command(name = HOOK_BIN, version = vgpu_host::version::LONG, long_about = HOOK_LONG_ABOUT,
          after_long_help = hook_after_help())]
pub struct HookCli {
    /// The OCI hook stage: createRuntime, prestart, precreate or poststop.
    pub stage: String,
}

const HOOK_LONG_ABOUT: &str = "vgpu OCI hook: provisions and removes a container's GPU memory quota state. \
An engine runs it with the OCI state (or, for precreate, the spec) on stdin: through the hooks.d files that \
`vgpuctl runtime configure --runtime=podman` writes (Podman, CRI-O), or as the hooks vgpu-container-runtime \
adds to the spec of a container with a quota.\n\n\
createRuntime, prestart: validate the container's quota, provision its state under the vgpu config's \
state_root and bind-mount the limits file, its ledgers, the interposer and /etc/ld.so.preload into the \
container (where the shim already did, only record the container's owner).\n\n\
precreate: validate the quota and print the spec with the interposer's environment added (stdout).\n\n\
poststop: remove the container's state.\n\n\
Every stage also collects the state of containers that are gone. A refusal is one line on stderr, \
`vgpu: REASON`, and exit status 1, which fails the container's start.";

fn hook_after_help() -> String {
    format!(
        "Environment: {CONFIG_ENV} names the vgpu config (default {DEFAULT_CONFIG_PATH}). The hook never \
         reads the container's environment.\n\nSee also: vgpuctl(1), vgpu-container-runtime(1); docs/oci.md."
    )
}

/// vgpu-hook's command, as clap builds it (its man page).
pub fn hook_command() -> Command {
    HookCli::command()
}

/// vgpu-container-runtime's command line, described (the shim does not parse it with clap).
pub fn shim_command() -> Command {
    let flags = |list: &[&str]| {
        list.iter()
            .map(|f| {
                if f.len() == 1 {
                    format!("-{f}")
                } else {
                    format!("--{f}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    Command::new(RUNTIME_BIN)
        .version(vgpu_host::version::LONG)
        .about("OCI runtime shim: gives a container its GPU memory quota, then runs the lower runtime")
        .long_about(format!(
            "OCI runtime shim for Docker (--runtime=vgpu), containerd and CRI-O (the vgpu runtime handler \
             `vgpuctl runtime configure` adds). It takes runc's command line and hands it, unchanged, to the \
             lower runtime (lower_runtime in the vgpu config, default runc).\n\n\
             For create and run, first: when the container's spec asks for a quota (vgpu.io/ annotations, or \
             CUDA_DEVICE_MEMORY_LIMIT and friends in its environment), vgpu validates it, provisions the \
             container's state and adds to the spec the mounts, environment and hooks that give the container \
             its quota; a container without a quota is passed through with its spec untouched. A refusal is \
             one line, `vgpu: REASON`, on stderr and in the engine's --log file, and exit status 1.\n\n\
             Every other command (start, state, kill, delete, ...) goes straight to the lower runtime, even \
             when the vgpu config cannot be loaded.\n\n\
             Global options taking a value, skipped up to the command: {}. Options of create and run taking \
             a value: {}; of these vgpu reads --bundle (-b, default: the working directory) and crun's \
             --config (-f), and the first argument that is no option is the container id.",
            flags(GLOBAL_VALUE_FLAGS),
            flags(CREATE_VALUE_FLAGS)
        ))
        .after_long_help(format!(
            "Environment: {CONFIG_ENV} names the vgpu config (default {DEFAULT_CONFIG_PATH}).\n\n\
             See also: vgpuctl(1), vgpu-hook(1), runc(8); docs/oci.md."
        ))
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("version")
                .long("version")
                .short('v')
                .action(ArgAction::SetTrue)
                .help(
                    "Print the lower runtime's version lines unchanged, then `vgpu-container-runtime \
                     VERSION (commit ...) over LOWER`; exit with the lower runtime's status",
                ),
        )
        .arg(
            Arg::new("log")
                .long("log")
                .value_name("FILE")
                .help("The engine's log file: vgpu's error line is appended there too"),
        )
        .arg(
            Arg::new("log-format")
                .long("log-format")
                .value_name("text|json")
                .help("The format of the --log file's lines"),
        )
        .arg(
            Arg::new("command")
                .value_name("COMMAND")
                .help("runc's command: create and run are acted on, every other is passed through"),
        )
        .arg(
            Arg::new("args")
                .value_name("ARGS")
                .num_args(0..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .help("The rest of runc's command line, passed on unchanged"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::STAGES;

    #[test]
    fn the_commands_are_well_formed() {
        hook_command().debug_assert();
        shim_command().debug_assert();
    }

    /// The shim's page names every flag its parser treats as taking a value, and the hook's every stage.
    #[test]
    fn the_descriptions_follow_the_code() {
        let shim = shim_command().get_long_about().unwrap().to_string();
        for f in GLOBAL_VALUE_FLAGS.iter().chain(CREATE_VALUE_FLAGS) {
            let flag = if f.len() == 1 {
                format!("-{f}")
            } else {
                format!("--{f}")
            };
            assert!(shim.contains(&flag), "{flag} missing from {shim}");
        }
        let hook = hook_command().get_long_about().unwrap().to_string();
        for s in STAGES {
            assert!(hook.contains(s), "{s} missing from {hook}");
        }
        let arg = hook_command()
            .get_positionals()
            .next()
            .unwrap()
            .get_help()
            .unwrap()
            .to_string();
        for s in STAGES {
            assert!(arg.contains(s), "{s} missing from {arg}");
        }
    }

    /// The man page's NAME line and `-h` say what the hook is (clap's bare `about` would put the crate's
    /// description, "vgpu OCI hook and runtime shim", there).
    #[test]
    fn the_hook_says_what_it_is() {
        assert_eq!(
            hook_command().get_about().unwrap().to_string(),
            "vgpu OCI hook: provisions and removes a container's GPU memory quota state"
        );
    }

    #[test]
    fn the_hook_parses_its_stage() {
        let cli = HookCli::try_parse_from(["vgpu-hook", "poststop"]).unwrap();
        assert_eq!(cli.stage, "poststop");
        assert!(HookCli::try_parse_from(["vgpu-hook"]).is_err());
    }
}
