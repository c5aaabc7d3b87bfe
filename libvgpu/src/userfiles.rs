//! The environment mode's files, which may lie where other users can reach them: the per-user folder of the
//! default ledgers (made 0700, used only while it is this user's, 0700, not a link) and which ledger files
//! may be used (not a link, this user's or root's, writable by nobody else). Not here: opening ledgers
//! (`quota`), where they are (`config`).

use std::path::Path;

/// Whether the environment mode may use the file at `path`: not a symbolic link, owned by this user or
/// root, and not writable by group or others (who could change or truncate it under this process: SIGBUS).
/// `may_be_missing`: a file that does not exist yet is fine (it will be created).
pub(crate) fn trusted(path: &Path, may_be_missing: bool) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if may_be_missing && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    owned_by_us_or_root(m.file_type().is_symlink(), m.uid())?;
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "other users can write it (mode {:o}); not used",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The environment mode's per-user folder (`config::env::user_dir`): made if missing (0700); used only when it
/// is a folder, not a symbolic link, of this (effective) user's, with mode 0700 — so no other user can
/// reach the ledgers in it. Anything else is refused rather than repaired.
pub(crate) fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        // Ours: 0700 whatever the umask.
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| e.to_string())?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create it: {e}")),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.file_type().is_symlink() {
        Err("is a symbolic link, which is not followed".into())
    } else if !m.is_dir() {
        Err("is not a folder".into())
    } else if m.uid() != me {
        Err(format!(
            "belongs to user {}, not this user ({me}); set CUDA_DEVICE_MEMORY_SHARED_CACHE to a path of yours",
            m.uid()
        ))
    } else if m.mode() & 0o777 != 0o700 {
        Err(format!(
            "has mode {:o}, not 700; other users could reach the ledgers",
            m.mode() & 0o7777
        ))
    } else {
        Ok(())
    }
}

fn owned_by_us_or_root(symlink: bool, uid: u32) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if symlink {
        Err("is a symbolic link, which is not followed".into())
    } else if uid != 0 && uid != me {
        Err(format!(
            "belongs to user {uid}, neither this user ({me}) nor root"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn the_per_user_folder_is_made_private_and_checked() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("vgpu-me");
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "made 0700");
        private_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(e.contains("mode 755"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(private_dir(&link).unwrap_err().contains("symbolic link"));
        let file = base.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(private_dir(&file).unwrap_err().contains("not a folder"));
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = base.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), None).unwrap();
            assert!(private_dir(&theirs)
                .unwrap_err()
                .contains("belongs to user 65534"));
        }
    }

    #[test]
    fn only_this_user_or_root_and_nobody_else_writing() {
        use std::os::unix::fs::PermissionsExt;
        assert!(owned_by_us_or_root(false, 0).is_ok());
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(owned_by_us_or_root(false, me).is_ok());
        let other = if me == 65534 { 65533 } else { 65534 };
        assert!(owned_by_us_or_root(false, other).is_err());
        assert!(owned_by_us_or_root(true, me).is_err());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        assert!(trusted(&f, true).is_ok(), "missing, to be created");
        assert!(trusted(&f, false).is_err());
        std::fs::write(&f, "").unwrap();
        for (m, ok) in [(0o600, true), (0o644, true), (0o620, false), (0o666, false)] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
            assert_eq!(trusted(&f, false).is_ok(), ok, "{m:o}");
        }
    }
}
