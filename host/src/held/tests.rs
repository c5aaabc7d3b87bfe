//! Unit tests of `held`: a container's processes counted as the watchdog counts them, others' not, an
//! unlisted GPU unknown, a gone container's nothing.
use super::*;
use crate::limits_file::WriteLimits;
use vgpu_ledger::{DeviceLimit, Limits};

const U0: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";
const U1: &str = "GPU-fa4ec0de-0000-4000-8000-000000000001";
const MIB: u64 = 1 << 20;

/// Container `id` (PID namespace `ns`, init PID 1 there) with a 1 GiB quota on U0 and U1.
fn container(root: &StateRoot, id: &str, ns: u64) {
    std::fs::create_dir_all(root.ledgers_dir(id).unwrap()).unwrap();
    crate::walk::mark(&root.containers_dir()).unwrap();
    crate::walk::mark(&root.container_dir(id).unwrap()).unwrap();
    let device = |index, uuid: &str| DeviceLimit {
        index,
        uuid: uuid.into(),
        settings: vgpu_ledger::GpuSettings {
            memory_limit: Some(1 << 30),
            ..Default::default()
        },
        ledger: vgpu_ledger::layout::relative_ledger_path(uuid).unwrap(),
        shrunk_from: None,
        held_at_shrink: None,
    };
    let limits = Limits {
        version: vgpu_ledger::LIMITS_VERSION,
        container_id: id.into(),
        pid_ns: Some(ns),
        init_pid: Some(1),
        init_start_time: None,
        cgroup: None,
        creator: None,
        devices: vec![device(0, U0), device(1, U1)],
        kubernetes: None,
        updates: 0,
        updated_at: None,
    };
    limits.write_atomic(&root.limits_path(id).unwrap()).unwrap();
}

/// Host PID `pid` lives in PID namespace `pid / 100`.
fn inspect(pid: u32) -> Option<HostProc> {
    Some(HostProc {
        pid,
        ns: (pid / 100) as u64,
        inner_pid: pid % 100,
        start_time: 1,
        cgroup: Some("0::/".into()),
    })
}

fn reading(uuid: &str, processes: Option<Vec<(u32, u64)>>) -> GpuReading {
    GpuReading {
        uuid: uuid.into(),
        processes,
        ..Default::default()
    }
}

#[test]
fn a_containers_own_processes_by_gpu_and_only_where_nvml_listed_them() {
    let d = tempfile::tempdir().unwrap();
    let root = StateRoot::new(d.path().to_path_buf());
    container(&root, "a", 1);
    container(&root, "b", 2);
    let readings = [
        reading(
            U0,
            Some(vec![
                (101, 300 * MIB),
                (102, 200 * MIB),
                (201, 700 * MIB),
                (901, 50),
            ]),
        ),
        reading(U1, None),
    ];
    let held =
        |id, alive: bool| held_with(&root, id, &readings, |_, _, _| alive, inspect, 9).unwrap();
    assert_eq!(
        held("a", true),
        BTreeMap::from([(U0.to_string(), 500 * MIB)])
    );
    assert_eq!(
        held("b", true),
        BTreeMap::from([(U0.to_string(), 700 * MIB)])
    );
    // its init gone: its namespace names nothing, it holds nothing
    assert_eq!(held("a", false), BTreeMap::from([(U0.to_string(), 0)]));
    assert_eq!(held("nosuch", true), BTreeMap::new());
}
