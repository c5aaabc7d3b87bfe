//! Replacing a file atomically, for every writer in vgpu: temporary file in the same folder, then rename.
//! Not here: what is written, or where (the callers: the limits file, the shim, vgpuctl, provisioning).
//!
//! A reader sees the old file or the whole new one, never a part.
//!
//! The callers differ only in what they ask for ([`WriteOptions`]): the limits file is written with a fixed
//! mode and synced; the shim's `config.json` keeps its mode and is not synced (a bundle does not outlive a
//! crash, and an fsync there cost milliseconds per container start); vgpuctl's engine configs keep their
//! mode and owner, are synced with their folder, and may create missing parent folders.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// What [`write_atomic`] does besides writing and renaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Permission bits of the new file; with `keep_mode`, only when no file is there yet.
    pub mode: u32,
    /// An existing file keeps its permission bits.
    pub keep_mode: bool,
    /// An existing file keeps its owner and group.
    pub keep_owner: bool,
    /// fsync the file before the rename and its folder after, so the new content survives a crash.
    pub durable: bool,
    /// Create missing parent folders.
    pub create_parents: bool,
}

impl WriteOptions {
    /// Mode `mode` whatever was there; not synced, no folder created.
    pub const fn with_mode(mode: u32) -> Self {
        WriteOptions {
            mode,
            keep_mode: false,
            keep_owner: false,
            durable: false,
            create_parents: false,
        }
    }

    /// An existing file keeps its mode; a new one gets `mode`.
    pub const fn keep_mode(self) -> Self {
        WriteOptions {
            keep_mode: true,
            ..self
        }
    }

    /// An existing file keeps its owner and group.
    pub const fn keep_owner(self) -> Self {
        WriteOptions {
            keep_owner: true,
            ..self
        }
    }

    /// Synced to disk before (file) and after (folder) the rename.
    pub const fn durable(self) -> Self {
        WriteOptions {
            durable: true,
            ..self
        }
    }

    /// Missing parent folders are created.
    pub const fn create_parents(self) -> Self {
        WriteOptions {
            create_parents: true,
            ..self
        }
    }
}

/// An I/O error with what was being done and to which path in its message (the kind is kept).
fn err(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Replaces (or creates) `path` with `bytes` atomically; see [`WriteOptions`]. Errors name the path.
pub fn write_atomic(path: &Path, bytes: &[u8], opts: WriteOptions) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    if opts.create_parents {
        fs::create_dir_all(dir)
            .map_err(|e| err(e, format_args!("cannot create folder {}", dir.display())))?;
    }
    let existing = if opts.keep_mode || opts.keep_owner {
        match fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e, format_args!("cannot stat {}", path.display()))),
        }
    } else {
        None
    };
    let mode = match &existing {
        Some(m) if opts.keep_mode => m.permissions().mode() & 0o7777,
        _ => opts.mode,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".vgpu-tmp")
        .tempfile_in(dir)
        .map_err(|e| {
            err(
                e,
                format_args!("cannot create a temporary file in {}", dir.display()),
            )
        })?;
    tmp.write_all(bytes)
        .map_err(|e| err(e, format_args!("cannot write {}", tmp.path().display())))?;
    if let (Some(m), true) = (&existing, opts.keep_owner) {
        std::os::unix::fs::fchown(tmp.as_file(), Some(m.uid()), Some(m.gid())).map_err(|e| {
            err(
                e,
                format_args!(
                    "cannot give {} the owner of {}",
                    tmp.path().display(),
                    path.display()
                ),
            )
        })?;
    }
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| {
            err(
                e,
                format_args!("cannot set the mode of {}", tmp.path().display()),
            )
        })?;
    if opts.durable {
        tmp.as_file()
            .sync_all()
            .map_err(|e| err(e, format_args!("cannot sync {}", tmp.path().display())))?;
    }
    tmp.persist(path)
        .map_err(|e| err(e.error, format_args!("cannot replace {}", path.display())))?;
    if opts.durable {
        // The rename is durable only once the folder itself is synced.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn names(d: &Path) -> Vec<String> {
        fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn fixed_mode_replaces_whatever_was_there() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("limits.json");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"new", WriteOptions::with_mode(0o644).durable()).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(mode_of(&p), 0o644);
        assert_eq!(
            names(d.path()),
            vec!["limits.json"],
            "no temporary file left"
        );
    }

    #[test]
    fn keep_mode_keeps_an_existing_files_mode_and_gives_a_new_one_the_default() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        fs::write(&p, "{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"{\"a\":1}", WriteOptions::with_mode(0o644).keep_mode()).unwrap();
        assert_eq!(mode_of(&p), 0o600);
        let q = d.path().join("new.json");
        write_atomic(&q, b"x", WriteOptions::with_mode(0o640).keep_mode()).unwrap();
        assert_eq!(mode_of(&q), 0o640);
    }

    #[test]
    fn missing_folder_is_an_error_naming_it_unless_created() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b/f.toml");
        let e = write_atomic(&p, b"x", WriteOptions::with_mode(0o644)).unwrap_err();
        assert!(
            e.to_string()
                .contains(&d.path().join("a/b").display().to_string()),
            "{e}"
        );
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        write_atomic(&p, b"x", WriteOptions::with_mode(0o644).create_parents()).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "x");
    }

    #[test]
    fn keep_owner_keeps_it() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        fs::write(&p, "x").unwrap();
        let before = fs::metadata(&p).unwrap();
        write_atomic(
            &p,
            b"y",
            WriteOptions::with_mode(0o644).keep_mode().keep_owner(),
        )
        .unwrap();
        let after = fs::metadata(&p).unwrap();
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    }
}
