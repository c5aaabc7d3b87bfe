//! Unit tests of `live`: a reading during a write is never applied (the host's publish and this read
//! together: `vgpu_host::live`'s tests).
use super::*;
use crate::layout;
use crate::limits::DeviceLimit;
use crate::region::Ledger;
use crate::settings::GpuSettings;

const UUID: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";

/// A provisioned folder: limits.json with its second name, one ledger.
fn provisioned() -> (tempfile::TempDir, Limits) {
    let d = tempfile::tempdir().unwrap();
    let limits = Limits {
        version: 1,
        container_id: "c1".into(),
        pid_ns: Some(4026532612),
        init_pid: Some(4242),
        init_start_time: Some(7),
        cgroup: Some("/kubepods/c1".into()),
        creator: None,
        kubernetes: None,
        updates: 0,
        updated_at: None,
        devices: vec![DeviceLimit {
            index: 0,
            uuid: UUID.into(),
            settings: GpuSettings {
                memory_limit: Some(1 << 30),
                compute_limit: Some(30),
                ..Default::default()
            },
            ledger: layout::relative_ledger_path(UUID).unwrap(),
            shrunk_from: None,
            held_at_shrink: None,
        }],
    };
    std::fs::create_dir(d.path().join(layout::LEDGERS_DIR_NAME)).unwrap();
    Ledger::open_or_create(
        &limits.ledger_path(&d.path().join("x"), &limits.devices[0]),
        UUID,
        1 << 30,
    )
    .unwrap();
    let host = d.path().join(layout::LIMITS_FILE_NAME);
    std::fs::write(&host, serde_json::to_vec_pretty(&limits).unwrap()).unwrap();
    std::fs::hard_link(&host, d.path().join(layout::MOUNTED_LIMITS_FILE_NAME)).unwrap();
    (d, limits)
}

fn ledger(d: &Path) -> Ledger {
    Ledger::open(&d.join(layout::relative_ledger_path(UUID).unwrap())).unwrap()
}

#[test]
fn a_reading_while_the_host_writes_is_never_applied() {
    let (d, _) = provisioned();
    let mounted = d.path().join(layout::MOUNTED_LIMITS_FILE_NAME);
    let led = ledger(d.path());
    led.set_limits_generation(3);
    assert!(matches!(
        read_stable(&mounted, || led.limits_generation()),
        Err(ReadError::Moving)
    ));
    // the generation moved during the read: not applied
    let calls = std::cell::Cell::new(0u64);
    let moving = || {
        calls.set(calls.get() + 1);
        calls.get() * 2
    };
    assert!(matches!(
        read_stable(&mounted, moving),
        Err(ReadError::Moving)
    ));
    // half a file (cut short) is not applied either
    std::fs::write(&mounted, b"{\"version\": 1, \"devi").unwrap();
    led.set_limits_generation(4);
    assert!(matches!(
        read_stable(&mounted, || led.limits_generation()),
        Err(ReadError::Invalid(_))
    ));
}
