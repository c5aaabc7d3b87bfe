//! containerd: a runtime handler `vgpu`, either edited into the main config (`/etc/containerd/config.toml`,
//! the default) or written as a drop-in file of its own that the main config imports (`--drop-in`). The
//! main file is edited with toml_edit, so every other key, the comments and the layout stay as they were;
//! files it imports are read, never edited (except vgpuctl's own drop-in). The model is NVIDIA's container
//! toolkit, pkg/config/engine/containerd/ (`ConfigWithDropIn`, `ConfigV1`), and containerd's own config
//! loading for how the files combine (`imports`).
//!
//! | module | owns |
//! | --- | --- |
//! | this one | the engine (`--runtime=containerd`, `--config`, `--drop-in`), configure/unconfigure's outline |
//! | `settings` | what configure is asked, default paths |
//! | `version` | config version 2 or 3, its CRI plugin, the `containerd --version` probe |
//! | `imports` | the files containerd reads and how they merge (`LoadConfigWithPlugins`, `resolveImports`) |
//! | `handler` | vgpu's handler (a copy of the default runtime with the shim), whose a `vgpu` handler is |
//! | `default_runtime` | `--set-as-default`, putting the old default back, which runtime the handler copies |
//! | `main_file` | the handler in the main config, and out of it again |
//! | `drop_in` | the handler in vgpuctl's drop-in, its `imports` entry, removing both |
//! | `marks` | vgpuctl's header and comments in containerd's files |
//! | `tables` | toml_edit helpers that keep the layout |
mod default_runtime;
mod drop_in;
mod handler;
mod imports;
mod main_file;
mod marks;
mod settings;
mod tables;
#[cfg(test)]
mod testing;
mod version;

pub use settings::{Settings, DEFAULT_CONFIG, DEFAULT_DROP_IN};

use crate::engines::api::{ContainerEngine, Context};
use crate::engines::change::Change;
use crate::engines::error::Result;
use crate::engines::files::Files;
use crate::engines::ownership::Ownership;
use crate::engines::record::{self, Entry};
use crate::engines::shim::{check_runtime_path, nvidia_note, ConfigFile, SetAsDefault};
use crate::engines::syntax::parse_toml;
use std::path::{Path, PathBuf};

/// containerd's options: the main file, and the drop-in.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Target {
    #[command(flatten)]
    pub config: ConfigFile,
    /// containerd: put vgpu's handler in a file of its own that the main config imports, instead of editing
    /// the main config (PATH default: conf.d/99-vgpu.toml beside --config). The main config gets an
    /// `imports` entry for it unless one of its imports (a glob) already covers it. Unconfigure removes the
    /// drop-in (this one, the one vgpuctl recorded, or any file with vgpuctl's header containerd reads) and
    /// the `imports` entry if vgpuctl added it.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub drop_in: Option<Option<PathBuf>>,
}

impl Target {
    /// The main config, absolute.
    fn main(&self) -> PathBuf {
        record::absolute(&self.config.path(DEFAULT_CONFIG))
    }
    /// The drop-in, absolute, if `--drop-in` was given.
    fn drop_in(&self) -> Option<PathBuf> {
        let d = self.drop_in.as_ref()?;
        let main = self.main();
        Some(record::absolute(&match d {
            Some(p) => p.clone(),
            None => main
                .parent()
                .unwrap_or(Path::new("/"))
                .join(DEFAULT_DROP_IN),
        }))
    }
}

/// The engine: `--runtime=containerd`.
pub struct Containerd;

