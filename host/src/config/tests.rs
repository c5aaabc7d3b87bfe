//! Tests of the config file's loading: defaults, errors one line naming the file and the key, typed values.

use super::*;
use std::time::Duration;

fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("c.toml");
    std::fs::write(&p, text).unwrap();
    (d, p)
}

fn error(text: &str) -> (ConfigError, String) {
    let (_d, p) = write(text);
    let e = Config::load_from(&p, true).unwrap_err();
    let s = e.to_string();
    assert!(!s.contains('\n'), "one line: {s}");
    assert!(
        s.starts_with(&format!("vgpu config {}", p.display())),
        "{s}"
    );
    (e, s)
}

#[test]
fn missing_default_file_gives_defaults() {
    let c = Config::load_from(Path::new("/nonexistent/vgpu.toml"), false).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.state_root, PathBuf::from("/run/vgpu"));
    assert_eq!(c.lower_runtime, "runc");
    assert_eq!(c.hook_stage, HookStage::CreateRuntime);
    assert_eq!(c.unquoted(), Unquoted::Allow);
}

#[test]
fn missing_named_file_is_an_error() {
    let e = Config::load_from(Path::new("/nonexistent/vgpu.toml"), true).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/vgpu.toml"));
}

/// A typo is an error naming the key, where it is and the keys there are; the shim then refuses to
/// create containers instead of running them without NVIDIA's runtime underneath.
#[test]
fn an_unknown_key_is_an_error_with_its_line() {
    let (e, s) = error(
        "state_root = \"/tmp/x\"\n# NVIDIA's runtime underneath\nlower_runtim = \"nvidia-container-runtime\"\n",
    );
    assert!(
        matches!(&e, ConfigError::Syntax { at, .. } if at == ":3:1"),
        "{e:?}"
    );
    assert!(
        s.ends_with(&s[s.find(":3:1: unknown field `lower_runtim`").unwrap()..]),
        "{s}"
    );
    assert!(
        s.contains("`lower_runtime`"),
        "the known keys are listed: {s}"
    );
    // A syntax error carries its line too.
    let (e, _) = error("state_root = \"/tmp/x\"\nlog_level = \n");
    assert!(
        matches!(&e, ConfigError::Syntax { at, .. } if at.starts_with(":2:")),
        "{e:?}"
    );
}

#[test]
fn keys_are_read_and_typed_once() {
    let (_d, p) = write(
        "# comment\nstate_root = \"/tmp/x\"\nlower_runtime = \"crun\"\nhook_stage = \"prestart\"\n\
         log_level = \"info\"\nadmission_reserve = \"512Mi\"\ndefault_memory_limit = \"2Gi\"\n\
         [monitor]\nlisten = \"0.0.0.0:9394\"\ninterval_seconds = 3\ntolerance = \"1Mi\"\n",
    );
    let c = Config::load_from(&p, true).unwrap();
    assert_eq!(c.state_root, PathBuf::from("/tmp/x"));
    assert_eq!(c.lower_runtime, "crun");
    assert_eq!(c.hook_stage, HookStage::Prestart);
    assert_eq!(c.library, PathBuf::from("/usr/lib/vgpu/libvgpu.so"));
    assert_eq!(c.log_level, LogLevel::Info);
    assert_eq!(
        (c.log_rotation, c.log_max_files),
        (LogRotation::Never, None)
    );
    assert_eq!(
        (c.admission_reserve, c.admission_reserve_bytes()),
        (512 << 20, 512 << 20)
    );
    assert_eq!(c.default_memory_limit, Some(2 << 30));
    assert_eq!(c.unquoted(), Unquoted::Default(2 << 30));
    let m = c.monitor().unwrap();
    assert_eq!(m.listen.as_deref(), Some("0.0.0.0:9394"));
    assert_eq!(
        (m.interval, m.tolerance),
        (Some(Duration::from_secs(3)), Some(1 << 20))
    );
    assert_eq!(m.kill, None);
}

