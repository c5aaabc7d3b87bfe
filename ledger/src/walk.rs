//! The walk over the state root's container folders (`<root>/containers/<id>/`), for every reader of them.
//! Not here: what a reader does with a folder (the garbage collector, `vgpuctl status`), or its paths.
//!
//! Every entry is sorted into one of three kinds: a container's folder (a directory whose name is a valid
//! container id), a leftover of a provision or removal in progress or interrupted (a dot-name: `.tmp-*`,
//! `.rm-*`), or something that is not ours (anything else), which readers report and never touch.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use crate::layout::{check_container_id, StateRoot, LEDGERS_DIR_NAME, LIMITS_FILE_NAME};

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
}

/// One entry of `<root>/containers/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateEntry {
    Container(ContainerDir),
    /// A dot-name: a provision (`.tmp-*`) or removal (`.rm-*`) in progress, or interrupted.
    Leftover(OtherEntry),
    /// Not ours: not a directory, or a name that is not a container id. `why` says which, in a few words.
    Foreign {
        entry: OtherEntry,
        why: String,
    },
}

impl StateRoot {
    /// Every entry of `<root>/containers/`, sorted by name. A missing folder has none (nothing was ever
    /// provisioned); any other error listing it is returned.
    pub fn entries(&self) -> io::Result<Vec<StateEntry>> {
        let dir = self.containers_dir();
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
            let name = os_name.to_string_lossy().into_owned();
            let path = entry.path();
            let meta = entry.metadata().ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let other = OtherEntry {
                name: name.clone(),
                path: path.clone(),
                modified,
            };
            out.push(if name.starts_with('.') {
                StateEntry::Leftover(other)
            } else if !meta.as_ref().is_some_and(|m| m.is_dir()) {
                StateEntry::Foreign {
                    entry: other,
                    why: "not a folder".into(),
                }
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
        for name in ["b", "a", ".tmp-x-123", ".rm-y-1", "a..b"] {
            fs::create_dir_all(c.join(name)).unwrap();
        }
        fs::write(c.join("stray-file"), "x").unwrap();
        let entries = root.entries().unwrap();
        let kinds: Vec<(&str, char)> = entries
            .iter()
            .map(|e| {
                let k = match e {
                    StateEntry::Container(_) => 'c',
                    StateEntry::Leftover(_) => 'l',
                    StateEntry::Foreign { .. } => 'f',
                };
                (e.name(), k)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (".rm-y-1", 'l'),
                (".tmp-x-123", 'l'),
                ("a", 'c'),
                ("a..b", 'f'),
                ("b", 'c'),
                ("stray-file", 'f')
            ]
        );
        match &entries[5] {
            StateEntry::Foreign { why, .. } => assert_eq!(why, "not a folder"),
            e => panic!("{e:?}"),
        }
        let a: Vec<ContainerDir> = root.containers().unwrap().collect();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].id, "a");
        assert_eq!(a[0].dir, c.join("a"));
        assert_eq!(a[0].limits_path, root.limits_path("a").unwrap());
        assert_eq!(a[0].ledgers_dir, root.ledgers_dir("a").unwrap());
        assert!(a[0].modified.is_some());
    }
}
