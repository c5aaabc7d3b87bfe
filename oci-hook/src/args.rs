//! runc-style command lines, as the shim gets them: global flags, the verb, and for `create`/`run` the bundle,
//! crun's spec file and the container id. Not here: acting on them (`crate::shim`).

use std::path::PathBuf;

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

/// Global flags of runc and crun that take a value; all others are switches.
pub const GLOBAL_VALUE_FLAGS: &[&str] = &[
    "root",
    "log",
    "log-format",
    "criu",
    "rootless",
    "cgroup-manager",
    "log-level",
];
/// Flags of create/run that take a value.
pub const CREATE_VALUE_FLAGS: &[&str] = &[
    "bundle",
    "b",
    "console-socket",
    "pid-file",
    "preserve-fds",
    "config",
    "f",
];

/// Splits `-x`, `--x`, `--x=v` into (name, inline value); `None` for positional arguments.
fn flag(arg: &str) -> Option<(&str, Option<&str>)> {
    let body = arg
        .strip_prefix("--")
        .or_else(|| arg.strip_prefix('-'))
        .filter(|b| !b.is_empty())?;
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
    if verb == "delete" {
        inv.id = delete_id(&args[i..]);
        return inv;
    }
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

/// The id of `delete [-f|--force] ID` (runc's and crun's); `None` for crun's `--regex` form, which names
/// no single container.
fn delete_id(args: &[String]) -> Option<String> {
    let mut only_positional = false;
    let mut id = None;
    for a in args {
        if !only_positional && a == "--" {
            only_positional = true;
            continue;
        }
        match flag(a).filter(|_| !only_positional) {
            Some(("f" | "force", _)) => {}
            Some(_) => return None,
            None if id.is_none() => id = Some(a.clone()),
            None => {}
        }
    }
    id
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
        assert_eq!(
            (inv.verb.as_deref(), inv.id.as_deref()),
            (Some("run"), Some("c2"))
        );
        assert_eq!(inv.bundle, Some(PathBuf::from("/x")));
    }

    #[test]
    fn other_verbs_and_ids_after_double_dash() {
        let inv = p("--root /r kill abc KILL");
        assert_eq!(inv.verb.as_deref(), Some("kill"));
        assert_eq!(inv.id, None);
        // delete's id (its state without an owner goes with it: `crate::shim`); -f is --force there
        for (args, id) in [
            ("--root /r delete -f abc", Some("abc")),
            ("delete --force abc", Some("abc")),
            ("delete abc", Some("abc")),
            ("delete -- -weird", Some("-weird")),
            ("delete --regex ab.*", None),
            ("delete -r ab.*", None),
        ] {
            let inv = p(args);
            assert_eq!(inv.verb.as_deref(), Some("delete"));
            assert_eq!(inv.id.as_deref(), id, "{args}");
        }
        let inv = p("create -- -weird");
        assert_eq!(inv.id.as_deref(), Some("-weird"));
        assert_eq!(p("--version").verb, None);
    }
}
