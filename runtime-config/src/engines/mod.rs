//! `vgpuctl runtime configure|unconfigure`: each engine module turns the current text of the engine's
//! config into a list of file changes (pure functions, unit-tested); this module reads the files, prints
//! or applies the changes, and says what to restart. Nothing here restarts an engine.
pub mod containerd;
pub mod crio;
pub mod docker;
pub mod hooks;
pub mod record;

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

/// One file to write (`contents: Some`) or remove (`None`), or (`dir`) a folder to remove if it is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: PathBuf,
    pub contents: Option<String>,
    pub mode: u32,
    /// vgpuctl's own record (`record`), not an engine's config, with what changes in it in one line:
    /// `--dry-run` notes that on stderr instead of printing the file with the configs on stdout.
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

/// The file name of the shim; a runtime entry whose binary has this name is vgpu's, whatever folder it is in
/// (an operator may install it elsewhere, and unconfigure is not told where).
pub const SHIM_NAME: &str = "vgpu-container-runtime";

/// Whether `binary` (a path from an engine's config) is the vgpu shim.
pub fn is_shim(binary: &str) -> bool {
    Path::new(binary).file_name() == Some(std::ffi::OsStr::new(SHIM_NAME))
}

/// The refusal for an entry named `vgpu` that vgpuctl did not write: one line, saying what it is.
pub fn foreign(path: &Path, what: &str, why: &str) -> anyhow::Error {
    anyhow!(
        "{}: {what} exists and is not vgpu's ({why}); left untouched (configure --force replaces it)",
        path.display()
    )
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
    /// Replace an entry named vgpu that vgpuctl did not write (configure only).
    pub force: bool,
    pub runtime_path: String,
    pub hook_path: String,
    pub hooks_dir: Option<PathBuf>,
    /// Extra `KEY=VALUE` entries for the hooks' explicit environment.
    pub hook_env: Vec<String>,
    /// CRI-O: where the drop-in goes (default: `crio.conf.d` beside the main config).
    pub drop_in_dir: Option<PathBuf>,
    /// containerd: write the handler into a drop-in the main config imports (`Some(None)`: the default
    /// path, `conf.d/99-vgpu.toml` beside the main config); unconfigure: that drop-in to remove.
    pub drop_in: Option<Option<PathBuf>>,
    /// vgpuctl's record of what it changed (`record::default_path()`).
    pub record: PathBuf,
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
    /// containerd's drop-in, absolute, if `--drop-in` was given.
    fn containerd_drop_in(&self) -> Option<PathBuf> {
        let d = self.drop_in.as_ref()?;
        let main = record::absolute(&self.config_path());
        Some(record::absolute(&match d {
            Some(p) => p.clone(),
            None => main
                .parent()
                .unwrap_or(Path::new("/"))
                .join(containerd::DEFAULT_DROP_IN),
        }))
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
    if o.engine == Engine::Podman && o.set_as_default {
        anyhow::bail!(
            "--set-as-default has no meaning for podman: its vgpu hooks run for every container with a \
             vgpu.io/ annotation whatever the runtime, so there is no vgpu runtime to make the default"
        );
    }
    if o.engine != Engine::Crio && o.drop_in_dir.is_some() {
        anyhow::bail!("--drop-in-dir is for crio only");
    }
    if o.engine != Engine::Containerd && o.drop_in.is_some() {
        anyhow::bail!(
            "--drop-in is for containerd only (crio always writes a drop-in: see --drop-in-dir)"
        );
    }
    Ok(())
}

/// containerd's imported files, from the disk.
struct Disk;

impl containerd::Files for Disk {
    fn read(&self, path: &Path) -> Result<Option<String>> {
        fsutil::read_optional(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn glob(&self, pattern: &Path) -> Result<Vec<PathBuf>> {
        let text = pattern.to_string_lossy();
        let mut out: Vec<PathBuf> = glob::glob_with(&text, containerd::GLOB)
            .map_err(|e| anyhow!("bad import pattern {text}: {e}"))?
            .filter_map(|p| p.ok())
            .collect();
        out.sort();
        Ok(out)
    }
}

/// vgpuctl's record file and its entry for `o`'s engine and config.
fn record_entry(o: &Options) -> Result<(Option<String>, Option<record::Entry>)> {
    let text = record::read(&o.record)?;
    let entry = record::find(&o.record, text.as_deref(), o.engine, &o.config_path())?;
    Ok((text, entry))
}

/// The record's change for `o` (`entry`: what it must say afterwards; None forgets), if any.
fn record_change(
    o: &Options,
    text: Option<&str>,
    entry: Option<record::Entry>,
) -> Result<Option<Change>> {
    record::change(&o.record, text, o.engine, &o.config_path(), entry)
}

/// The changes that configure `o.engine`.
pub fn plan_configure(o: &Options) -> Result<Vec<Change>> {
    check_options(o)?;
    // Entries are recognised as vgpu's by the binary's name; one under another name could never be
    // told apart from someone else's again.
    if o.engine == Engine::Podman {
        if Path::new(&o.hook_path).file_name() != Some("vgpu-hook".as_ref()) {
            anyhow::bail!(
                "--hook-path must name a file called vgpu-hook, got {:?}",
                o.hook_path
            );
        }
    } else if !is_shim(&o.runtime_path) {
        anyhow::bail!(
            "--runtime-path must name a file called {SHIM_NAME}, got {:?}",
            o.runtime_path
        );
    }
    let cfg = o.config_path();
    match o.engine {
        Engine::Docker => {
            let current = fsutil::read_optional(&cfg)?;
            let (rec_text, prior) = record_entry(o)?;
            let legacy = fsutil::read_optional(&docker::legacy_path(&cfg))?;
            let s = docker::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
                force: o.force,
            };
            let c = docker::configure(&cfg, current.as_deref(), &s)?;
            let mut changes = Vec::new();
            // What --set-as-default replaced, unless an earlier configure (this vgpuctl's or an older one's)
            // already remembers it.
            if let Some(prev) = c.replaced_default {
                if prior.is_none() && legacy.is_none() {
                    let entry = record::Entry {
                        previous_default: Some(record::PreviousDefault {
                            name: prev,
                            toml: None,
                        }),
                        ..record::Entry::new(o.engine, &cfg)
                    };
                    changes.extend(record_change(o, rec_text.as_deref(), Some(entry))?);
                }
            }
            // The record first: a crash between the two leaves a record unconfigure can use.
            changes.extend(c.changes);
            Ok(changes)
        }
        Engine::Containerd => {
            let cfg = record::absolute(&cfg);
            let current = fsutil::read_optional(&cfg)?;
            let (rec_text, prior) = record_entry(o)?;
            let drop_in = o.containerd_drop_in();
            let s = containerd::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
                force: o.force,
                version_for_new_file: None,
                drop_in: drop_in.as_deref(),
            };
            let c = containerd::configure(&cfg, current.as_deref(), &Disk, prior.as_ref(), &s)?;
            let mut changes: Vec<Change> = record_change(o, rec_text.as_deref(), Some(c.entry))?
                .into_iter()
                .collect();
            changes.extend(c.changes);
            Ok(changes)
        }
        Engine::Crio => {
            let drop_in = o.drop_in_path();
            let current = fsutil::read_optional(&drop_in)?;
            if let Some(text) = &current {
                if !crio::is_ours(text) && !o.force {
                    return Err(foreign(&drop_in, "the file", "no vgpuctl header"));
                }
            }
            let s = crio::Settings {
                runtime_path: &o.runtime_path,
                set_as_default: o.set_as_default,
                force: o.force,
            };
            let new = crio::drop_in(&crio_sources(&cfg, &drop_in)?, &s)?;
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
                let current = fsutil::read_optional(&path)?;
                if let Some(why) = current.as_deref().and_then(hooks::foreign_why) {
                    if !o.force {
                        return Err(foreign(&path, "the hook file", &why));
                    }
                }
                if current.as_deref() != Some(text.as_str()) {
                    changes.push(Change::write(path, text, 0o644));
                }
            }
            Ok(changes)
        }
    }
}

