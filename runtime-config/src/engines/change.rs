//! What configure and unconfigure return: a list of file changes. The engine modules only compute them;
//! [`apply`] writes them (atomically, through `fsutil`) and [`preview`] prints them for `--dry-run`.
use super::error::Result;
use crate::fsutil;
use std::path::PathBuf;

/// One file to write (`contents: Some`) or remove (`None`), or (`dir`) a folder to remove if it is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: PathBuf,
    pub contents: Option<String>,
    pub mode: u32,
    /// A file of vgpu's own — vgpuctl's record (`record`), vgpu's config (`lower`) — not an engine's
    /// config, with what changes in it in one line: `--dry-run` notes that on stderr instead of printing
    /// the file with the configs on stdout.
    pub record: Option<String>,
    /// A folder configure created, removed when empty (a file of someone else's in it keeps it).
    pub dir: bool,
}

impl Change {
    pub fn write(path: PathBuf, contents: String, mode: u32) -> Self {
        Change {
            path,
            contents: Some(contents),
            mode,
            record: None,
            dir: false,
        }
    }
    pub fn record(path: PathBuf, contents: String, summary: String) -> Self {
        Change {
            record: Some(summary),
            ..Change::write(path, contents, 0o600)
        }
    }
    pub fn remove(path: PathBuf) -> Self {
        Change {
            path,
            contents: None,
            mode: 0,
            record: None,
            dir: false,
        }
    }
    pub fn remove_empty_dir(path: PathBuf) -> Self {
        Change {
            dir: true,
            ..Change::remove(path)
        }
    }
}

/// Writes or removes each change (atomically), saying so on `out`.
pub fn apply(changes: &[Change], out: &mut dyn std::io::Write) -> Result<()> {
    for c in changes {
        match &c.contents {
            Some(text) => {
                fsutil::write_atomic(&c.path, text.as_bytes(), c.mode)?;
                writeln!(out, "wrote {}", c.path.display())?;
            }
            None if c.dir => {
                if std::fs::remove_dir(&c.path).is_ok() {
                    writeln!(out, "removed {}/", c.path.display())?;
                }
            }
            None => {
                fsutil::remove_file(&c.path)?;
                writeln!(out, "removed {}", c.path.display())?;
                // The record's folder is vgpuctl's: it goes with the record's last file.
                if c.record.is_some() {
                    if let Some(dir) = c.path.parent() {
                        let _ = std::fs::remove_dir(dir);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `--dry-run`: the engine files as they would be written go to `files` (stdout: only the file, so it can
/// be redirected or diffed), what would happen to which path to `notes` (stderr).
pub fn preview(
    changes: &[Change],
    files: &mut dyn std::io::Write,
    notes: &mut dyn std::io::Write,
) -> Result<()> {
    for c in changes {
        match (&c.contents, &c.record) {
            (_, Some(what)) => writeln!(notes, "would record in {}: {what}", c.path.display())?,
            (Some(text), None) => {
                writeln!(notes, "would write {}:", c.path.display())?;
                write!(files, "{text}")?;
                if !text.ends_with('\n') {
                    writeln!(files)?;
                }
                files.flush()?;
            }
            (None, None) if c.dir => writeln!(
                notes,
                "would remove the folder {} if it is empty",
                c.path.display()
            )?,
            (None, None) => writeln!(notes, "would remove {}", c.path.display())?,
        }
    }
    Ok(())
}

/// Test helper: the text `path` has after `changes`, starting from `current`.
#[cfg(test)]
pub fn apply_in_memory(changes: &[Change], path: &str, current: Option<&str>) -> Option<String> {
    let mut text = current.map(str::to_string);
    for c in changes
        .iter()
        .filter(|c| c.path == std::path::Path::new(path))
    {
        text = c.contents.clone();
    }
    text
}

/// Test helper: runs `f(case, input)` on every golden input `tests/golden/<kind>/<case>.<ext>` and
/// compares with `<case>.expected.<ext>` (`VGPU_UPDATE_GOLDEN=1` rewrites the expected files after a
/// deliberate change; review the diff). Returns how many cases ran.
#[cfg(test)]
pub fn golden(kind: &str, ext: &str, mut f: impl FnMut(&str, &str) -> String) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(kind);
    let mut cases = 0;
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().into_owned();
        let Some(case) = name.strip_suffix(&format!(".{ext}")) else {
            continue;
        };
        if case.ends_with(".expected") {
            continue;
        }
        let input = std::fs::read_to_string(dir.join(&name)).unwrap();
        let got = f(case, &input);
        let want_path = dir.join(format!("{case}.expected.{ext}"));
        if std::env::var_os("VGPU_UPDATE_GOLDEN").is_some() {
            std::fs::write(&want_path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&want_path).unwrap_or_default();
        assert_eq!(got, want, "golden case {kind}/{case}");
        cases += 1;
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apply writes and removes on disk; a folder with a file in it stays; preview touches nothing.
    #[test]
    fn apply_and_preview() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d/x.toml");
        let ch = vec![Change::write(f.clone(), "a = 1".into(), 0o644)];
        let (mut out, mut notes) = (Vec::new(), Vec::new());
        preview(&ch, &mut out, &mut notes).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "a = 1\n");
        assert!(!f.exists());
        apply(&ch, &mut Vec::new()).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "a = 1");
        let mut out = Vec::new();
        let gone = [Change::remove_empty_dir(dir.path().join("d"))];
        apply(&gone, &mut out).unwrap();
        assert!(out.is_empty() && f.exists(), "a folder with a file stays");
        apply(&[Change::remove(f.clone())], &mut Vec::new()).unwrap();
        apply(&gone, &mut Vec::new()).unwrap();
        assert!(!dir.path().join("d").exists());
    }
}
