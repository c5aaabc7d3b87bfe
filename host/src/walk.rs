//! The walk over the state root's container folders (`<root>/containers/<id>/`), for every reader of them.
//! Not here: what a reader does with a folder (the garbage collector, `vgpuctl status`), or its paths.
//!
//! Every entry is sorted into one of three kinds: a container's folder (a directory whose name is a valid
//! container id, holding vgpu's marker), a leftover of a provision or removal in progress or interrupted (a
//! directory with a dot-name: `.tmp-*`, `.rm-*`), or something that is not ours (anything else), which
//! readers report and never touch. `<root>/containers/` itself must hold the marker ([`MARKER_FILE_NAME`]):
//! a state root pointed at someone else's folder is refused as a whole, never walked.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::state_root::{StateRoot, MARKER_CONTENT, MARKER_FILE_NAME};
use vgpu_ledger::layout::{check_container_id, LEDGERS_DIR_NAME, LIMITS_FILE_NAME};

/// A container's state folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDir {
    pub id: String,
    /// `<root>/containers/<id>`
    pub dir: PathBuf,
    /// `<root>/containers/<id>/limits.json`
    pub limits_path: PathBuf,
    /// `<root>/containers/<id>/ledgers`
    pub ledgers_dir: PathBuf,
    /// Last modification of the folder (not following links), when it could be read.
    pub modified: Option<SystemTime>,
}

/// Another entry of `<root>/containers/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherEntry {
    /// The name, lossily converted to UTF-8.
    pub name: String,
    pub path: PathBuf,
    pub modified: Option<SystemTime>,
    /// A folder holding vgpu's marker (made by vgpu).
    pub marked: bool,
}

/// True when `dir` is a folder (not a link to one) holding vgpu's marker: a regular file (not a link)
/// named [`MARKER_FILE_NAME`].
pub fn is_marked(dir: &Path) -> bool {
    fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
        && fs::symlink_metadata(dir.join(MARKER_FILE_NAME)).is_ok_and(|m| m.file_type().is_file())
}

/// Writes vgpu's marker into `dir` (a folder vgpu has just made, or adopts empty), mode 0644.
pub fn mark(dir: &Path) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .mode(0o644)
        .open(dir.join(MARKER_FILE_NAME))?;
    f.write_all(MARKER_CONTENT.as_bytes())
}

/// One entry of `<root>/containers/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateEntry {
    Container(ContainerDir),
    /// A folder with a dot-name: a provision (`.tmp-*`) or removal (`.rm-*`) in progress, or interrupted
    /// (marked, unless it was interrupted before vgpu wrote the marker: then it is empty).
    Leftover(OtherEntry),
    /// Not ours: not a directory, a name that is not a container id, or a folder without vgpu's marker.
    /// `why` says which, in a few words.
    Foreign {
        entry: OtherEntry,
        why: String,
    },
}

/// Why `<root>/containers/` cannot be made ready for a new container ([`StateRoot::prepare_containers`]).
/// `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A file system operation failed; `what` says which ("cannot create /x").
    #[error("{what}: {err}")]
    Io { what: String, err: io::Error },
    /// `<root>/containers/` holds something and no marker.
    #[error("{}", not_ours_message(dir))]
    NotOurs { dir: PathBuf },
}

impl StateRoot {
    /// `<root>/containers/`, made (and marked) if missing, adopted (marked) if empty; one that holds
    /// anything but no marker is someone else's folder and is refused. Provisioning and admission call it
    /// before they write anything under the state root.
    pub fn prepare_containers(&self) -> Result<PathBuf, PrepareError> {
        let io = |what: String, err| PrepareError::Io { what, err };
        let containers = self.containers_dir();
        for d in [self.root(), containers.as_path()] {
            match fs::DirBuilder::new().mode(0o711).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("cannot create {}", d.display()), e)),
            }
        }
        if !is_marked(&containers) {
            let empty = fs::read_dir(&containers)
                .map_err(|e| io(format!("cannot list {}", containers.display()), e))?
                .next()
                .is_none();
            // Asked again: another provision may have marked it and put its folder in since.
            if !empty && !is_marked(&containers) {
                return Err(PrepareError::NotOurs { dir: containers });
            }
            mark(&containers).map_err(|e| {
                io(
                    format!("cannot write the marker in {}", containers.display()),
                    e,
                )
            })?;
        }
        Ok(containers)
    }

    /// Every entry of `<root>/containers/` but the marker, sorted by name. A missing folder has none
    /// (nothing was ever provisioned), and so has an empty one; one that holds anything but no marker is not
    /// vgpu's (the state root names someone else's folder): an error, and nothing in it is looked at. Any
    /// other error listing it is returned.
    pub fn entries(&self) -> io::Result<Vec<StateEntry>> {
        let dir = self.containers_dir();
        if !is_marked(&dir) && fs::read_dir(&dir).is_ok_and(|mut l| l.next().is_some()) {
            return Err(io::Error::other(not_ours_message(&dir)));
        }
        let list = match fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot list {}: {e}", dir.display()),
                ))
            }
        };
        let mut out = Vec::new();
        for entry in list {
            let entry = entry.map_err(|e| {
                io::Error::new(e.kind(), format!("cannot list {}: {e}", dir.display()))
            })?;
            let os_name = entry.file_name();
            if os_name == MARKER_FILE_NAME {
                continue;
            }
            let name = os_name.to_string_lossy().into_owned();
            let path = entry.path();
            // Not following links: a link to a folder is not a folder here.
            let meta = entry.metadata().ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let is_dir = meta.as_ref().is_some_and(|m| m.is_dir());
            let other = OtherEntry {
                name: name.clone(),
                marked: is_dir && is_marked(&path),
                path: path.clone(),
                modified,
            };
            out.push(if !is_dir {
                StateEntry::Foreign {
                    entry: other,
                    why: "not a folder".into(),
                }
            } else if name.starts_with('.') {
                StateEntry::Leftover(other)
            } else if os_name.to_str().is_none() {
                StateEntry::Foreign {
                    entry: other,
                    why: "name is not UTF-8".into(),
                }
            } else if let Err(e) = check_container_id(&name) {
                StateEntry::Foreign {
                    entry: other,
                    why: e.to_string(),
                }
            } else if !other.marked {
                StateEntry::Foreign {
                    entry: other,
                    why: format!("holds no vgpu marker ({MARKER_FILE_NAME}): not made by vgpu"),
                }
            } else {
                StateEntry::Container(ContainerDir {
                    limits_path: path.join(LIMITS_FILE_NAME),
                    ledgers_dir: path.join(LEDGERS_DIR_NAME),
                    dir: path,
                    id: name,
                    modified,
                })
            });
        }
        out.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(out)
    }

    /// The container folders alone, sorted by id (leftovers and entries not ours skipped).
    pub fn containers(&self) -> io::Result<impl Iterator<Item = ContainerDir>> {
        Ok(self.entries()?.into_iter().filter_map(|e| match e {
            StateEntry::Container(c) => Some(c),
            _ => None,
        }))
    }
}