impl ContainerEngine for Containerd {
    type Target = Target;
    type Options = SetAsDefault;
    fn name(&self) -> &'static str {
        "containerd"
    }
    fn title(&self) -> &'static str {
        "Containerd"
    }
    fn default_paths(&self) -> &'static [&'static str] {
        &[DEFAULT_CONFIG]
    }
    fn configure(&self, t: &Target, o: &SetAsDefault, cx: &Context) -> Result<Vec<Change>> {
        check_runtime_path(&cx.install.runtime_path)?;
        let cfg = t.main();
        let current = cx.files.read(&cfg)?;
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &cfg)?;
        let drop_in = t.drop_in();
        let s = Settings {
            runtime_path: &cx.install.runtime_path,
            set_as_default: o.set_as_default,
            force: cx.force,
            drop_in: drop_in.as_deref(),
        };
        let c = configure(&cfg, current.as_deref(), cx.files, prior.as_ref(), &s)?;
        let entry = Some(c.entry);
        // The record first: a crash between the two leaves a record unconfigure can use.
        let mut changes: Vec<Change> =
            record::change(cx.record, rec_text.as_deref(), self.name(), &cfg, entry)?
                .into_iter()
                .collect();
        changes.extend(c.changes);
        Ok(changes)
    }
    fn unconfigure(&self, t: &Target, cx: &Context) -> Result<Vec<Change>> {
        let cfg = t.main();
        let current = cx.files.read(&cfg)?;
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &cfg)?;
        let drop_in = t.drop_in();
        let mut changes = unconfigure(
            &cfg,
            current.as_deref(),
            cx.files,
            prior.as_ref(),
            drop_in.as_deref(),
        )?;
        changes.extend(record::change(
            cx.record,
            rec_text.as_deref(),
            self.name(),
            &cfg,
            None,
        )?);
        Ok(changes)
    }
    /// The first `vgpu` handler that is not vgpu's among the files containerd reads, else whether vgpu's
    /// handler (or drop-in) is among them.
    fn ownership(&self, t: &Target, cx: &Context) -> Result<Ownership> {
        let cfg = t.main();
        let Some(text) = cx.files.read(&cfg)?.filter(|t| !t.trim().is_empty()) else {
            return Ok(Ownership::Absent);
        };
        let doc = parse_toml(&cfg, &text)?;
        let version = version::version_of(&cfg, &doc)?;
        let mut found = Ownership::Absent;
        for src in imports::load_chain(&cfg, &doc, cx.files, None, false)? {
            match src.vgpu(version).map(handler::foreign_why) {
                Some(Some(why)) => {
                    return Ok(Ownership::Foreign {
                        path: src.path,
                        why,
                    })
                }
                Some(None) => found = Ownership::Ours,
                None if src.ours => found = Ownership::Ours,
                None => {}
            }
        }
        Ok(found)
    }
    fn restart_hint(&self) -> &'static str {
        "restart containerd to apply: systemctl restart containerd"
    }
    fn notes(&self, t: &Target, cx: &Context) -> Vec<String> {
        nvidia_note(cx.files.read(&t.main()).ok().flatten().as_deref())
    }
}

/// What `configure` does: the files to write, and vgpuctl's record entry for this config afterwards.
#[derive(Debug)]
pub struct Configured {
    pub changes: Vec<Change>,
    pub entry: Entry,
}

/// The changes that add the vgpu runtime handler for the main config `path` (absolute; current text
/// `current`, None if absent), given vgpuctl's record entry for it (`prior`).
pub fn configure(
    path: &Path,
    current: Option<&str>,
    files: &dyn Files,
    prior: Option<&Entry>,
    s: &Settings,
) -> Result<Configured> {
    let mut doc = match current {
        Some(text) if !text.trim().is_empty() => parse_toml(path, text)?,
        _ => {
            let version = version::installed_version(files);
            parse_toml(path, &format!("{}\nversion = {version}\n", marks::CREATED))?
        }
    };
    let version = version::version_of(path, &doc)?;
    let mut entry = prior
        .cloned()
        .unwrap_or_else(|| Entry::new(Containerd.name(), path));
    let mut changes = Vec::new();
    match s.drop_in {
        None => main_file::configure_main(path, &mut doc, version, files, &mut entry, s)?,
        Some(target) => changes.extend(drop_in::configure_drop_in(
            path, &mut doc, version, files, target, &mut entry, s,
        )?),
    }
    let new = doc.to_string();
    if current != Some(new.as_str()) {
        changes.push(Change::write(path.to_path_buf(), new, 0o644));
    }
    Ok(Configured { changes, entry })
}

