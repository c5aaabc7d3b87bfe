//! Reading and writing other programs' config files: the old file or the new one after a crash, never half,
//! mode and owner kept. The atomic write itself lives in `vgpu_host::atomic`; this only picks its options.
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use vgpu_host::atomic::WriteOptions;

/// A config file that could not be read, written or removed. `Display` is one line naming the file
/// (the atomic write's own error names it already).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {err}", path.display())]
    Read { path: PathBuf, err: io::Error },
    #[error("cannot remove {}: {err}", path.display())]
    Remove { path: PathBuf, err: io::Error },
    #[error(transparent)]
    Write(io::Error),
}

type Result<T, E = FileError> = std::result::Result<T, E>;

/// Replaces (or creates) `path` with `contents` atomically. An existing file keeps its permission bits and
/// owner; a new one gets `new_mode`. Missing parent folders are created. Synced, folder included.
pub fn write_atomic(path: &Path, contents: &[u8], new_mode: u32) -> Result<()> {
    let opts = WriteOptions::with_mode(new_mode)
        .keep_mode()
        .keep_owner()
        .durable()
        .create_parents();
    vgpu_host::atomic::write_atomic(path, contents, opts).map_err(FileError::Write)
}

/// Reads `path`; `None` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(FileError::Read {
            path: path.into(),
            err,
        }),
    }
}

/// Removes `path`; a file already gone is fine.
pub fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(FileError::Remove {
            path: path.into(),
            err,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn keeps_mode_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        fs::write(&p, "{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"{\"a\":1}", 0o644).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn keeps_owner() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("containers.conf");
        fs::write(&p, "x").unwrap();
        // Only root can give a file away; elsewhere this checks the owner stays the same.
        let (uid, gid) = if nix_is_root() {
            (65534, 65534)
        } else {
            let m = fs::metadata(&p).unwrap();
            (m.uid(), m.gid())
        };
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        write_atomic(&p, b"y", 0o644).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid));
    }

    fn nix_is_root() -> bool {
        fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    }

    #[test]
    fn creates_parents_with_new_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/99-vgpu.toml");
        write_atomic(&p, b"x", 0o640).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
    }

    #[test]
    fn a_missing_file_is_none_and_a_folder_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_optional(&d.path().join("nope")).unwrap().is_none());
        remove_file(&d.path().join("nope")).unwrap();
        assert!(matches!(
            read_optional(d.path()),
            Err(FileError::Read { path, .. }) if path == d.path()
        ));
        assert!(matches!(
            remove_file(d.path()),
            Err(FileError::Remove { path, .. }) if path == d.path()
        ));
    }
}