/// Why `<root>/containers/` (`dir`) is not looked at: one line.
pub fn not_ours_message(dir: &Path) -> String {
    format!(
        "{} is not vgpu's (not empty, and no {MARKER_FILE_NAME} marker in it): nothing in it is touched; \
         check state_root in the vgpu config",
        dir.display()
    )
}

impl StateEntry {
    /// The entry's file name.
    pub fn name(&self) -> &str {
        match self {
            StateEntry::Container(c) => &c.id,
            StateEntry::Leftover(o) | StateEntry::Foreign { entry: o, .. } => &o.name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_entries_into_containers_leftovers_and_foreign() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        assert!(
            root.entries().unwrap().is_empty(),
            "a missing containers folder has no entries"
        );
        let c = root.containers_dir();
        fs::create_dir_all(&c).unwrap();
        assert!(root.entries().unwrap().is_empty(), "nor has an empty one");
        mark(&c).unwrap();
        for name in ["b", "a", ".tmp-x-123", ".rm-y-1", "a..b", "unmarked"] {
            fs::create_dir_all(c.join(name)).unwrap();
        }
        for name in ["b", "a", ".rm-y-1", "a..b"] {
            mark(&c.join(name)).unwrap();
        }
        fs::write(c.join("stray-file"), "x").unwrap();
        fs::write(c.join(".stray-dot-file"), "x").unwrap();
        std::os::unix::fs::symlink(c.join("a"), c.join("link-to-a")).unwrap();
        let entries = root.entries().unwrap();
        let kinds: Vec<(&str, char)> = entries
            .iter()
            .map(|e| {
                let k = match e {
                    StateEntry::Container(_) => 'c',
                    StateEntry::Leftover(o) if o.marked => 'L',
                    StateEntry::Leftover(_) => 'l',
                    StateEntry::Foreign { .. } => 'f',
                };
                (e.name(), k)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (".rm-y-1", 'L'),
                (".stray-dot-file", 'f'),
                (".tmp-x-123", 'l'),
                ("a", 'c'),
                ("a..b", 'f'),
                ("b", 'c'),
                ("link-to-a", 'f'),
                ("stray-file", 'f'),
                ("unmarked", 'f'),
            ]
        );
        let why = |name: &str| match entries.iter().find(|e| e.name() == name) {
            Some(StateEntry::Foreign { why, .. }) => why.clone(),
            e => panic!("{e:?}"),
        };
        assert_eq!(why("stray-file"), "not a folder");
        assert_eq!(why("link-to-a"), "not a folder");
        assert_eq!(
            why("unmarked"),
            "holds no vgpu marker (.vgpu-state): not made by vgpu"
        );
        let a: Vec<ContainerDir> = root.containers().unwrap().collect();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].id, "a");
        assert_eq!(a[0].dir, c.join("a"));
        assert_eq!(a[0].limits_path, root.limits_path("a").unwrap());
        assert_eq!(a[0].ledgers_dir, root.ledgers_dir("a").unwrap());
        assert!(a[0].modified.is_some());
    }

    #[test]
    fn a_containers_folder_without_the_marker_is_not_walked() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        // Someone else's /var/lib: containers/storage is Podman's.
        fs::create_dir_all(root.containers_dir().join("storage")).unwrap();
        let e = root.entries().unwrap_err().to_string();
        assert!(
            e.contains("is not vgpu's") && e.contains(".vgpu-state"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // A marker that is a link (to a file elsewhere) does not count.
        fs::write(d.path().join("elsewhere"), "x").unwrap();
        std::os::unix::fs::symlink(
            d.path().join("elsewhere"),
            root.containers_dir().join(MARKER_FILE_NAME),
        )
        .unwrap();
        assert!(root.entries().is_err());
    }
}