/// CRI-O's config files in the order it reads them: the main file (if any), then every file of the
/// drop-in folder by name, except vgpuctl's own drop-in.
fn crio_sources(main: &Path, ours: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    if let Some(text) = fsutil::read_optional(main)? {
        out.push((main.to_path_buf(), text));
    }
    let dir = ours.parent().unwrap_or(Path::new("."));
    let mut names = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
            .map(|e| e.path())
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
        Err(e) => return Err(anyhow!("cannot list {}: {e}", dir.display())),
    };
    names.sort();
    for p in names.into_iter().filter(|p| p != ours) {
        if let Some(text) = fsutil::read_optional(&p)? {
            out.push((p, text));
        }
    }
    Ok(out)
}

/// The changes that take back what `plan_configure` added.
pub fn plan_unconfigure(o: &Options) -> Result<Vec<Change>> {
    check_options(o)?;
    let cfg = o.config_path();
    match o.engine {
        Engine::Docker => {
            let current = fsutil::read_optional(&cfg)?;
            let (rec_text, prior) = record_entry(o)?;
            let legacy_path = docker::legacy_path(&cfg);
            let legacy = fsutil::read_optional(&legacy_path)?;
            // The record's previous default, else an older vgpuctl's file beside daemon.json.
            let prev = match prior.as_ref().and_then(|e| e.previous_default.as_ref()) {
                Some(p) => p.name.clone(),
                None => legacy.as_deref().and_then(docker::read_legacy),
            };
            let mut changes = docker::unconfigure(&cfg, current.as_deref(), prev.as_deref())?;
            if legacy.is_some() {
                changes.push(Change::remove(legacy_path));
            }
            changes.extend(record_change(o, rec_text.as_deref(), None)?);
            Ok(changes)
        }
        Engine::Containerd => {
            let cfg = record::absolute(&cfg);
            let current = fsutil::read_optional(&cfg)?;
            let (rec_text, prior) = record_entry(o)?;
            let drop_in = o.containerd_drop_in();
            let mut changes = containerd::unconfigure(
                &cfg,
                current.as_deref(),
                &Disk,
                prior.as_ref(),
                drop_in.as_deref(),
            )?;
            changes.extend(record_change(o, rec_text.as_deref(), None)?);
            Ok(changes)
        }
        Engine::Crio => {
            let drop_in = o.drop_in_path();
            Ok(match fsutil::read_optional(&drop_in)? {
                Some(text) if crio::is_ours(&text) => vec![Change::remove(drop_in)],
                Some(_) => return Err(foreign(&drop_in, "the file", "no vgpuctl header")),
                None => vec![],
            })
        }
        Engine::Podman => {
            let dir = o.hooks_dir();
            let mut changes = Vec::new();
            for name in hooks::file_names() {
                let path = dir.join(name);
                if let Some(text) = fsutil::read_optional(&path)? {
                    if let Some(why) = hooks::foreign_why(&text) {
                        return Err(foreign(&path, "the hook file", &why));
                    }
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

    fn podman(dir: &Path) -> Options {
        Options {
            engine: Engine::Podman,
            config: None,
            set_as_default: false,
            force: false,
            runtime_path: "/usr/bin/vgpu-container-runtime".into(),
            hook_path: "/usr/bin/vgpu-hook".into(),
            hooks_dir: Some(dir.to_path_buf()),
            hook_env: vec![],
            drop_in_dir: None,
            drop_in: None,
            record: dir.join("state/engines.json"),
        }
    }

    /// A hooks.d file of the same name that runs another program: configure refuses it, unconfigure keeps
    /// it (and removes nothing), --force replaces it.
    #[test]
    fn foreign_hook_file_is_never_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = "{\"version\":\"1.0.0\",\"hook\":{\"path\":\"/usr/bin/audit\"},\"when\":{\"always\":true},\"stages\":[\"poststop\"]}\n";
        let p = dir.path().join("vgpu-poststop.json");
        std::fs::write(&p, theirs).unwrap();
        let mut o = podman(dir.path());
        let e = plan_configure(&o).unwrap_err();
        assert!(
            format!("{e:#}").contains("vgpu-poststop.json: the hook file exists and is not vgpu's (it runs /usr/bin/audit)"),
            "{e:#}"
        );
        let e = plan_unconfigure(&o).unwrap_err();
        assert!(format!("{e:#}").contains("left untouched"), "{e:#}");
        o.force = true;
        apply(&plan_configure(&o).unwrap(), &mut Vec::new()).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("vgpu-hook"));
    }

    /// CRI-O: a 99-vgpu.toml without vgpuctl's header is someone else's.
    #[test]
    fn foreign_crio_drop_in_is_never_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("crio.conf.d");
        std::fs::create_dir(&d).unwrap();
        let theirs = "[crio.runtime.runtimes.other]\nruntime_path = \"/usr/bin/crun\"\n";
        std::fs::write(d.join(crio::DROP_IN_NAME), theirs).unwrap();
        let mut o = Options {
            engine: Engine::Crio,
            config: Some(dir.path().join("crio.conf")),
            hooks_dir: None,
            ..podman(dir.path())
        };
        let e = plan_configure(&o).unwrap_err();
        assert!(
            format!("{e:#}")
                .contains("99-vgpu.toml: the file exists and is not vgpu's (no vgpuctl header)"),
            "{e:#}"
        );
        assert!(plan_unconfigure(&o).is_err());
        o.force = true;
        let ch = plan_configure(&o).unwrap();
        assert!(crio::is_ours(ch[0].contents.as_deref().unwrap()));
    }

    #[test]
    fn podman_round_trip_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let o = podman(&dir.path().join("hooks.d"));
        let ch = plan_configure(&o).unwrap();
        assert!(!ch.is_empty());
        apply(&ch, &mut Vec::new()).unwrap();
        assert!(
            plan_configure(&o).unwrap().is_empty(),
            "second configure changes nothing"
        );
        let ch = plan_unconfigure(&o).unwrap();
        apply(&ch, &mut Vec::new()).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("hooks.d"))
                .unwrap()
                .count(),
            0
        );
        assert!(plan_unconfigure(&o).unwrap().is_empty());
    }
}
