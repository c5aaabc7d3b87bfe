//! The configuration's sources and lookups: limits files (mounted or named), the environment's quotas,
//! zero as no limit, ledger prefixes, memory modes and compute shares. The code is in `config.rs`.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
const NOFILE: &str = "/nonexistent/vgpu/limits.json";

fn gpu(uuid: &str, index: Option<u32>) -> Gpu<'_> {
    Gpu {
        uuid,
        parent: None,
        index,
    }
}

fn limit(c: &Config, g: Gpu<'_>) -> Option<u64> {
    match c.lookup(g) {
        Lookup::Limit(s) => Some(s.limit()),
        _ => None,
    }
}

#[test]
fn limits_file_refuses_unlisted_gpus_and_gives_mig_its_gpus_quota() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    std::fs::write(
        &path,
        r#"{"version":1,"container_id":"c","devices":[{"index":0,"uuid":"GPU-a","memory_limit":4096,"ledger":"ledgers/GPU-a.ledger"}]}"#,
    )
    .unwrap();
    let env = env(&[("VGPU_LIMITS_FILE", path.to_str().unwrap())]);
    let c = Config::from_env(&env, Path::new(NOFILE)).unwrap();
    assert_eq!(limit(&c, gpu("GPU-a", Some(3))), Some(4096));
    let Lookup::Refuse(why) = c.lookup(gpu("GPU-b", Some(0))) else {
        panic!("an unlisted GPU must be refused")
    };
    assert!(matches!(&why, Unplaced::NotInFile { uuid, .. } if uuid == "GPU-b"));
    let why = why.to_string();
    assert!(
        why.contains("GPU-b") && why.contains("limits.json"),
        "{why}"
    );
    let mig = Gpu {
        uuid: "MIG-x",
        parent: Some("GPU-a"),
        index: Some(0),
    };
    let Lookup::Limit(s) = c.lookup(mig) else {
        panic!("a MIG instance gets its GPU's quota")
    };
    assert_eq!(s.ledger, dir.path().join("ledgers/GPU-a.ledger"));
    let orphan = Gpu {
        parent: Some("GPU-z"),
        ..mig
    };
    assert!(matches!(c.lookup(orphan), Lookup::Refuse(_)));
}

#[test]
fn inside_a_container_the_mounted_limits_file_is_the_only_source() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, limit: u64| {
        let p = dir.path().join(name);
        std::fs::write(
            &p,
            format!(r#"{{"version":1,"container_id":"c","devices":[{{"index":0,"uuid":"GPU-a","memory_limit":{limit},"ledger":"ledgers/GPU-a.ledger"}}]}}"#),
        )
        .unwrap();
        p
    };
    let mounted = file("mounted.json", 4096);
    // Any user can copy the file with a bigger number and name it, or set the HAMi variables.
    let copy = file("copy.json", 1 << 40);
    let env = env(&[
        ("VGPU_LIMITS_FILE", copy.to_str().unwrap()),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1t"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1t"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
    ]);
    let c = Config::from_env(&env, &mounted).unwrap();
    let Lookup::Limit(s) = c.lookup(gpu("GPU-a", Some(0))) else {
        panic!("the mounted file's GPU has a limit")
    };
    assert_eq!(s.limit(), 4096);
    assert_eq!(s.ledger, dir.path().join("ledgers/GPU-a.ledger"));
    assert_eq!(c.ledger_mode(), LedgerMode::Provisioned, "never created");
    let named = Config::from_env(&env, Path::new(NOFILE)).unwrap();
    assert_eq!(named.ledger_mode(), LedgerMode::File);
    // A mounted file that cannot be read refuses CUDA; nothing else takes its place.
    std::fs::write(&mounted, "{").unwrap();
    let e = Config::from_env(&env, &mounted).unwrap_err().to_string();
    assert!(e.contains("mounted.json"), "{e}");
}

