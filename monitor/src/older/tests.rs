//! Older state's cgroup found from its recorded init and recorded, in a temporary state root; the host's
//! `/proc` made up.

use super::*;

const CG: &str = "/system.slice/runc-c1.scope";

fn state(limits: &str) -> (tempfile::TempDir, StateRoot) {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    let p = root.limits_path("c1").unwrap();
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, limits).unwrap();
    (d, root)
}

const OLD: &str = r#"{"version":1,"container_id":"c1","pid_ns":4026532000,"init_pid":4242,"init_start_time":777,
"devices":[{"index":0,"uuid":"GPU-0","memory_limit":1073741824,"ledger":"ledgers/GPU-0.ledger"}],"a_newer_key":{"kept":true}}"#;

fn container(start: Option<u64>) -> ContainerState {
    ContainerState {
        id: "c1".into(),
        pid_ns: Some(4026532000),
        init_pid: Some(4242),
        init_start_time: start,
        live: true,
        ..Default::default()
    }
}

fn host(alive: &dyn Fn(u32, u64, Option<u64>) -> bool) -> Host<'_> {
    Host {
        alive,
        cgroup_text: &|pid| (pid == 4242).then(|| format!("0::{CG}\n")),
        own: Some("/system.slice/vgpu-monitor.service".into()),
    }
}

#[test]
fn a_live_container_without_a_cgroup_gets_its_inits_recorded_every_other_key_kept() {
    let (_d, root) = state(OLD);
    let mut cs = vec![container(Some(777))];
    let alive =
        |pid: u32, ns: u64, start: Option<u64>| (pid, ns, start) == (4242, 4026532000, Some(777));
    let lines = record_missing(&root, &mut cs, &host(&alive));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(CG), "{lines:?}");
    assert_eq!(cs[0].cgroup.as_deref(), Some(CG), "{lines:?}");
    let text = std::fs::read_to_string(root.limits_path("c1").unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["cgroup"], CG);
    assert_eq!(v["a_newer_key"]["kept"], true, "{text}");
    // The host's readers read it back.
    let l = hostfile::load_limits(&root.limits_path("c1").unwrap()).unwrap();
    assert_eq!(l.cgroup.as_deref(), Some(CG));
    // Once recorded, nothing more to do.
    let mut cs = vec![container(Some(777))];
    cs[0].cgroup = l.cgroup;
    assert!(record_missing(&root, &mut cs, &host(&alive)).is_empty());
}

#[test]
fn nothing_is_recorded_without_a_start_time_for_a_reused_pid_the_monitors_own_or_the_root() {
    let (_d, root) = state(OLD);
    let p = root.limits_path("c1").unwrap();
    let before = std::fs::read(&p).unwrap();
    let alive = |_: u32, _: u64, _: Option<u64>| true;
    // No start time recorded: nothing tells its init from a reused PID.
    assert!(record_missing(&root, &mut [container(None)], &host(&alive)).is_empty());
    // The PID is another process's now (another start time).
    let reused = |_: u32, _: u64, s: Option<u64>| s == Some(1);
    assert!(record_missing(&root, &mut [container(Some(777))], &host(&reused)).is_empty());
    // The process's cgroup is the monitor's own, or the root.
    for cg in ["/system.slice", "/"] {
        let h = Host {
            alive: &alive,
            cgroup_text: &move |_| Some(format!("0::{cg}\n")),
            own: Some("/system.slice/vgpu-monitor.service".into()),
        };
        assert!(record_missing(&root, &mut [container(Some(777))], &h).is_empty());
    }
    assert_eq!(std::fs::read(&p).unwrap(), before, "the file is untouched");
}
