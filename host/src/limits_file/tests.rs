//! The host's write of limits.json: its bytes (today's files written back unchanged), the refusals, the
//! atomic replacement.
use super::*;
use vgpu_ledger::KubeNames;

fn one_gpu() -> Limits {
    vgpu_ledger::fixtures::one_gpu("c1", "GPU-aaaa", 1 << 30)
}

#[test]
fn writes_mode_0644_and_reads_back() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    std::fs::write(&path, b"old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let l = one_gpu();
    l.write_atomic(&path).unwrap();
    assert_eq!(Limits::load(&path).unwrap(), l);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(std::fs::read(&path).unwrap(), l.to_file_bytes().unwrap());
}

// Issue 25: pod names of 128 KiB each made a 1.5 MiB file, past the host readers' cap: the running
// container vanished from status, admission, gc and the monitor. Such a file is never written.
#[test]
fn an_invalid_or_oversized_file_is_refused_naming_the_path_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.json");
    let mut bad = one_gpu();
    bad.version = 0;
    let e = bad.write_atomic(&path).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(
        e.to_string().starts_with(&path.display().to_string()),
        "{e}"
    );
    let mut escapes = one_gpu();
    escapes.devices[0].ledger = "../escape".into();
    let e = escapes.to_file_bytes().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let mut big = one_gpu();
    big.kubernetes = Some(KubeNames {
        pod: "p".repeat(vgpu_ledger::limits::MAX_LIMITS_FILE as usize),
        ..Default::default()
    });
    let e = big.write_atomic(&path).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(
        e.to_string().contains("more than the host's readers take")
            && e.to_string().contains("limits.json"),
        "{e}"
    );
    assert!(!path.exists());
}

/// limits.json as the hook and `vgpuctl update` wrote it before a device's settings became one struct
/// (`WriteLimits::to_file_bytes`: pretty JSON and a newline): one file with a memory quota alone, one with every
/// per-GPU setting. The struct is flattened (`vgpu_ledger::settings`), so the keys stay the device's own: the
/// first file is written back byte for byte; the second to the same JSON, its device's settings now
/// all before `ledger` (no reader looks at the order of keys).
const GOLDEN_MEMORY: &str = r#"{
  "version": 1,
  "container_id": "3f2a",
  "pid_ns": 4026532612,
  "init_pid": 12345,
  "init_start_time": 987654,
  "cgroup": "/kubepods/pod-1/3f2a",
  "devices": [
    {
      "index": 0,
      "uuid": "GPU-aaaa",
      "memory_limit": 1073741824,
      "ledger": "ledgers/GPU-aaaa.ledger"
    },
    {
      "index": 1,
      "uuid": "GPU-bbbb",
      "memory_limit": 2147483648,
      "ledger": "ledgers/GPU-bbbb.ledger",
      "shrunk_from": 4294967296
    }
  ],
  "creator": {
    "pid": 4242,
    "start_time": 77
  },
  "kubernetes": {
    "namespace": "n",
    "pod": "p",
    "container": "c"
  },
  "updates": 2,
  "updated_at": 1790000000
}
"#;

const GOLDEN_EVERY_SETTING: &str = r#"{
  "version": 1,
  "container_id": "3f2a",
  "devices": [
    {
      "index": 0,
      "uuid": "GPU-aaaa",
      "memory_limit": 1073741824,
      "ledger": "ledgers/GPU-aaaa.ledger",
      "memory": {
        "mode": "spill",
        "spill_limit": 8589934592
      },
      "compute_limit": 30,
      "compute_policy": "force",
      "compute_window_ms": 250
    },
    {
      "index": 1,
      "uuid": "GPU-bbbb",
      "memory_limit": 2147483648,
      "ledger": "ledgers/GPU-bbbb.ledger",
      "memory": {
        "mode": "oversubscribe",
        "reserve": 1610612736
      }
    },
    {
      "index": 2,
      "uuid": "GPU-cccc",
      "ledger": "ledgers/GPU-cccc.ledger",
      "compute_limit": 70
    }
  ]
}
"#;

fn written(l: &Limits) -> String {
    String::from_utf8(l.to_file_bytes().unwrap()).unwrap()
}

#[test]
fn todays_files_read_and_write_back_unchanged() {
    let l = Limits::from_slice(GOLDEN_MEMORY.as_bytes()).unwrap();
    assert_eq!(written(&l), GOLDEN_MEMORY);
    let l = Limits::from_slice(GOLDEN_EVERY_SETTING.as_bytes()).unwrap();
    let again = written(&l);
    let value = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
    assert_eq!(value(&again), value(GOLDEN_EVERY_SETTING));
    assert_eq!(Limits::from_slice(again.as_bytes()).unwrap(), l);
}
