//! The vgpuctl binary as an operator uses it: files on disk, exit codes, one-line errors.
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

/// vgpuctl with its record (VGPUCTL_STATE_DIR) in a folder of its own that goes afterwards.
fn vgpuctl(args: &[&str]) -> Output {
    let state = tempfile::tempdir().unwrap();
    vgpuctl_in(&state.path().join("lib"), args)
}

/// vgpuctl with its record under `state`.
fn vgpuctl_in(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(args)
        .env_remove("VGPU_CONFIG")
        .env("VGPUCTL_STATE_DIR", state)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn dry_run_prints_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("daemon.json");
    fs::write(&cfg, "{\n  \"debug\": true\n}\n").unwrap();
    let out = vgpuctl(&[
        "runtime",
        "configure",
        "--runtime=docker",
        "--config",
        cfg.to_str().unwrap(),
        "--dry-run",
    ]);
    assert!(out.status.success());
    // stdout is the new file and nothing else (it parses as the engine would read it); the notes go to
    // stderr.
    let new: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        new["runtimes"]["vgpu"]["path"],
        "/usr/bin/vgpu-container-runtime"
    );
    assert_eq!(
        text(&out.stderr),
        format!("would write {}:\n", cfg.display())
    );
    assert_eq!(
        fs::read_to_string(&cfg).unwrap(),
        "{\n  \"debug\": true\n}\n"
    );
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temp or undo file left"
    );
}

