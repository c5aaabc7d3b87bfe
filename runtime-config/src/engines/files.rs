//! The one seam between the engine modules and the machine: everything an engine reads (its config files,
//! the folders and globs it looks through, containerd's `--version`) goes through [`Files`]. [`Disk`] is
//! the real filesystem; tests use `MemFiles`, a map of paths to texts. Writing is not here: engines
//! return [`Change`] lists, and the CLI applies them (`change::apply`).
use super::error::{EngineError, Result};
use std::path::{Path, PathBuf};

/// What an engine module may read.
pub trait Files {
    /// The file's text; None when it does not exist.
    fn read(&self, path: &Path) -> Result<Option<String>>;
    /// The existing paths matching `pattern` (absolute), in name order, as Go's `filepath.Glob` (which
    /// containerd's `resolveImports` uses) finds them.
    fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>>;
    /// Whether `path` is a folder.
    fn is_dir(&self, path: &Path) -> bool;
    /// The files (and links) in the folder `dir`, in name order; none when it does not exist.
    fn list(&self, dir: &Path) -> Result<Vec<PathBuf>>;
    /// The stdout of `program --version`; None when it cannot be run.
    fn version_output(&self, program: &str) -> Option<String>;
    /// Whether `path` is a file someone may run (a mode with an execute bit).
    fn is_executable(&self, path: &Path) -> bool;
}

/// Glob matching as Go's `filepath.Glob`: `*` does not cross `/`, and matches a leading dot.
pub const GLOB: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

/// Whether `path` matches the glob `pattern` (Go's rules, [`GLOB`]).
pub fn glob_matches(pattern: &Path, path: &Path) -> Result<bool> {
    let p =
        glob::Pattern::new(&pattern.to_string_lossy()).map_err(|err| EngineError::BadPattern {
            pattern: pattern.display().to_string(),
            err,
        })?;
    Ok(p.matches_path_with(path, GLOB))
}

/// The real filesystem (and process table, for `--version`).
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> Result<Option<String>> {
        Ok(crate::fsutil::read_optional(path)?)
    }
    fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>> {
        let text = pattern.to_string_lossy();
        let mut out: Vec<PathBuf> = glob::glob_with(&text, GLOB)
            .map_err(|err| EngineError::BadPattern {
                pattern: text.to_string(),
                err,
            })?
            .filter_map(|p| p.ok())
            .collect();
        out.sort();
        Ok(out)
    }
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn is_executable(&self, path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    fn list(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut names = match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
                .map(|e| e.path())
                .collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
            Err(err) => {
                return Err(EngineError::List {
                    dir: dir.to_path_buf(),
                    err,
                })
            }
        };
        names.sort();
        Ok(names)
    }
    fn version_output(&self, program: &str) -> Option<String> {
        let out = std::process::Command::new(program)
            .arg("--version")
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Files on a pretend disk, for unit tests: a folder exists while a file is in it.
#[cfg(test)]
#[derive(Default, Clone, Debug)]
pub struct MemFiles {
    pub files: std::collections::BTreeMap<PathBuf, String>,
    /// `program` → what `program --version` prints; a program not here cannot be run.
    pub versions: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
impl MemFiles {
    pub fn with(files: &[(&str, &str)]) -> Self {
        MemFiles {
            files: files
                .iter()
                .map(|(p, t)| (PathBuf::from(p), t.to_string()))
                .collect(),
            versions: Default::default(),
        }
    }
    pub fn get(&self, p: &str) -> Option<&str> {
        self.files.get(Path::new(p)).map(String::as_str)
    }
    /// Applies changes (writes and removals) to the pretend disk.
    pub fn apply(&mut self, changes: &[super::change::Change]) {
        for c in changes {
            match &c.contents {
                Some(t) => {
                    self.files.insert(c.path.clone(), t.clone());
                }
                None if c.dir => {
                    assert!(!self.is_dir(&c.path), "a folder with files is kept");
                }
                None => {
                    self.files.remove(&c.path);
                }
            }
        }
    }
}

#[cfg(test)]
impl Files for MemFiles {
    fn read(&self, path: &Path) -> Result<Option<String>> {
        Ok(self.files.get(path).cloned())
    }
    fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for p in self.files.keys() {
            if glob_matches(pattern, p)? {
                out.push(p.clone());
            }
        }
        Ok(out)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.files.keys().any(|k| k != path && k.starts_with(path))
    }
    fn list(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        Ok(self
            .files
            .keys()
            .filter(|k| k.parent() == Some(dir))
            .cloned()
            .collect())
    }
    fn version_output(&self, program: &str) -> Option<String> {
        self.versions.get(program).cloned()
    }
    /// Every file of the map runs.
    fn is_executable(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real disk and the fake answer alike: a missing file is None, a folder's files come by name.
    #[test]
    fn disk_and_fake_agree() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("b.toml"), "b").unwrap();
        std::fs::write(d.join("a.toml"), "a").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        let mem = MemFiles::with(&[
            (d.join("b.toml").to_str().unwrap(), "b"),
            (d.join("a.toml").to_str().unwrap(), "a"),
            (d.join("sub/x").to_str().unwrap(), "x"),
        ]);
        for f in [&Disk as &dyn Files, &mem] {
            assert_eq!(f.read(&d.join("a.toml")).unwrap().as_deref(), Some("a"));
            assert_eq!(f.read(&d.join("none")).unwrap(), None);
            assert_eq!(
                f.glob(&d.join("*.toml")).unwrap(),
                [d.join("a.toml"), d.join("b.toml")]
            );
            assert!(f.is_dir(&d.join("sub")) && !f.is_dir(&d.join("a.toml")));
            assert_eq!(f.list(d).unwrap(), [d.join("a.toml"), d.join("b.toml")]);
            assert!(f.list(&d.join("missing")).unwrap().is_empty());
        }
        assert_eq!(Disk.version_output("/nonexistent/containerd"), None);
    }

    #[test]
    fn globs_match_as_go_does() {
        let m = |p: &str, x: &str| glob_matches(Path::new(p), Path::new(x)).unwrap();
        assert!(m("/etc/c/conf.d/*.toml", "/etc/c/conf.d/.hidden.toml"));
        assert!(!m("/etc/c/*.toml", "/etc/c/conf.d/a.toml"));
    }
}
