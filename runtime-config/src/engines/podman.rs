//! Podman: vgpu's OCI hooks.d files (`hooks.rs` writes them) in Podman's hooks folder. There is no runtime
//! entry and nothing to restart; a hook file of vgpu's name that runs another program is someone else's.
//! A hooks folder that configure had to create is recorded (vgpuctl's record, keyed by the folder), and
//! unconfigure removes it again (and the parents it created), each only if empty.
use super::api::{ContainerEngine, Context, NoOptions};
use super::change::Change;
use super::error::{EngineError, Result};
use super::hooks;
use super::ownership::{foreign, Ownership};
use super::record;
use std::path::{Path, PathBuf};

/// Podman's options: the hooks folder.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Target {
    /// Podman: the hooks.d folder (default: /usr/share/containers/oci/hooks.d).
    #[arg(long)]
    pub hooks_dir: Option<PathBuf>,
}

impl Target {
    fn dir(&self) -> PathBuf {
        self.hooks_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(hooks::DEFAULT_DIR))
    }
}

/// The engine: `--runtime=podman`.
pub struct Podman;

impl ContainerEngine for Podman {
    type Target = Target;
    type Options = NoOptions;
    fn name(&self) -> &'static str {
        "podman"
    }
    fn title(&self) -> &'static str {
        "Podman"
    }
    fn default_paths(&self) -> &'static [&'static str] {
        &[hooks::DEFAULT_DIR]
    }
    fn configure(&self, t: &Target, _o: &NoOptions, cx: &Context) -> Result<Vec<Change>> {
        let hook_path = &cx.install.hook_path;
        // Hook files are recognised as vgpu's by the program's name.
        if Path::new(hook_path).file_name() != Some(vgpu_host::keys::host::HOOK_BIN.as_ref()) {
            return Err(EngineError::HookPathName {
                hook: vgpu_host::keys::host::HOOK_BIN,
                given: hook_path.to_string(),
            });
        }
        if let Ownership::Foreign { path, why } = self.ownership(t, cx)? {
            if !cx.force {
                return Err(foreign(&path, "the hook file", &why));
            }
        }
        let dir = t.dir();
        let key = record::absolute(&dir);
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &key)?;
        let mut entry = prior
            .clone()
            .unwrap_or_else(|| record::Entry::new(self.name(), &key));
        if !cx.files.is_dir(&key) {
            // The folders written with the hooks that were not there: unconfigure removes them again.
            entry.hooks_dirs_created = key
                .ancestors()
                .take_while(|d| d.parent().is_some() && !cx.files.is_dir(d))
                .last()
                .map(Path::to_path_buf);
        }
        let mut changes = Vec::new();
        for (name, text) in hooks::files(hook_path, &cx.install.hook_env)? {
            let path = dir.join(name);
            if cx.files.read(&path)?.as_deref() != Some(text.as_str()) {
                changes.push(Change::write(path, text, 0o644));
            }
        }
        if prior.as_ref() != Some(&entry) {
            changes.extend(record::change(
                cx.record,
                rec_text.as_deref(),
                self.name(),
                &key,
                Some(entry),
            )?);
        }
        Ok(changes)
    }
    fn unconfigure(&self, t: &Target, cx: &Context) -> Result<Vec<Change>> {
        if let Ownership::Foreign { path, why } = self.ownership(t, cx)? {
            return Err(foreign(&path, "the hook file", &why));
        }
        let mut changes = Vec::new();
        for name in hooks::file_names() {
            let path = t.dir().join(name);
            if cx.files.read(&path)?.is_some() {
                changes.push(Change::remove(path));
            }
        }
        let key = record::absolute(&t.dir());
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &key)?;
        if let Some(top) = prior.as_ref().and_then(|e| e.hooks_dirs_created.as_ref()) {
            // Deepest first; each goes only if empty (another program's hooks keep it).
            for d in key.ancestors() {
                if !d.starts_with(top) {
                    break;
                }
                changes.push(Change::remove_empty_dir(d.to_path_buf()));
            }
        }
        if prior.is_some() {
            changes.extend(record::change(
                cx.record,
                rec_text.as_deref(),
                self.name(),
                &key,
                None,
            )?);
        }
        Ok(changes)
    }
    /// The first hook file of vgpu's names that is not vgpu's, else whether any is there.
    fn ownership(&self, t: &Target, cx: &Context) -> Result<Ownership> {
        let mut found = Ownership::Absent;
        for name in hooks::file_names() {
            let path = t.dir().join(name);
            if let Some(text) = cx.files.read(&path)? {
                match hooks::foreign_why(&text) {
                    Some(why) => return Ok(Ownership::Foreign { path, why }),
                    None => found = Ownership::Ours,
                }
            }
        }
        Ok(found)
    }
    fn restart_hint(&self) -> &'static str {
        "nothing to restart: podman reads the hooks directory at every command"
    }
    fn refusal(&self, long: &str) -> Option<&'static str> {
        match long {
            "config" => Some(
                "--config has no meaning for podman (it has no config entry for vgpu); use --hooks-dir",
            ),
            "set-as-default" => Some(
                "--set-as-default has no meaning for podman: its vgpu hooks run for every container with a \
                 vgpu.io/ annotation whatever the runtime, so there is no vgpu runtime to make the default",
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::api::Install;
    use crate::engines::files::MemFiles;

    const HD: &str = "/usr/share/containers/oci/hooks.d";

    fn run(disk: &mut MemFiles, configure: bool, force: bool) -> Result<Vec<Change>> {
        let install = Install::default();
        let cx = Context {
            files: &*disk,
            record: Path::new("/var/lib/vgpu/engines.json"),
            install: &install,
            force,
        };
        let t = Target::default();
        let ch = if configure {
            Podman.configure(&t, &NoOptions {}, &cx)?
        } else {
            Podman.unconfigure(&t, &cx)?
        };
        disk.apply(&ch);
        Ok(ch)
    }

    /// A hooks.d file of the same name that runs another program: configure refuses it, unconfigure keeps
    /// it (and removes nothing), --force replaces it.
    #[test]
    fn foreign_hook_file_is_never_clobbered() {
        let theirs = "{\"version\":\"1.0.0\",\"hook\":{\"path\":\"/usr/bin/audit\"},\"when\":{\"always\":true},\"stages\":[\"poststop\"]}\n";
        let p = format!("{HD}/vgpu-poststop.json");
        let mut disk = MemFiles::with(&[(&p, theirs)]);
        let e = run(&mut disk, true, false).unwrap_err();
        assert!(
            matches!(&e, EngineError::Foreign { path, what, why }
                if path.ends_with("vgpu-poststop.json") && what == "the hook file" && why == "it runs /usr/bin/audit"),
            "{e}"
        );
        let e = run(&mut disk, false, false).unwrap_err();
        assert!(matches!(e, EngineError::Foreign { .. }), "{e}");
        assert_eq!(disk.get(&p), Some(theirs));
        run(&mut disk, true, true).unwrap();
        assert!(disk.get(&p).unwrap().contains("vgpu-hook"));
    }

    #[test]
    fn round_trip() {
        let mut disk = MemFiles::default();
        assert!(!run(&mut disk, true, false).unwrap().is_empty());
        let hook_files = disk.files.keys().filter(|k| k.starts_with(HD)).count();
        assert_eq!(hook_files, hooks::STAGES.len());
        assert!(
            run(&mut disk, true, false).unwrap().is_empty(),
            "second configure changes nothing"
        );
        run(&mut disk, false, false).unwrap();
        assert!(disk.files.is_empty());
        assert!(run(&mut disk, false, false).unwrap().is_empty());
    }

    /// Regression (issue 26 item 6): a hooks folder configure created stayed behind after unconfigure and
    /// purge. It is recorded and goes again, with the parents configure made; a folder that was there stays.
    #[test]
    fn folders_made_for_the_hooks_go_with_them_and_others_stay() {
        let mut disk = MemFiles::with(&[("/usr/share/containers/storage.conf", "x")]);
        run(&mut disk, true, false).unwrap();
        let rec = disk
            .get("/var/lib/vgpu/engines.json")
            .expect("a record")
            .to_string();
        assert!(
            rec.contains("\"hooks_dirs_created\": \"/usr/share/containers/oci\""),
            "{rec}"
        );
        assert!(
            run(&mut disk, true, false).unwrap().is_empty(),
            "a second configure changes nothing"
        );
        let ch = run(&mut disk, false, false).unwrap();
        let dirs: Vec<&Path> = ch
            .iter()
            .filter(|c| c.dir)
            .map(|c| c.path.as_path())
            .collect();
        assert_eq!(
            dirs,
            [Path::new(HD), Path::new("/usr/share/containers/oci")],
            "deepest first"
        );
        assert_eq!(
            disk.get("/var/lib/vgpu/engines.json"),
            None,
            "the record goes with its entry"
        );

        // A hooks folder that was there (another program's hook in it): nothing recorded, nothing removed.
        let theirs = format!("{HD}/audit.json");
        let mut disk = MemFiles::with(&[(&theirs, "{}")]);
        run(&mut disk, true, false).unwrap();
        assert_eq!(disk.get("/var/lib/vgpu/engines.json"), None);
        let ch = run(&mut disk, false, false).unwrap();
        assert!(ch.iter().all(|c| !c.dir), "{ch:?}");
        assert_eq!(disk.get(&theirs), Some("{}"));
    }

    #[test]
    fn the_hook_path_must_keep_its_name() {
        let install = Install {
            hook_path: "/opt/bin/my-hook".into(),
            ..Install::default()
        };
        let cx = Context {
            files: &MemFiles::default(),
            record: Path::new("/r"),
            install: &install,
            force: false,
        };
        let e = Podman
            .configure(&Target::default(), &NoOptions {}, &cx)
            .unwrap_err();
        assert!(matches!(e, EngineError::HookPathName { .. }), "{e}");
    }
}
