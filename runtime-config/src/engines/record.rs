//! vgpuctl's own record of what `runtime configure` changed that the engine's file cannot say by itself: the
//! default runtime that `--set-as-default` replaced, the containerd drop-in it wrote and the `imports` entry it
//! added for it, the folders it created (for a drop-in, for Podman's hooks). One JSON file, `/var/lib/vgpu/engines.json` (`VGPUCTL_STATE_DIR` moves the folder, for tests),
//! an entry per engine and config file, written atomically; `unconfigure` reads its entry, restores, and
//! removes it (and the file with its last entry).
//!
//! Older vgpuctl kept the replaced default in the engine's own files (a TOML comment on containerd's
//! `default_runtime_name` line, a hidden `.daemon.json.vgpuctl-previous-default` beside Docker's file); the
//! engine modules still read those (`legacy`), so configs made by older versions unconfigure as before.
//!
//! A configure or unconfigure holds [`lock`] from reading the files to writing them, so runs at once (an
//! installer per engine, config management beside the DaemonSet) never lose each other's entries.
use super::change::Change;
use super::error::{EngineError, Result};
use super::files::Files;
use super::syntax::parse_error;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const DEFAULT_DIR: &str = "/var/lib/vgpu";
/// Moves the record's folder (tests, and hosts where /var/lib is read-only).
pub const DIR_ENV: &str = "VGPUCTL_STATE_DIR";
pub const FILE_NAME: &str = "engines.json";
const VERSION: u32 = 1;

/// Where the record lives: `$VGPUCTL_STATE_DIR/engines.json`, else `/var/lib/vgpu/engines.json`.
pub fn default_path() -> PathBuf {
    let dir = std::env::var_os(DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    dir.join(FILE_NAME)
}

/// The default runtime `--set-as-default` replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousDefault {
    /// The runtime's name; None when no default was set (unconfigure then removes the key).
    pub name: Option<String>,
    /// containerd: the value exactly as it was written (its TOML text and the whitespace and comment around
    /// it), so unconfigure gives the line back byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toml: Option<[String; 3]>,
}

/// An `imports` entry vgpuctl added to containerd's main file for its drop-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportAdded {
    /// The entry as written.
    pub entry: String,
    /// The `imports` key itself was created (unconfigure removes it once empty).
    pub created_key: bool,
}

/// What configure changed in one engine's config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub engine: String,
    /// The engine's main config file, absolute.
    pub config: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_default: Option<PreviousDefault>,
    /// containerd `--drop-in`: the file vgpuctl wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_in: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_added: Option<ImportAdded>,
    /// containerd `--drop-in`: the topmost folder configure created for the drop-in (unconfigure removes
    /// the folders from the drop-in's up to this one, each if empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_in_dirs_created: Option<PathBuf>,
    /// Podman: the topmost folder configure created for the hooks folder (`config` is the hooks folder);
    /// unconfigure removes the folders from the hooks folder up to this one, each if empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks_dirs_created: Option<PathBuf>,
    /// Docker: configure created `config` (there was no daemon.json); unconfigure removes it again when
    /// nothing but vgpu's entry was ever in it, rather than leave a `{}` where there was no file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created_config: bool,
}

