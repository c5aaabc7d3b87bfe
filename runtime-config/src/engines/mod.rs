//! `vgpuctl runtime configure|unconfigure`: each engine module turns the current text of the engine's
//! config into a list of file changes (pure functions, unit-tested); this module reads the files, prints
//! or applies the changes, and says what to restart. Nothing here restarts an engine.
pub mod containerd;
pub mod crio;
pub mod docker;
pub mod hooks;

use crate::fsutil;
use anyhow::{anyhow, Result};
use std::path::{Path, PathBuf};

/// The engines vgpuctl knows (clap lists them when given another name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Docker,
    Containerd,
    Crio,
    Podman,
}

/// One file to write (`contents: Some`) or remove (`None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: PathBuf,
    pub contents: Option<String>,
    pub mode: u32,
}

impl Change {
    pub fn write(path: PathBuf, contents: String, mode: u32) -> Self {
        Change {
            path,
            contents: Some(contents),
            mode,
        }
    }
    pub fn remove(path: PathBuf) -> Self {
        Change {
            path,
            contents: None,
            mode: 0,
        }
    }
}

/// An error in a file vgpuctl was asked to edit: `path:line:column: message`, one line.
pub fn parse_error(path: &Path, line: usize, column: usize, msg: &str) -> anyhow::Error {
    let msg = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    anyhow!(
        "{}:{line}:{column}: cannot parse: {msg} (file left untouched)",
        path.display()
    )
}

/// 1-based line and column of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

/// Options of `vgpuctl runtime configure|unconfigure`.
#[derive(Debug, Clone)]
pub struct Options {
    pub engine: Engine,
    /// The engine's config file (Docker, containerd, CRI-O's main crio.conf); None = the engine's default.
    pub config: Option<PathBuf>,
    pub set_as_default: bool,
    pub runtime_path: String,
    pub hook_path: String,
    pub hooks_dir: Option<PathBuf>,
    /// Extra `KEY=VALUE` entries for the hooks' explicit environment.
    pub hook_env: Vec<String>,
    /// CRI-O: where the drop-in goes (default: `crio.conf.d` beside the main config).
    pub drop_in_dir: Option<PathBuf>,
}

impl Options {
    fn config_path(&self) -> PathBuf {
        self.config.clone().unwrap_or_else(|| {
            PathBuf::from(match self.engine {
                Engine::Docker => docker::DEFAULT_CONFIG,
                Engine::Containerd => containerd::DEFAULT_CONFIG,
                Engine::Crio => crio::DEFAULT_CONFIG,
                Engine::Podman => "",
            })
        })
    }
    fn hooks_dir(&self) -> PathBuf {
        self.hooks_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(hooks::DEFAULT_DIR))
    }
    fn drop_in_path(&self) -> PathBuf {
        let dir = self.drop_in_dir.clone().unwrap_or_else(|| {
            self.config_path()
                .parent()
                .unwrap_or(Path::new("/etc/crio"))
                .join("crio.conf.d")
        });
        dir.join(crio::DROP_IN_NAME)
    }
}

/// Refuses options that mean nothing for the engine, rather than ignoring them silently.
fn check_options(o: &Options) -> Result<()> {
    let name = format!("{:?}", o.engine).to_lowercase();
    if o.engine == Engine::Podman && o.config.is_some() {
        anyhow::bail!(
            "--config has no meaning for podman (it has no config entry for vgpu); use --hooks-dir"
        );
    }
    if o.engine != Engine::Podman && o.hooks_dir.is_some() {
        anyhow::bail!(
            "--hooks-dir is for podman's hooks.d files; {name} is configured through --config"
        );
    }
    if o.engine != Engine::Crio && o.drop_in_dir.is_some() {
        anyhow::bail!("--drop-in-dir is for crio only");
    }
    Ok(())
}

/// The changes that configure `o.engine`.
pub fn plan_configure(o: &Options) -> Result<Vec<Change>> {
    check_options(o)?;
    let cfg = o.config_path();
    match o.engine {
        Engine::Docker => {
            let current = fsutil::read_optional(&cfg)?;
            let undo = fsutil::read_optional(&docker::undo_path(&cfg))?;
            let prev = undo.as_deref().and_then(docker::read_undo);
            let s = docker::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
            };
            docker::configure(&cfg, current.as_deref(), prev.as_deref(), &s)
        }
        Engine::Containerd => {
            let current = fsutil::read_optional(&cfg)?;
            let s = containerd::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
                version_for_new_file: None,
            };
            containerd::configure(&cfg, current.as_deref(), &s)
        }
        Engine::Crio => {
            let main = fsutil::read_optional(&cfg)?;
            let drop_in = o.drop_in_path();
            let current = fsutil::read_optional(&drop_in)?;
            let s = crio::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
            };
            let new = crio::drop_in(&cfg, main.as_deref(), &s)?;
            Ok(if current.as_deref() == Some(new.as_str()) {
                vec![]
            } else {
                vec![Change::write(drop_in, new, 0o644)]
            })
        }
        Engine::Podman => {
            let dir = o.hooks_dir();
            let mut changes = Vec::new();
            for (name, text) in hooks::files(&o.hook_path, &o.hook_env)? {
                let path = dir.join(name);
                if fsutil::read_optional(&path)?.as_deref() != Some(text.as_str()) {
                    changes.push(Change::write(path, text, 0o644));
                }
            }
            Ok(changes)
        }
    }
}