#[test]
fn unparsable_config_is_one_line_naming_file_and_line_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    for (engine, name, body, line) in [
        (
            "docker",
            "daemon.json",
            "{\n  \"a\": 1,\n  \"b\": ,\n}\n",
            3,
        ),
        ("containerd", "config.toml", "version = 2\n\n[plugins\n", 3),
        (
            "crio",
            "crio.conf",
            "[crio.runtime]\ndefault_runtime = \n",
            2,
        ),
    ] {
        let cfg = dir.path().join(name);
        fs::write(&cfg, body).unwrap();
        let out = vgpuctl(&[
            "runtime",
            "configure",
            &format!("--runtime={engine}"),
            "--config",
            cfg.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{engine}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{engine}: {err}");
        assert!(
            err.starts_with(&format!("vgpuctl: error: {}:{line}:", cfg.display())),
            "{engine}: {err}"
        );
        assert_eq!(
            fs::read_to_string(&cfg).unwrap(),
            body,
            "{engine}: file untouched"
        );
        assert!(out.stdout.is_empty());
    }
    assert!(
        !dir.path().join("crio.conf.d").exists(),
        "no drop-in from a bad crio.conf"
    );
}

#[test]
fn dry_run_set_as_default_keeps_its_record_off_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("daemon.json");
    fs::write(&cfg, "{\"default-runtime\": \"crun\"}\n").unwrap();
    let c = cfg.to_str().unwrap();
    let out = vgpuctl(&[
        "runtime",
        "configure",
        "--runtime=docker",
        "--config",
        c,
        "--set-as-default",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let new: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(new["default-runtime"], "vgpu");
    assert!(
        text(&out.stderr).contains("would record in ") && text(&out.stderr).contains("crun"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// An entry named vgpu that is someone else's: configure refuses with one line and changes nothing,
/// unconfigure leaves it, --force replaces it.
#[test]
fn foreign_vgpu_entries_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("daemon.json");
    let theirs = "{\"runtimes\": {\"vgpu\": {\"path\": \"/usr/local/bin/their-runtime\"}}}\n";
    fs::write(&cfg, theirs).unwrap();
    let c = cfg.to_str().unwrap();
    for verb in ["configure", "unconfigure"] {
        let out = vgpuctl(&["runtime", verb, "--runtime=docker", "--config", c]);
        assert_eq!(out.status.code(), Some(1), "{verb}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{verb}: {err}");
        assert!(
            err.contains(
                "runtimes.vgpu exists and is not vgpu's (its path is /usr/local/bin/their-runtime)"
            ),
            "{verb}: {err}"
        );
        assert_eq!(fs::read_to_string(&cfg).unwrap(), theirs, "{verb}");
    }
    let out = vgpuctl(&[
        "runtime",
        "configure",
        "--runtime=docker",
        "--config",
        c,
        "--force",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(fs::read_to_string(&cfg)
        .unwrap()
        .contains("/usr/bin/vgpu-container-runtime"));
}

/// Options that cannot work are refused with one line naming why, and nothing is written: Podman's
/// --set-as-default (its hooks apply under any runtime), a shim path vgpuctl could not recognise again.
#[test]
fn options_that_cannot_work_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let hd = dir.path().join("hooks.d");
    let cfg = dir.path().join("daemon.json");
    for (args, why) in [
        (
            vec![
                "--runtime=podman",
                "--hooks-dir",
                hd.to_str().unwrap(),
                "--set-as-default",
            ],
            "--set-as-default has no meaning for podman",
        ),
        (
            vec![
                "--runtime=docker",
                "--config",
                cfg.to_str().unwrap(),
                "--runtime-path",
                "/opt/bin/my-shim",
            ],
            "must name a file called vgpu-container-runtime",
        ),
    ] {
        let out = vgpuctl(&[&["runtime", "configure"][..], &args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(why) && err.lines().count() == 1, "{err}");
    }
    assert!(!hd.exists() && !cfg.exists());
}

#[test]
fn version_names_the_commit() {
    let out = vgpuctl(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout),
        format!("vgpuctl {}\n", vgpu_host::version::LONG)
    );
    assert!(text(&out.stdout).contains("(commit "));
}

#[test]
fn unknown_runtime_lists_the_known_ones() {
    let out = vgpuctl(&["runtime", "configure", "--runtime=lxc"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("docker, containerd, crio, podman"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn crio_configure_and_unconfigure_leave_crio_conf_alone() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("crio.conf");
    let body = "# mine\n[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_root = \"/run/crun\"\n";
    fs::write(&main, body).unwrap();
    let m = main.to_str().unwrap();
    let out = vgpuctl(&["runtime", "configure", "--runtime=crio", "--config", m]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("systemctl restart crio"));
    let drop_in = dir.path().join("crio.conf.d/99-vgpu.toml");
    assert!(fs::read_to_string(&drop_in)
        .unwrap()
        .contains("runtime_root = \"/run/crun\""));
    let again = vgpuctl(&["runtime", "configure", "--runtime=crio", "--config", m]);
    assert!(text(&again.stdout).contains("nothing to change"));
    assert!(
        vgpuctl(&["runtime", "unconfigure", "--runtime=crio", "--config", m])
            .status
            .success()
    );
    assert!(!drop_in.exists());
    assert_eq!(fs::read_to_string(&main).unwrap(), body);
    // A file of that name that vgpuctl did not write is not removed.
    fs::write(&drop_in, "[crio]\n").unwrap();
    let out = vgpuctl(&["runtime", "unconfigure", "--runtime=crio", "--config", m]);
    assert!(!out.status.success() && drop_in.exists());
}

#[test]
fn status_on_an_empty_root_is_clear_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("state");
    let out = vgpuctl(&["status", "--state-root", root.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("no containers with a GPU memory quota"));
    let out = vgpuctl(&["status", "--json", "--state-root", root.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["containers"], serde_json::json!([]));
    assert!(!Path::new(&root).exists());
}

/// --set-as-default remembers the replaced default in vgpuctl's record (not beside daemon.json);
/// unconfigure puts it back and the record goes, its folder with it.
#[test]
fn the_replaced_default_is_kept_in_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("var-lib-vgpu");
    let cfg = dir.path().join("daemon.json");
    let body = "{\n  \"default-runtime\": \"crun\"\n}\n";
    fs::write(&cfg, body).unwrap();
    let c = cfg.to_str().unwrap();
    let conf = [
        "runtime",
        "configure",
        "--runtime=docker",
        "--config",
        c,
        "--set-as-default",
    ];
    let out = vgpuctl_in(&state, &conf);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(state.join("engines.json")).unwrap()).unwrap();
    assert_eq!(record["engines"][0]["engine"], "docker");
    assert_eq!(record["engines"][0]["config"], c);
    assert_eq!(record["engines"][0]["previous_default"]["name"], "crun");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        2,
        "nothing beside daemon.json"
    );
    // Again: the record still says crun (not vgpu).
    assert!(vgpuctl_in(&state, &conf).status.success());
    assert!(fs::read_to_string(state.join("engines.json"))
        .unwrap()
        .contains("crun"));
    let out = vgpuctl_in(
        &state,
        &["runtime", "unconfigure", "--runtime=docker", "--config", c],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::read_to_string(&cfg).unwrap(), body);
    assert!(
        !state.exists(),
        "the record and its folder went with the last entry"
    );
}

/// Several vgpuctl runs at once (an installer per engine, a config-management run beside the DaemonSet)
/// share one record: each reads, changes and rewrites engines.json, so without a lock one run's entry can
/// be lost, and its replaced default with it. Then they unconfigure at once: every default comes back and
/// the record's folder goes.
#[test]
fn concurrent_runs_keep_every_record_entry() {
    const N: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("var-lib-vgpu");
    let cfgs: Vec<_> = (0..N)
        .map(|i| {
            let cfg = dir.path().join(format!("daemon-{i}.json"));
            fs::write(&cfg, format!("{{\n  \"default-runtime\": \"rt{i}\"\n}}\n")).unwrap();
            cfg
        })
        .collect();
    let run_all = |verb: &str, extra: &[&str]| {
        let children: Vec<_> = cfgs
            .iter()
            .map(|cfg| {
                Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
                    .args(["runtime", verb, "--runtime=docker", "--config"])
                    .arg(cfg)
                    .args(extra)
                    .env_remove("VGPU_CONFIG")
                    .env("VGPUCTL_STATE_DIR", &state)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
    };
    for round in 0..3 {
        run_all("configure", &["--set-as-default"]);
        let record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(state.join("engines.json")).unwrap()).unwrap();
        let mut names: Vec<String> = record["engines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["previous_default"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort_by_key(|n| n[2..].parse::<usize>().unwrap());
        let want: Vec<String> = (0..N).map(|i| format!("rt{i}")).collect();
        assert_eq!(
            names, want,
            "round {round}: every run's replaced default is recorded"
        );
        run_all("unconfigure", &[]);
        for (i, cfg) in cfgs.iter().enumerate() {
            assert_eq!(
                fs::read_to_string(cfg).unwrap(),
                format!("{{\n  \"default-runtime\": \"rt{i}\"\n}}\n"),
                "round {round}: {} got its default back",
                cfg.display()
            );
        }
        assert!(
            !state.exists(),
            "round {round}: the record's folder went with the last entry"
        );
    }
}

/// daemon.json configured by an older vgpuctl: the replaced default is in a hidden file beside it, which
/// unconfigure reads and removes.
#[test]
fn an_older_vgpuctls_hidden_file_is_read_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("daemon.json");
    let legacy = dir.path().join(".daemon.json.vgpuctl-previous-default");
    fs::write(
        &cfg,
        "{\n  \"default-runtime\": \"vgpu\",\n  \"runtimes\": {\"vgpu\": {\"path\": \"/usr/bin/vgpu-container-runtime\"}}\n}\n",
    )
    .unwrap();
    fs::write(&legacy, "{\"default-runtime\":\"crun\"}\n").unwrap();
    let out = vgpuctl(&[
        "runtime",
        "unconfigure",
        "--runtime=docker",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        fs::read_to_string(&cfg).unwrap(),
        "{\n  \"default-runtime\": \"crun\"\n}\n"
    );
    assert!(!legacy.exists());
}

/// containerd --drop-in on disk: the main file imports the drop-in (an import entry added, comments
/// kept), the drop-in holds the handler, the record says both; unconfigure takes all of it back.
#[test]
fn containerd_drop_in_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let main = dir.path().join("config.toml");
    let body = "# mine\nversion = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:mine\"\n";
    fs::write(&main, body).unwrap();
    let m = main.to_str().unwrap();
    let out = vgpuctl_in(
        &state,
        &[
            "runtime",
            "configure",
            "--runtime=containerd",
            "--config",
            m,
            "--drop-in",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let drop_in = dir.path().join("conf.d/99-vgpu.toml");
    let d = fs::read_to_string(&drop_in).unwrap();
    assert!(
        d.contains("BinaryName = \"/usr/bin/vgpu-container-runtime\"") && d.contains("pause:mine"),
        "{d}"
    );
    let new_main = fs::read_to_string(&main).unwrap();
    assert!(new_main.starts_with("# mine\nversion = 2\n"), "{new_main}");
    assert!(
        new_main.contains(&format!("imports = [\"{}\"]", drop_in.display())),
        "{new_main}"
    );
    let record = fs::read_to_string(state.join("engines.json")).unwrap();
    assert!(
        record.contains("\"drop_in\"") && record.contains("\"import_added\""),
        "{record}"
    );
    let again = vgpuctl_in(
        &state,
        &[
            "runtime",
            "configure",
            "--runtime=containerd",
            "--config",
            m,
            "--drop-in",
        ],
    );
    assert!(
        text(&again.stdout).contains("nothing to change"),
        "{}",
        text(&again.stdout)
    );
    let out = vgpuctl_in(
        &state,
        &[
            "runtime",
            "unconfigure",
            "--runtime=containerd",
            "--config",
            m,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::read_to_string(&main).unwrap(), body);
    assert!(!drop_in.exists() && !state.exists());
    // Not for the other engines.
    let out = vgpuctl(&[
        "runtime",
        "configure",
        "--runtime=docker",
        "--config",
        m,
        "--drop-in",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("--drop-in is for containerd only"));
}

/// `vgpuctl status | head`: a reader that has gone is no error to report (as for the shell's own tools,
/// the exit status is the SIGPIPE one, 141, and nothing is printed).
#[test]
fn a_reader_that_has_gone_ends_the_output_quietly() {
    let root = tempfile::tempdir().unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r); // the reader is gone before vgpuctl writes
    let out = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(["status", "--state-root"])
        .arg(root.path())
        .env_remove("VGPU_CONFIG")
        .stdout(std::process::Stdio::from(w))
        .output()
        .unwrap();
    assert_eq!(text(&out.stderr), "", "nothing on stderr");
    assert_eq!(out.status.code(), Some(141));
}

/// The same for the engine room's output (`EngineError::Output`): `runtime configure --dry-run | head`.
#[test]
fn a_reader_that_has_gone_ends_a_dry_run_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("daemon.json");
    std::fs::write(&config, "{}\n").unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    let out = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args([
            "runtime",
            "configure",
            "--runtime=docker",
            "--dry-run",
            "--config",
        ])
        .arg(&config)
        .env("VGPUCTL_STATE_DIR", dir.path().join("state"))
        .env_remove("VGPU_CONFIG")
        .stdout(std::process::Stdio::from(w))
        .output()
        .unwrap();
    // stderr has the dry run's notes ("would write ..."), and no error.
    let err = text(&out.stderr);
    assert!(!err.contains("error"), "{err}");
    assert_eq!(out.status.code(), Some(141));
}
