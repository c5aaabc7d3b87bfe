//! Test fixtures for the crates that test against limits files and ledgers (this crate's tests,
//! vgpu-host's, the library's, vgpuctl's), written once: a limits file of one GPU, and a container's folder
//! provisioned as the hook makes it. Built only for tests: under `cfg(test)` here, elsewhere through the
//! `test-fixtures` feature that those crates' dev-dependencies turn on (a build of the interposer never
//! does).

use crate::layout;
use crate::limits::{DeviceLimit, Limits, LIMITS_VERSION};
use crate::region::Ledger;
use crate::settings::GpuSettings;

/// The GPU of [`provisioned`].
pub const UUID: &str = "GPU-fa4ec0de-0000-4000-8000-000000000000";

/// The limits of container `id` on one GPU, `uuid` at index 0, with the memory quota `memory_limit` and
/// its ledger at `ledgers/<uuid>.ledger`: no owner, no names, never updated.
pub fn one_gpu(id: &str, uuid: &str, memory_limit: u64) -> Limits {
    Limits {
        version: LIMITS_VERSION,
        container_id: id.into(),
        pid_ns: None,
        init_pid: None,
        init_start_time: None,
        cgroup: None,
        creator: None,
        kubernetes: None,
        updates: 0,
        updated_at: None,
        devices: vec![DeviceLimit {
            index: 0,
            uuid: uuid.into(),
            settings: GpuSettings {
                memory_limit: Some(memory_limit),
                ..Default::default()
            },
            ledger: layout::relative_ledger_path(uuid).unwrap(),
            shrunk_from: None,
            held_at_shrink: None,
        }],
    }
}

/// A provisioned folder: limits.json (container `c1` on GPU [`UUID`], 1 GiB and a 30 % compute limit, its
/// owner recorded) with its second name, the one a container's mount holds, and the GPU's ledger.
pub fn provisioned() -> (tempfile::TempDir, Limits) {
    let d = tempfile::tempdir().unwrap();
    let mut limits = one_gpu("c1", UUID, 1 << 30);
    limits.pid_ns = Some(4026532612);
    limits.init_pid = Some(4242);
    limits.init_start_time = Some(7);
    limits.cgroup = Some("/kubepods/c1".into());
    limits.devices[0].settings.compute_limit = Some(30);
    std::fs::create_dir(d.path().join(layout::LEDGERS_DIR_NAME)).unwrap();
    Ledger::open_or_create(
        &limits.ledger_path(&d.path().join("x"), &limits.devices[0]),
        UUID,
        1 << 30,
    )
    .unwrap();
    // The bytes as the host writes them (`vgpu_host::limits_file`): pretty JSON and a newline.
    let mut bytes = serde_json::to_vec_pretty(&limits).unwrap();
    bytes.push(b'\n');
    let host = d.path().join(layout::LIMITS_FILE_NAME);
    std::fs::write(&host, bytes).unwrap();
    std::fs::hard_link(&host, d.path().join(layout::MOUNTED_LIMITS_FILE_NAME)).unwrap();
    (d, limits)
}