#[test]
fn the_node_policy_for_containers_without_a_quota() {
    let (_d, p) = write("require_memory_limit = true\n");
    assert_eq!(
        Config::load_from(&p, true).unwrap().unquoted(),
        Unquoted::Refuse
    );
    // A default wins over refusing.
    let (_d, p) = write("require_memory_limit = true\ndefault_memory_limit = \"1Gi\"\n");
    assert_eq!(
        Config::load_from(&p, true).unwrap().unquoted(),
        Unquoted::Default(1 << 30)
    );
    let (_d, p) = write("default_memory_limit = \" \"\nadmission_reserve = \"0\"\n");
    let c = Config::load_from(&p, true).unwrap();
    assert_eq!((c.unquoted(), c.admission_reserve), (Unquoted::Allow, 0));
}

#[test]
fn the_lower_runtime_is_found_in_a_broken_file_or_is_runc() {
    let (d, p) = write("lower_runtime = \"crun\"\nlog_level = \"loud\"\n");
    assert!(Config::load_from(&p, true).is_err());
    assert_eq!(Config::lower_runtime_of(&p), "crun");
    for broken in [
        "state_root = [",
        "lower_runtime = 5\n",
        "lower_runtime = \"\"\n",
    ] {
        std::fs::write(&p, broken).unwrap();
        assert_eq!(Config::lower_runtime_of(&p), "runc", "{broken}");
    }
    assert_eq!(Config::lower_runtime_of(&d.path().join("missing")), "runc");
}

/// The messages the e2e suites and operators match (tests/e2e/governance.test.sh among them).
#[test]
fn bad_values_name_the_file_and_key() {
    for (text, says) in [
        (
            "state_root = \"relative\"\n",
            "state_root must be an absolute path, got \"relative\"",
        ),
        ("library = \"l.so\"\n", "library must be an absolute path"),
        ("hook_path = \"h\"\n", "hook_path must be an absolute path"),
        (
            "log_file = \"vgpu.log\"\n",
            "log_file must be an absolute path",
        ),
        ("lower_runtime = \"\"\n", "lower_runtime is empty"),
        ("log_max_files = 0\n", "log_max_files must be at least 1"),
        (
            "admission_reserve = \"lots\"\n",
            "admission_reserve \"lots\": ",
        ),
        (
            "default_memory_limit = \"0\"\n",
            "default_memory_limit=\"0\": a memory limit must be greater than zero",
        ),
        (
            "default_memory_limit = \"1\"\n",
            "default_memory_limit=\"1\": ",
        ),
        (
            "log_level = \"loud\"\n",
            "log_level must be error, warn, info or debug, got \"loud\"",
        ),
    ] {
        let (e, s) = error(text);
        assert!(matches!(e, ConfigError::Invalid { .. }), "{text}: {e:?}");
        assert!(s.contains(says), "{text}: {s}");
    }
    let (e, _) = error("log_rotation = \"weekly\"\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
    let (e, _) = error("state_root = 5\n");
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e:?}");
}

/// A bad `[monitor]` table stops the monitor (one line naming the key), never the rest of the file's
/// readers: the shim and the hook do not use it.
#[test]
fn a_bad_monitor_table_is_kept_apart() {
    for bad in [
        "[monitor]\nkil = true\n",
        "[monitor]\ntolerance = \"5GB\"\n",
        "[monitor]\ninterval_seconds = 0\n",
    ] {
        let (_d, p) = write(&format!("lower_runtime = \"crun\"\n{bad}"));
        let c = Config::load_from(&p, true).unwrap();
        assert_eq!(c.lower_runtime, "crun");
        let e = c.monitor().unwrap_err();
        assert!(matches!(e, ConfigError::Monitor { .. }), "{e:?}");
        let s = e.to_string();
        assert!(
            s.contains("[monitor]") && s.contains("c.toml") && !s.contains('\n'),
            "{s}"
        );
    }
}

