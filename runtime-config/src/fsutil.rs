//! Writing other programs' config files safely: a temp file in the same folder, fsync, then rename, so a
//! crash leaves either the old file or the new one, never half of one. The file's mode and owner are kept.
use anyhow::{Context, Result};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Replaces (or creates) `path` with `contents` atomically. An existing file keeps its permission bits;
/// a new one gets `new_mode`. Missing parent folders are created.
pub fn write_atomic(path: &Path, contents: &[u8], new_mode: u32) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).with_context(|| format!("cannot create folder {}", dir.display()))?;
    let (mode, owner) = match fs::metadata(path) {
        Ok(m) => (m.permissions().mode() & 0o7777, Some((m.uid(), m.gid()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (new_mode, None),
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", path.display())),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".vgpuctl-tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    tmp.write_all(contents).with_context(|| format!("cannot write {}", tmp.path().display()))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(tmp.as_file(), Some(uid), Some(gid))
            .with_context(|| format!("cannot give {} the owner of {}", tmp.path().display(), path.display()))?;
    }
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", tmp.path().display()))?;
    tmp.as_file().sync_all().with_context(|| format!("cannot sync {}", tmp.path().display()))?;
    tmp.persist(path).map_err(|e| e.error).with_context(|| format!("cannot replace {}", path.display()))?;
    // The rename is durable only once the folder itself is synced.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads `path`; `None` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Removes `path`; a file already gone is fine.
pub fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_mode_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("daemon.json");
        fs::write(&p, "{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"{\"a\":1}", 0o644).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "{\"a\":1}");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn keeps_owner() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("containers.conf");
        fs::write(&p, "x").unwrap();
        // Only root can give a file away; elsewhere this checks the owner stays the same.
        let (uid, gid) = if nix_is_root() { (65534, 65534) } else { let m = fs::metadata(&p).unwrap(); (m.uid(), m.gid()) };
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        write_atomic(&p, b"y", 0o644).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid));
    }

    fn nix_is_root() -> bool {
        fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
    }

    #[test]
    fn creates_parents_with_new_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/99-vgpu.toml");
        write_atomic(&p, b"x", 0o640).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o640);
    }
}