#[test]
fn compute_shares_come_from_the_mounted_limits_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = dir.path().join("limits.json");
    std::fs::write(
        &mounted,
        r#"{"version":1,"container_id":"c","devices":[
            {"index":0,"uuid":"GPU-a","compute_limit":30,"ledger":"ledgers/GPU-a.ledger"},
            {"index":1,"uuid":"GPU-b","memory_limit":4096,"compute_limit":70,"compute_policy":"force","compute_window_ms":250,"ledger":"ledgers/GPU-b.ledger"},
            {"index":2,"uuid":"GPU-c","memory_limit":4096,"ledger":"ledgers/GPU-c.ledger"}]}"#,
    )
    .unwrap();
    // The tenant's own variables change nothing: no share lifted, none added, no error.
    let env = env(&[
        ("CUDA_DEVICE_SM_LIMIT", "0"),
        ("CUDA_DEVICE_SM_LIMIT_0", "100"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ("CUDA_DEVICE_SM_LIMIT_2", "junk"),
        ("VGPU_COMPUTE_WINDOW", "5s"),
    ]);
    let c = Config::from_env(&env, &mounted).unwrap();
    assert!(c.has_shares());
    // GPU-a: a share alone, no memory quota.
    assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
    let share = |g| c.share(g).map(|s| (s.share().unwrap(), s.ledger));
    assert_eq!(
        share(gpu("GPU-a", Some(0))),
        Some((((30, 30), 1000), dir.path().join("ledgers/GPU-a.ledger"))),
        "no window in the file: the default, not the tenant's variable"
    );
    assert_eq!(limit(&c, gpu("GPU-b", None)), Some(4096));
    assert_eq!(
        share(gpu("GPU-b", None)).map(|s| s.0),
        Some(((70, 70), 250))
    );
    let mig = Gpu {
        uuid: "MIG-x",
        parent: Some("GPU-b"),
        index: Some(1),
    };
    assert_eq!(share(mig).map(|s| s.0 .0), Some((70, 70)));
    assert_eq!(share(gpu("GPU-c", Some(2))), None);
    assert_eq!(share(gpu("GPU-z", Some(3))), None);
    // No limits file: the environment's shares (here none: 0 is no share).
    let c = Config::from_env(&env[..1], Path::new(NOFILE)).unwrap();
    assert!(!c.has_shares());
    assert_eq!(c.share(gpu("GPU-a", Some(0))), None);
}

#[test]
fn nothing_set_is_unlimited() {
    assert!(Config::from_env(&env(&[]), Path::new(NOFILE))
        .unwrap()
        .is_unlimited());
    assert!(Config::from_env(
        &env(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")]),
        Path::new(NOFILE)
    )
    .unwrap()
    .is_unlimited());
}

#[test]
fn global_and_per_index_limits() {
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "512Mi"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    let Lookup::Limit(d0) = c.lookup(gpu("GPU-a", Some(0))) else {
        panic!()
    };
    assert_eq!(d0.limit(), 1 << 30);
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        d0.ledger,
        PathBuf::from(format!("/tmp/vgpu-{me}/cudevshr.cache.GPU-a"))
    );
    assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(512 << 20));
    let Lookup::Refuse(why) = c.lookup(gpu("GPU-b", None)) else {
        panic!("per-index limits need the GPU's index")
    };
    assert_eq!(
        why,
        Unplaced::NoIndex {
            uuid: "GPU-b".into()
        }
    );
    assert!(
        why.to_string().contains("CUDA_DEVICE_MEMORY_LIMIT_<i>"),
        "{why}"
    );
}

#[test]
fn per_index_zero_means_no_limit_for_that_device() {
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
    assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(1 << 30));
}

#[test]
fn zero_means_no_limit_as_the_hook_reads_it() {
    // The hook passes such a container through untouched; the library then runs it unlimited.
    for pairs in [
        &[("CUDA_DEVICE_MEMORY_LIMIT", "0")][..],
        &[("CUDA_DEVICE_MEMORY_LIMIT_0", "0")],
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", ""),
        ],
    ] {
        let c = Config::from_env(&env(pairs), Path::new(NOFILE)).unwrap();
        assert!(c.is_unlimited(), "{pairs:?}");
    }
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "0"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1g"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
    assert_eq!(limit(&c, gpu("GPU-b", Some(1))), Some(1 << 30));
}

#[test]
fn shared_cache_prefix() {
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "268435456"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert_eq!(
        c.lookup(gpu("GPU-1", None)),
        Lookup::Limit(DeviceSpec {
            settings: GpuSettings {
                memory_limit: Some(256 << 20),
                ..Default::default()
            },
            ledger: "/x/q.GPU-1".into(),
        })
    );
}

#[test]
fn default_ledgers_are_per_user() {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let tmp = PathBuf::from(format!("/tmp/vgpu-{me}"));
    let ledger_of = |pairs: &[(&str, &str)]| {
        let mut pairs = pairs.to_vec();
        pairs.push(("CUDA_DEVICE_MEMORY_LIMIT", "1g"));
        let c = Config::from_env(&env(&pairs), Path::new(NOFILE)).unwrap();
        let Lookup::Limit(s) = c.lookup(gpu("GPU-a", Some(0))) else {
            panic!("limited")
        };
        let LedgerMode::Env { dir } = c.ledger_mode() else {
            panic!("environment mode")
        };
        (s.ledger, dir.map(Path::to_path_buf))
    };
    assert_eq!(
        ledger_of(&[]),
        (tmp.join("cudevshr.cache.GPU-a"), Some(tmp.clone()))
    );
    let xdg = tempfile::tempdir().unwrap();
    let x = xdg.path().to_str().unwrap();
    assert_eq!(
        ledger_of(&[("XDG_RUNTIME_DIR", x)]),
        (
            xdg.path().join("vgpu/cudevshr.cache.GPU-a"),
            Some(xdg.path().join("vgpu"))
        )
    );
    // Not a folder of this user's as such (a link, a relative path, missing): the /tmp folder.
    let link = xdg.path().join("link");
    std::os::unix::fs::symlink(xdg.path(), &link).unwrap();
    for bad in [link.to_str().unwrap(), "relative", "/nonexistent/xdg"] {
        assert_eq!(
            ledger_of(&[("XDG_RUNTIME_DIR", bad)]).1,
            Some(tmp.clone()),
            "{bad}"
        );
    }
    // A prefix given explicitly is used as it is, with no folder of ours to make.
    assert_eq!(
        ledger_of(&[
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
            ("XDG_RUNTIME_DIR", x)
        ]),
        (PathBuf::from("/x/q.GPU-a"), None)
    );
}