/// The packaged config file (`packaging/config.toml`) shows every key of the file, each commented out with
/// its default, or with an example and a comment saying `default: …`. Uncommented, it
/// must parse, and give the defaults once the examples are left out.
#[test]
fn the_packaged_config_shows_every_key_with_its_default() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/config.toml"
    ))
    .unwrap();
    fn key_line(l: &str) -> Option<&str> {
        let l = l.strip_prefix("# ")?;
        let (key, _) = l.split_once(" = ")?;
        (!key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then_some(l)
    }
    fn table_line(l: &str) -> Option<&str> {
        l.strip_prefix("# ")
            .filter(|l| l.starts_with('[') && l.ends_with(']'))
    }
    let mut all = String::new();
    let mut defaults = String::new();
    let mut shown = Vec::new();
    for l in text.lines() {
        if let Some(t) = table_line(l) {
            all += &format!("{t}\n");
            defaults += &format!("{t}\n");
        } else if let Some(kv) = key_line(l) {
            all += &format!("{kv}\n");
            shown.push(format!(
                "{}{}",
                if all.contains("[monitor.turns]") {
                    "monitor.turns."
                } else if all.contains("[monitor]") {
                    "monitor."
                } else {
                    ""
                },
                kv.split(" = ").next().unwrap()
            ));
            if !kv
                .split_once('#')
                .is_some_and(|(_, note)| note.contains("default:"))
            {
                defaults += &format!("{kv}\n");
            }
        }
    }
    let (_d, p) = write(&all);
    let every = Config::load_from(&p, true).unwrap();
    every
        .monitor
        .as_ref()
        .expect("the [monitor] example is valid");

    // With only the lines that claim to show the default, the file is the defaults.
    let (_d, p) = write(&defaults);
    let c = Config::load_from(&p, true).unwrap();
    let m = c.monitor.clone().unwrap();
    assert_eq!(
        Config {
            monitor: Ok(MonitorConfig::default()),
            ..c
        },
        Config::default()
    );
    assert_eq!(
        m.listen.as_deref().unwrap_or(DEFAULT_LISTEN),
        DEFAULT_LISTEN
    );
    assert_eq!(m.interval.unwrap_or(DEFAULT_INTERVAL), DEFAULT_INTERVAL);
    assert_eq!(m.tolerance.unwrap_or(DEFAULT_TOLERANCE), DEFAULT_TOLERANCE);
    assert_eq!(
        m.kill,
        Some(false),
        "the kill policy is shown off, its default"
    );
    assert_eq!(
        (m.unattributed_threshold, m.unattributed_scans),
        (
            Some(DEFAULT_UNATTRIBUTED_THRESHOLD),
            Some(DEFAULT_UNATTRIBUTED_SCANS)
        ),
        "the unattributed memory's keys are shown at their defaults"
    );
    use super::turns::{DEFAULT_GRACE, DEFAULT_IDLE, DEFAULT_QUANTUM, DEFAULT_TICK};
    let t = &m.turns;
    assert_eq!(
        (t.enabled, t.quantum, t.idle, t.grace, t.tick, t.force),
        (
            Some(true),
            Some(DEFAULT_QUANTUM),
            Some(DEFAULT_IDLE),
            Some(DEFAULT_GRACE),
            Some(DEFAULT_TICK),
            Some(false)
        ),
        "the arbiter's keys are shown at their defaults"
    );

    // Every key the file may hold is shown: serde's error for an unknown key lists the known ones.
    let (_d, p) = write("no_such_key_xyz = 1\n");
    let top = Config::load_from(&p, true).unwrap_err().to_string();
    let (_d, p) = write("[monitor]\nno_such_key_xyz = 1\n");
    let mon = match Config::load_from(&p, true) {
        Ok(c) => c.monitor.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let known = |msg: &str, prefix: &str| -> Vec<String> {
        let list = msg
            .split("expected one of")
            .nth(1)
            .unwrap_or_else(|| panic!("a list of keys: {msg}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(|k| format!("{prefix}{k}"))
            .collect()
    };
    let (_d, p) = write("[monitor.turns]\nno_such_key_xyz = 1\n");
    let turns = match Config::load_from(&p, true) {
        Ok(c) => c.monitor.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    for k in known(&top, "")
        .into_iter()
        .chain(known(&mon, "monitor."))
        .chain(known(&turns, "monitor.turns."))
    {
        if k == "monitor" || k == "monitor.turns" {
            continue;
        }
        assert!(
            shown.contains(&k),
            "packaging/config.toml does not show `{k}`"
        );
    }
}