impl Entry {
    pub fn new(engine: &str, config: &Path) -> Self {
        Entry {
            engine: engine.to_string(),
            config: absolute(config),
            previous_default: None,
            drop_in: None,
            import_added: None,
            drop_in_dirs_created: None,
            hooks_dirs_created: None,
            created_config: false,
        }
    }
    /// Whether it says anything (an entry that does not is not kept).
    pub fn is_empty(&self) -> bool {
        self.previous_default.is_none()
            && self.drop_in.is_none()
            && self.import_added.is_none()
            && self.drop_in_dirs_created.is_none()
            && self.hooks_dirs_created.is_none()
            && !self.created_config
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Records {
    version: u32,
    engines: Vec<Entry>,
}

/// `p` made absolute (lexically: `.` and `..` resolved, symlinks not followed), the key entries go by.
pub fn absolute(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn parse(path: &Path, text: &str) -> Result<Records> {
    if text.trim().is_empty() {
        return Ok(Records {
            version: VERSION,
            engines: vec![],
        });
    }
    let r: Records = serde_json::from_str(text).map_err(|e| {
        parse_error(
            path,
            e.line(),
            e.column(),
            &format!("{e} (vgpuctl's record of engine changes)"),
        )
    })?;
    if r.version != VERSION {
        return Err(EngineError::RecordVersion {
            path: path.to_path_buf(),
            version: r.version,
            known: VERSION,
        });
    }
    Ok(r)
}

/// The entry for `engine` and `config` in the record's text (None: no record, or nothing for them).
pub fn find(path: &Path, text: Option<&str>, engine: &str, config: &Path) -> Result<Option<Entry>> {
    let Some(text) = text else { return Ok(None) };
    let key = Entry::new(engine, config);
    Ok(parse(path, text)?
        .engines
        .into_iter()
        .find(|e| e.engine == key.engine && e.config == key.config))
}

/// The change that makes the record hold `new` for `engine` and `config` (None, or an empty entry: forget
/// them), or None when it already does. The file goes when its last entry does.
pub fn change(
    path: &Path,
    text: Option<&str>,
    engine: &str,
    config: &Path,
    new: Option<Entry>,
) -> Result<Option<Change>> {
    let mut r = match text {
        Some(t) => parse(path, t)?,
        None => Records {
            version: VERSION,
            engines: vec![],
        },
    };
    let key = Entry::new(engine, config);
    let new = new.filter(|e| !e.is_empty());
    let at = r
        .engines
        .iter()
        .position(|e| e.engine == key.engine && e.config == key.config);
    let summary = match (&new, at) {
        (None, None) => return Ok(None),
        (Some(n), Some(i)) if &r.engines[i] == n => return Ok(None),
        (Some(n), _) => serde_json::to_string(n).expect("an entry serializes"),
        (None, Some(_)) => format!("forget {} {}", key.engine, key.config.display()),
    };
    match (new, at) {
        (Some(n), Some(i)) => r.engines[i] = n,
        (Some(n), None) => r.engines.push(n),
        (None, Some(i)) => {
            r.engines.remove(i);
        }
        (None, None) => unreachable!("returned above"),
    }
    if r.engines.is_empty() {
        return Ok(Some(Change {
            record: Some(summary),
            ..Change::remove(path.to_path_buf())
        }));
    }
    let text = serde_json::to_string_pretty(&r).expect("records serialize") + "\n";
    Ok(Some(Change::record(path.to_path_buf(), text, summary)))
}

/// The record at `path` as read through `files`, and its entry for `engine` and `config`.
pub fn read_entry(
    files: &dyn Files,
    path: &Path,
    engine: &str,
    config: &Path,
) -> Result<(Option<String>, Option<Entry>)> {
    let text = files.read(path)?;
    let entry = find(path, text.as_deref(), engine, config)?;
    Ok((text, entry))
}

/// An exclusive `flock` on the record's folder, held until dropped. The folder (and any parent missing) is
/// created for it if need be, and what this run created is removed again on drop if left empty.
pub struct Lock {
    _held: Flock<File>,
    /// The folders this run created, deepest first.
    created: Vec<PathBuf>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        for d in &self.created {
            // Fails, as it should, when a record was written into it.
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
    }
}

/// Waits for the lock on the folder of the record at `record`. The folder is vgpuctl's and goes with its
/// last file, possibly while another run waits on it: the lock is taken again until it is on the folder
/// that is at the path.
pub fn lock(record: &Path) -> Result<Lock> {
    let dir = absolute(record)
        .parent()
        .map(Path::to_path_buf)
        .ok_or(EngineError::RecordFolderless)?;
    loop {
        let created: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| !d.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(&dir).map_err(|err| EngineError::RecordDir {
            dir: dir.clone(),
            env: DIR_ENV,
            err,
        })?;
        let f = File::open(&dir).map_err(|err| EngineError::OpenFolder {
            dir: dir.clone(),
            err,
        })?;
        let held =
            Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, err)| EngineError::Lock {
                dir: dir.clone(),
                err,
            })?;
        let same = match (held.metadata(), std::fs::metadata(&dir)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if same {
            return Ok(Lock {
                _held: held,
                created,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Regression (installer e2e): the lock made /var/lib/vgpu on a node without /var/lib and removed only
    // vgpu/, leaving /var/lib behind on a node it was to leave as it found it.
    #[test]
    fn the_lock_leaves_no_folder_it_made_and_keeps_one_with_a_record() {
        let t = tempfile::tempdir().unwrap();
        let rec = t.path().join("var/lib/vgpu").join(FILE_NAME);
        drop(lock(&rec).unwrap());
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            0,
            "var/lib/vgpu made and removed"
        );
        let l = lock(&rec).unwrap();
        // A second lock on the same folder waits: flock conflicts between open files of one process too.
        let again = File::open(rec.parent().unwrap()).unwrap();
        assert!(Flock::lock(again, FlockArg::LockExclusiveNonblock).is_err());
        std::fs::write(&rec, "{}").unwrap();
        drop(l);
        assert!(rec.exists(), "a folder holding a record stays");
        // Taken again once free.
        drop(lock(&rec).unwrap());
    }

    const R: &str = "/var/lib/vgpu/engines.json";

    fn entry(engine: &str, config: &str, prev: Option<&str>) -> Entry {
        Entry {
            previous_default: Some(PreviousDefault {
                name: prev.map(str::to_string),
                toml: None,
            }),
            ..Entry::new(engine, Path::new(config))
        }
    }

    fn apply(text: Option<&str>, c: Option<Change>) -> Option<String> {
        match c {
            None => text.map(str::to_string),
            Some(c) => c.contents,
        }
    }

    #[test]
    fn entries_per_engine_and_config_and_the_file_goes_with_the_last() {
        let p = Path::new(R);
        let d = "/etc/docker/daemon.json";
        let c = "/etc/containerd/config.toml";
        let t1 = apply(
            None,
            change(
                p,
                None,
                "docker",
                Path::new(d),
                Some(entry("docker", d, Some("crun"))),
            )
            .unwrap(),
        );
        let t2 = apply(
            t1.as_deref(),
            change(
                p,
                t1.as_deref(),
                "containerd",
                Path::new(c),
                Some(entry("containerd", c, None)),
            )
            .unwrap(),
        );
        let got = find(p, t2.as_deref(), "docker", Path::new(d))
            .unwrap()
            .unwrap();
        assert_eq!(got.previous_default.unwrap().name.as_deref(), Some("crun"));
        let got = find(p, t2.as_deref(), "containerd", Path::new(c))
            .unwrap()
            .unwrap();
        assert_eq!(got.previous_default.unwrap().name, None);
        assert!(find(p, t2.as_deref(), "docker", Path::new("/other.json"))
            .unwrap()
            .is_none());
        // The same entry again: no change.
        assert!(change(
            p,
            t2.as_deref(),
            "docker",
            Path::new(d),
            Some(entry("docker", d, Some("crun")))
        )
        .unwrap()
        .is_none());
        let t3 = apply(
            t2.as_deref(),
            change(p, t2.as_deref(), "docker", Path::new(d), None).unwrap(),
        );
        assert!(find(p, t3.as_deref(), "docker", Path::new(d))
            .unwrap()
            .is_none());
        assert!(find(p, t3.as_deref(), "containerd", Path::new(c))
            .unwrap()
            .is_some());
        let last = change(p, t3.as_deref(), "containerd", Path::new(c), None)
            .unwrap()
            .unwrap();
        assert_eq!(last.contents, None, "the file goes with its last entry");
        assert!(last.record.is_some());
        // Forgetting what is not there changes nothing.
        assert!(change(p, None, "docker", Path::new(d), None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn configs_are_keyed_by_their_absolute_path() {
        let p = Path::new(R);
        let cwd = std::env::current_dir().unwrap();
        let t = apply(
            None,
            change(
                p,
                None,
                "docker",
                Path::new("x/../daemon.json"),
                Some(entry("docker", "daemon.json", Some("runc"))),
            )
            .unwrap(),
        );
        let got = find(p, t.as_deref(), "docker", &cwd.join("daemon.json"))
            .unwrap()
            .unwrap();
        assert_eq!(got.config, cwd.join("daemon.json"));
    }

    #[test]
    fn a_bad_record_is_one_line_naming_it() {
        let e = find(
            Path::new(R),
            Some("{\"version\": 1,\n oops}"),
            "docker",
            Path::new("/d"),
        )
        .unwrap_err();
        assert!(matches!(e, EngineError::Syntax { line: 2, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.starts_with("/var/lib/vgpu/engines.json:2:"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        let e = find(
            Path::new(R),
            Some("{\"version\": 7, \"engines\": []}"),
            "docker",
            Path::new("/d"),
        )
        .unwrap_err();
        assert!(
            matches!(e, EngineError::RecordVersion { version: 7, .. }),
            "{e}"
        );
    }

    // Issue 26 item 7 (version skew): a record a newer vgpuctl of the same version wrote with fields this
    // one does not know, at the top and in an entry, is read for what it knows (its undo still happens).
    #[test]
    fn a_newer_minors_unknown_fields_are_ignored() {
        let text = r#"{"version": 1, "written_by": "vgpuctl 9.9", "engines": [
            {"engine": "docker", "config": "/etc/docker/daemon.json",
             "previous_default": {"name": "runc", "since": "2027"}, "cdi_spec": "/etc/cdi/x.yaml"}]}"#;
        let got = find(
            Path::new(R),
            Some(text),
            "docker",
            Path::new("/etc/docker/daemon.json"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            got,
            entry("docker", "/etc/docker/daemon.json", Some("runc"))
        );
    }
}