#[test]
fn bad_values_are_errors_naming_the_variable() {
    let e = Config::from_env(
        &env(&[("CUDA_DEVICE_MEMORY_LIMIT", "lots")]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT=\"lots\""), "{e}");
    let e = Config::from_env(
        &env(&[("CUDA_DEVICE_MEMORY_LIMIT_x", "1g")]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT_x"), "{e}");
    let e = Config::from_env(
        &env(&[("CUDA_DEVICE_MEMORY_LIMIT_2", "-5")]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT_2"), "{e}");
}

#[test]
fn named_limits_file_must_exist() {
    let e = Config::from_env(
        &env(&[("VGPU_LIMITS_FILE", "/nonexistent/l.json")]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent/l.json"), "{e}");
}

#[test]
fn memory_modes_from_the_environment_apply_to_every_limited_gpu() {
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
            ("VGPU_MEMORY_SPILL", "8g"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    match c.lookup(gpu("GPU-1", Some(0))) {
        Lookup::Limit(s) => assert_eq!(
            s.settings.memory,
            MemoryMode::Spill {
                spill_limit: 8 << 30
            }
        ),
        other => panic!("{other:?}"),
    }
    // HAMi's variable
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_OVERSUBSCRIBE", "true"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert!(matches!(
        c.lookup(gpu("GPU-1", Some(0))),
        Lookup::Limit(DeviceSpec {
            settings: GpuSettings {
                memory: MemoryMode::Oversubscribe { .. },
                ..
            },
            ..
        })
    ));
    // a bad setting never runs: one error naming it
    let e = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("VGPU_MEMORY_MODE", "swap"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("VGPU_MEMORY_MODE=\"swap\""), "{e}");
}

#[test]
fn the_environment_window_is_checked_with_the_configuration() {
    assert_eq!(env::window_ms(&env(&[])), Ok(1000));
    assert_eq!(
        env::window_ms(&env(&[("VGPU_COMPUTE_WINDOW", " ")])),
        Ok(1000)
    );
    assert_eq!(
        env::window_ms(&env(&[("VGPU_COMPUTE_WINDOW", "250ms")])),
        Ok(250)
    );
    let e = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("VGPU_COMPUTE_WINDOW", "1m"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("VGPU_COMPUTE_WINDOW=\"1m\": unknown unit"),
        "{e}"
    );
    assert!(!e.contains('\n'));
}

#[test]
fn the_turn_gate_applies_where_a_limited_gpu_is_oversubscribed() {
    let dir = tempfile::tempdir().unwrap();
    let file = |devices: &str| {
        let p = dir.path().join("limits.json");
        std::fs::write(
            &p,
            format!(r#"{{"version":1,"container_id":"c","devices":[{devices}]}}"#),
        )
        .unwrap();
        Config::from_env(&[], &p).unwrap()
    };
    let plain = r#"{"index":0,"uuid":"GPU-a","memory_limit":4096,"ledger":"a.ledger"}"#;
    let over = r#"{"index":1,"uuid":"GPU-b","memory_limit":4096,"memory":{"mode":"oversubscribe","reserve":0},"ledger":"b.ledger"}"#;
    let share = r#"{"index":2,"uuid":"GPU-c","compute_limit":30,"ledger":"c.ledger"}"#;
    assert!(!file(plain).any_oversubscribed());
    assert!(!file(&format!("{plain},{share}")).any_oversubscribed());
    assert!(file(&format!("{plain},{over}")).any_oversubscribed());
    let limit = ("CUDA_DEVICE_MEMORY_LIMIT", "4g");
    let from_env =
        |pairs: &[(&str, &str)]| Config::from_env(&env(pairs), Path::new(NOFILE)).unwrap();
    assert!(!from_env(&[limit]).any_oversubscribed());
    assert!(from_env(&[limit, ("CUDA_OVERSUBSCRIBE", "true")]).any_oversubscribed());
    assert!(
        !from_env(&[("CUDA_OVERSUBSCRIBE", "true")]).any_oversubscribed(),
        "no limit: unlimited"
    );
}

// The environment's compute shares come from the one loader (they were read a second time by the
// compute share, apart from the memory limits): a share alone leaves the memory hooks forwarding.
#[test]
fn the_environments_shares_are_the_same_configurations() {
    let vars = env(&[
        ("CUDA_DEVICE_SM_LIMIT", "30"),
        ("CUDA_DEVICE_SM_LIMIT_1", "100"),
        ("VGPU_COMPUTE_WINDOW", "250ms"),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/q"),
        // not read without a memory limit, as before
        ("VGPU_MEMORY_MODE", "swap"),
    ]);
    let c = Config::from_env(&vars, Path::new(NOFILE)).unwrap();
    assert!(c.is_unlimited() && c.has_shares() && !c.any_oversubscribed());
    assert_eq!(c.lookup(gpu("GPU-a", Some(0))), Lookup::NoLimit);
    let s = c.share(gpu("GPU-a", Some(0))).unwrap();
    assert_eq!(
        (s.share(), s.ledger, s.settings.memory_limit),
        (Some(((30, 30), 250)), PathBuf::from("/x/q.GPU-a"), None)
    );
    assert_eq!(c.share(gpu("GPU-b", Some(1))), None, "100 is no share");
    assert_eq!(c.ledger_mode(), LedgerMode::Env { dir: None });
    // With a memory limit, one GPU's settings carry both.
    let mut vars = vars[..4].to_vec();
    vars.push(("CUDA_DEVICE_MEMORY_LIMIT".into(), "1g".into()));
    let c = Config::from_env(&vars, Path::new(NOFILE)).unwrap();
    let Lookup::Limit(m) = c.lookup(gpu("GPU-a", Some(0))) else {
        panic!()
    };
    assert_eq!(m, c.share(gpu("GPU-a", Some(0))).unwrap());
    assert_eq!((m.limit(), m.share()), (1 << 30, Some(((30, 30), 250))));
    // Disabled: no share anywhere, and nothing else set is no limit at all.
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert!(matches!(c, Config::Unlimited));
    // A malformed share is the loader's typed error.
    let e =
        Config::from_env(&env(&[("CUDA_DEVICE_SM_LIMIT", "x")]), Path::new(NOFILE)).unwrap_err();
    assert!(matches!(e, ConfigError::Compute(_)), "{e:?}");
}

// Issue 42: the environment's requests (`CUDA_DEVICE_SM_REQUEST[_<i>]`) ride with the share's settings;
// a request above its limit, or one that is no percent 1..=100, refuses CUDA in one line naming it.
#[test]
fn the_environments_requests_ride_with_the_shares() {
    assert!(env::read_by_config("CUDA_DEVICE_SM_REQUEST_1"));
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_SM_LIMIT", "60"),
            ("CUDA_DEVICE_SM_REQUEST", "20"),
            ("CUDA_DEVICE_SM_REQUEST_1", "40"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    let s = c.share(gpu("GPU-b", Some(1))).unwrap();
    assert_eq!(s.settings.request_limit(), Some((40, 60)));
    // The share lends from the request up to the limit (`compute::lend`).
    assert_eq!(s.share(), Some(((40, 60), 1000)));
    assert_eq!(
        c.share(gpu("GPU-a", Some(0)))
            .unwrap()
            .settings
            .compute_request,
        Some(20)
    );
    for (vars, want) in [
        (
            &[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("CUDA_DEVICE_SM_REQUEST", "40"),
            ][..],
            "env CUDA_DEVICE_SM_REQUEST=40: a compute request is at most its limit",
        ),
        (
            &[("CUDA_DEVICE_SM_REQUEST", "0")][..],
            "CUDA_DEVICE_SM_REQUEST=\"0\": a compute request is a whole percent 1..=100",
        ),
    ] {
        let e = Config::from_env(&env(vars), Path::new(NOFILE)).unwrap_err();
        assert!(e.to_string().starts_with(want), "{e}");
    }
    // A request alone is a share whose limit is the whole GPU (lent all of it while alone); a request of
    // the whole GPU holds nothing back.
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_SM_REQUEST", "30"),
            ("CUDA_DEVICE_SM_REQUEST_1", "100"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert!(c.has_shares());
    assert_eq!(
        c.share(gpu("GPU-a", Some(0))).unwrap().share(),
        Some(((30, 100), envcompute::DEFAULT_WINDOW_MS))
    );
    assert_eq!(c.share(gpu("GPU-b", Some(1))), None);
    // Disabled, a request is none either.
    let c = Config::from_env(
        &env(&[
            ("CUDA_DEVICE_SM_REQUEST", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ]),
        Path::new(NOFILE),
    )
    .unwrap();
    assert!(!c.has_shares());
}