/// The changes that take back what `plan_configure` added.
pub fn plan_unconfigure(o: &Options) -> Result<Vec<Change>> {
    check_options(o)?;
    let cfg = o.config_path();
    match o.engine {
        Engine::Docker => {
            let current = fsutil::read_optional(&cfg)?;
            let undo = fsutil::read_optional(&docker::undo_path(&cfg))?;
            let prev = undo.as_deref().and_then(docker::read_undo);
            docker::unconfigure(&cfg, current.as_deref(), prev.as_deref())
        }
        Engine::Containerd => {
            let current = fsutil::read_optional(&cfg)?;
            containerd::unconfigure(&cfg, current.as_deref())
        }
        Engine::Crio => {
            let drop_in = o.drop_in_path();
            Ok(match fsutil::read_optional(&drop_in)? {
                Some(text) if crio::is_ours(&text) => vec![Change::remove(drop_in)],
                Some(_) => anyhow::bail!(
                    "{}: not written by vgpuctl (no vgpuctl header); left alone",
                    drop_in.display()
                ),
                None => vec![],
            })
        }
        Engine::Podman => {
            let dir = o.hooks_dir();
            let mut changes = Vec::new();
            for name in hooks::file_names() {
                let path = dir.join(name);
                if path.exists() {
                    changes.push(Change::remove(path));
                }
            }
            Ok(changes)
        }
    }
}

/// Advice printed after configure: an engine that already runs containers through NVIDIA's runtime
/// should keep doing so underneath the vgpu shim, which hands over to `lower_runtime` (default runc).
pub fn notes(o: &Options) -> Vec<String> {
    let text = match o.engine {
        Engine::Podman => return vec![],
        _ => fsutil::read_optional(&o.config_path())
            .ok()
            .flatten()
            .unwrap_or_default(),
    };
    if text.contains("nvidia-container-runtime") {
        vec!["note: this engine's config names nvidia-container-runtime; so that NVIDIA's device injection \
              still happens under vgpu, set lower_runtime = \"nvidia-container-runtime\" in /etc/vgpu/config.toml"
            .into()]
    } else {
        vec![]
    }
}

/// What the operator must do for the engine to see the change.
pub fn restart_hint(engine: Engine) -> &'static str {
    match engine {
        Engine::Docker => "restart docker to apply: systemctl restart docker",
        Engine::Containerd => "restart containerd to apply: systemctl restart containerd",
        Engine::Crio => "restart CRI-O to apply: systemctl restart crio",
        Engine::Podman => "nothing to restart: podman reads the hooks directory at every command",
    }
}

/// Writes or removes each change (atomically), or with `dry_run` prints them instead.
pub fn apply(changes: &[Change], dry_run: bool, out: &mut dyn std::io::Write) -> Result<()> {
    for c in changes {
        match (&c.contents, dry_run) {
            (Some(text), true) => {
                writeln!(out, "# would write {}:", c.path.display())?;
                write!(out, "{text}")?;
                if !text.ends_with('\n') {
                    writeln!(out)?;
                }
            }
            (None, true) => writeln!(out, "# would remove {}", c.path.display())?,
            (Some(text), false) => {
                fsutil::write_atomic(&c.path, text.as_bytes(), c.mode)?;
                writeln!(out, "wrote {}", c.path.display())?;
            }
            (None, false) => {
                fsutil::remove_file(&c.path)?;
                writeln!(out, "removed {}", c.path.display())?;
            }
        }
    }
    Ok(())
}

/// Test helper: the text `path` has after `changes`, starting from `current`.
#[cfg(test)]
pub fn apply_in_memory(changes: &[Change], path: &str, current: Option<&str>) -> Option<String> {
    let mut text = current.map(str::to_string);
    for c in changes.iter().filter(|c| c.path == Path::new(path)) {
        text = c.contents.clone();
    }
    text
}

/// Test helper: runs `f(case, input)` on every golden input `tests/golden/<kind>/<case>.<ext>` and
/// compares with `<case>.expected.<ext>` (`VGPU_UPDATE_GOLDEN=1` rewrites the expected files after a
/// deliberate change; review the diff). Returns how many cases ran.
#[cfg(test)]
pub fn golden(kind: &str, ext: &str, mut f: impl FnMut(&str, &str) -> String) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
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

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn podman_round_trip_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let o = Options {
            engine: Engine::Podman,
            config: None,
            set_as_default: false,
            runtime_path: "/usr/bin/vgpu-container-runtime".into(),
            hook_path: "/usr/bin/vgpu-hook".into(),
            hooks_dir: Some(dir.path().join("hooks.d")),
            hook_env: vec![],
            drop_in_dir: None,
        };
        let ch = plan_configure(&o).unwrap();
        assert!(!ch.is_empty());
        apply(&ch, false, &mut Vec::new()).unwrap();
        assert!(
            plan_configure(&o).unwrap().is_empty(),
            "second configure changes nothing"
        );
        let ch = plan_unconfigure(&o).unwrap();
        apply(&ch, false, &mut Vec::new()).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("hooks.d"))
                .unwrap()
                .count(),
            0
        );
        assert!(plan_unconfigure(&o).unwrap().is_empty());
    }
}
