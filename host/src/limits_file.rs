//! limits.json as the host writes it (the hook's provisioning, `vgpuctl update`, gc's tests): the ledger
//! crate's bytes (`Limits::to_file_bytes`: validated, at most `MAX_LIMITS_FILE`) replaced atomically, mode
//! 0644 whatever was there, synced. Not here: the format (`vgpu_ledger::limits`), reading it on the host
//! (`crate::hostfile::load_limits`).

use std::io;
use std::path::Path;
use vgpu_ledger::Limits;

use crate::atomic::{write_atomic, WriteOptions};

/// How the limits file is written: mode 0644 whatever was there, synced (docs/architecture.md).
const WRITE_OPTIONS: WriteOptions = WriteOptions::with_mode(0o644).durable();

/// The host's write of a limits file.
pub trait WriteLimits {
    /// Write the file atomically (temporary file in the same folder, then rename), mode 0644: readable by
    /// the container's non-root processes, writable by nobody inside (it is mounted read-only anyway).
    /// An invalid or oversized file is refused, nothing written; errors name the path.
    fn write_atomic(&self, path: &Path) -> io::Result<()>;
}

impl WriteLimits for Limits {
    fn write_atomic(&self, path: &Path) -> io::Result<()> {
        let text = self
            .to_file_bytes()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        write_atomic(path, &text, WRITE_OPTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_ledger::{DeviceLimit, GpuSettings, KubeNames, LIMITS_VERSION};

    fn one_gpu() -> Limits {
        Limits {
            version: LIMITS_VERSION,
            container_id: "c1".into(),
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
                uuid: "GPU-aaaa".into(),
                settings: GpuSettings {
                    memory_limit: Some(1 << 30),
                    ..Default::default()
                },
                ledger: "ledgers/GPU-aaaa.ledger".into(),
                shrunk_from: None,
                held_at_shrink: None,
            }],
        }
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
}
