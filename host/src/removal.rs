//! Removing a container's state folder, only one vgpu made (its marker, `crate::state_root::MARKER_FILE_NAME`):
//! renamed aside first (`.rm-<name>-<pid>`) so no reader sees it half-deleted, then emptied (links removed,
//! never followed; the marker last) and removed, so an interrupted removal leaves a folder still marked, or
//! an empty one. Used by the hook's poststop and a failed create (`vgpu_oci::provision`), the garbage
//! collector (`gc`) and the removal of abandoned state (`abandoned`). Not here: making the folder
//! (`vgpu_oci::provision`), which folders are garbage (`gc`, `abandoned`).

use crate::state_root::StateRoot;
use crate::state_root::MARKER_FILE_NAME;
use crate::walk;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use vgpu_ledger::layout::LayoutError;

/// Why a state folder was not removed. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// A container id that is no safe file name.
    #[error(transparent)]
    Name(#[from] LayoutError),
    /// A folder to remove that vgpu did not make.
    #[error("{} was not made by vgpu (no {MARKER_FILE_NAME} marker in it): left alone", dir.display())]
    Unmarked { dir: PathBuf },
    /// A file system operation failed; `what` says which ("cannot remove /x").
    #[error("{what}: {err}")]
    Io { what: String, err: io::Error },
    /// A path without a parent or a name, where a state folder was expected.
    #[error("{} has no {what}", path.display())]
    NotAFolderPath { path: PathBuf, what: &'static str },
}

type Result<T, E = RemoveError> = std::result::Result<T, E>;

fn io_error(what: String, err: io::Error) -> RemoveError {
    RemoveError::Io { what, err }
}

/// Removes the container's state; a missing folder is fine (poststop twice, or without a prestart).
pub fn remove(root: &StateRoot, id: &str) -> Result<bool> {
    let dir = root.container_dir(id)?;
    remove_dir(&dir)
}

/// Where a folder is renamed to before it is deleted: `.rm-<name>-<pid>` beside it.
pub fn aside_path(dir: &Path) -> Result<PathBuf> {
    let missing = |what| RemoveError::NotAFolderPath {
        path: dir.to_path_buf(),
        what,
    };
    let parent = dir.parent().ok_or_else(|| missing("parent"))?;
    let name = dir
        .file_name()
        .ok_or_else(|| missing("name"))?
        .to_string_lossy();
    Ok(parent.join(format!(".rm-{name}-{}", std::process::id())))
}

/// Removes a state folder: renamed aside first so no reader sees it half-deleted. A folder vgpu did not
/// make (no marker) is an error and is left alone.
pub fn remove_dir(dir: &Path) -> Result<bool> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(format!("cannot remove {}", dir.display()), e)),
        Ok(_) if !walk::is_marked(dir) => {
            return Err(RemoveError::Unmarked {
                dir: dir.to_path_buf(),
            })
        }
        Ok(_) => {}
    }
    let aside = aside_path(dir)?;
    match fs::rename(dir, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(format!("cannot remove {}", dir.display()), e)),
    }
    remove_marked(&aside)?;
    Ok(true)
}

/// Deletes a folder vgpu made: everything in it but the marker (links unfollowed), then the marker, then the
/// folder, so that an interrupted removal leaves a folder still marked, or an empty one.
pub fn remove_marked(dir: &Path) -> Result<()> {
    let cannot = |e| io_error(format!("cannot remove {}", dir.display()), e);
    for entry in fs::read_dir(dir).map_err(cannot)? {
        let entry = entry.map_err(cannot)?;
        if entry.file_name() == MARKER_FILE_NAME {
            continue;
        }
        let p = entry.path();
        if entry.file_type().map_err(cannot)?.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        }
        .map_err(|e| io_error(format!("cannot remove {}", p.display()), e))?;
    }
    match fs::remove_file(dir.join(MARKER_FILE_NAME)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(cannot(e)),
        _ => {}
    }
    fs::remove_dir(dir).map_err(cannot)
}