/// The changes that take back what `configure` added for the main config `path` (absolute): the handler
/// and default in the main file, vgpuctl's drop-in (the one `drop_in` names, the record's, or any file
/// with vgpuctl's header among those containerd reads) and the `imports` entry vgpuctl added for it.
pub fn unconfigure(
    path: &Path,
    current: Option<&str>,
    files: &dyn Files,
    prior: Option<&Entry>,
    drop_in: Option<&Path>,
) -> Result<Vec<Change>> {
    let text = current.filter(|t| !t.trim().is_empty());
    let doc = text.map(|t| parse_toml(path, t)).transpose()?;
    let removals = drop_in::removals(path, doc.as_ref(), files, prior, drop_in)?;
    // With a drop-in of vgpuctl's to remove, a foreign handler in the main file is not in the way: it is
    // left as it is (and is what containerd uses again once the drop-in is gone).
    let through_drop_in = !removals.is_empty() || prior.is_some_and(|e| e.drop_in.is_some());
    let mut changes = Vec::new();
    if let (Some(text), Some(doc)) = (text, doc) {
        changes.extend(main_file::unconfigure_main(
            path,
            text,
            doc,
            prior,
            through_drop_in,
        )?);
    }
    let dirs = drop_in::folders_made(prior, &removals);
    // The main file stops importing the drop-in before it goes.
    changes.extend(removals);
    changes.extend(dirs);
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::engines::api::Install;
    use crate::engines::files::MemFiles;
    use proptest::prelude::*;

    /// Through the engine interface: the record holds the drop-in, ownership follows, and unconfigure
    /// takes everything back (the record's entry included).
    #[test]
    fn the_engine_records_its_drop_in_and_knows_its_handler() {
        const R: &str = "/var/lib/vgpu/engines.json";
        let mut disk = MemFiles::with(&[(P, V2)]);
        let install = Install::default();
        let t = Target {
            config: ConfigFile {
                config: Some(P.into()),
            },
            drop_in: Some(None),
        };
        let run = |disk: &mut MemFiles, configure: bool| {
            let cx = Context {
                files: &*disk,
                record: Path::new(R),
                install: &install,
                force: false,
            };
            let ch = if configure {
                Containerd
                    .configure(&t, &SetAsDefault::default(), &cx)
                    .unwrap()
            } else {
                Containerd.unconfigure(&t, &cx).unwrap()
            };
            disk.apply(&ch);
        };
        let own = |disk: &MemFiles| {
            let cx = Context {
                files: disk,
                record: Path::new(R),
                install: &install,
                force: false,
            };
            Containerd.ownership(&t, &cx).unwrap()
        };
        assert_eq!(own(&disk), Ownership::Absent);
        run(&mut disk, true);
        assert!(disk.get(R).unwrap().contains(D), "{:?}", disk.get(R));
        assert_eq!(own(&disk), Ownership::Ours);
        run(&mut disk, false);
        assert_eq!(
            (disk.get(P), disk.get(D), disk.get(R)),
            (Some(V2), None, None)
        );
        let disk = MemFiles::with(&[(P, KATA)]);
        assert!(matches!(own(&disk), Ownership::Foreign { .. }));
    }

    /// tests/golden/containerd: real configs (Debian's, `containerd config default`, a 2.x version 3) →
    /// the exact file vgpuctl writes; configure again is a no-op and unconfigure gives the input back.
    #[test]
    fn golden() {
        let n = crate::engines::change::golden("containerd", "toml", |case, input| {
            let def = case.ends_with("set-as-default");
            let (out, entry) = conf_e(Some(input), def, None);
            assert_eq!(
                conf_e(Some(&out), def, Some(&entry)).0,
                out,
                "{case}: idempotent"
            );
            assert_eq!(
                unconf_e(&out, Some(&entry)).unwrap(),
                input,
                "{case}: unconfigure restores the bytes"
            );
            out
        });
        assert!(n >= 3, "golden cases: {n}");
    }

    proptest! {
        // Comments and unrelated keys anywhere survive configure + unconfigure byte for byte.
        #[test]
        fn round_trip_with_comments(comment in "[a-zA-Z0-9 ]{0,30}", key in "[a-z_]{1,10}", n in any::<i32>(), def in any::<bool>()) {
            let orig = format!("# {comment}\nversion = 2\n{key}x = {n} # {comment}\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  # {comment}\n  snapshotter = \"overlayfs\"\n");
            let (out, entry) = conf_e(Some(&orig), def, None);
            prop_assert_eq!(conf_e(Some(&out), def, Some(&entry)).0, out.clone());
            prop_assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig.clone());
            // The same through a drop-in: the main file gets an import entry, and loses it again.
            let mut disk = MemFiles::with(&[(P, &orig)]);
            let entry = run_conf(&mut disk, None, &drop_in(def)).unwrap();
            run_unconf(&mut disk, Some(&entry)).unwrap();
            prop_assert_eq!(disk.get(P), Some(orig.as_str()));
            prop_assert_eq!(disk.files.len(), 1);
        }
    }
}
