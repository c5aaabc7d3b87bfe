//! CRI-O: a drop-in `crio.conf.d/99-vgpu.toml` defining the runtime handler `vgpu`. CRI-O's own files
//! (crio.conf, then its `crio.conf.d/` drop-ins in name order, later ones overriding) are only read, for
//! the default runtime and its settings to copy; the drop-in is vgpuctl's alone and unconfigure removes it.
use super::api::{ContainerEngine, Context};
use super::change::Change;
use super::error::Result;
use super::files::Files;
use super::ownership::{foreign, Ownership};
use super::shim::{check_runtime_path, nvidia_note, ConfigFile, SetAsDefault};
use super::syntax::parse_toml;
use std::path::{Path, PathBuf};
use toml_edit::{Array, DocumentMut, Item, Table, Value};

pub const DEFAULT_CONFIG: &str = "/etc/crio/crio.conf";
pub const DROP_IN_NAME: &str = "99-vgpu.toml";
const RUNTIME: &str = "vgpu";
const HEADER: &str =
    "# vgpu runtime handler: written by `vgpuctl runtime configure --runtime=crio`;\n\
                      # `vgpuctl runtime unconfigure --runtime=crio` removes this file.\n";
/// The default runtime's settings that describe how to run its binary; they are copied so the shim's
/// lower runtime keeps its state where the default runtime does. Everything vgpu-specific is set here.
const COPIED: &[&str] = &[
    "runtime_root",
    "runtime_config_path",
    "monitor_path",
    "monitor_cgroup",
    "monitor_env",
    "monitor_exec_cgroup",
    "privileged_without_host_devices",
    "container_min_memory",
    "no_sync_log",
];

/// CRI-O's options: its main file and the drop-in folder.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Target {
    #[command(flatten)]
    pub config: ConfigFile,
    /// CRI-O: the drop-in folder (default: crio.conf.d beside --config); its other files are read, in
    /// CRI-O's order, for the default runtime whose settings vgpu's handler copies.
    #[arg(long)]
    pub drop_in_dir: Option<PathBuf>,
}

impl Target {
    fn main(&self) -> PathBuf {
        self.config.path(DEFAULT_CONFIG)
    }
    /// vgpuctl's drop-in.
    fn drop_in(&self) -> PathBuf {
        let dir = self.drop_in_dir.clone().unwrap_or_else(|| {
            self.main()
                .parent()
                .unwrap_or(Path::new("/etc/crio"))
                .join("crio.conf.d")
        });
        dir.join(DROP_IN_NAME)
    }
}

/// The engine: `--runtime=crio`.
pub struct Crio;

impl ContainerEngine for Crio {
    type Target = Target;
    type Options = SetAsDefault;
    fn name(&self) -> &'static str {
        "crio"
    }
    fn title(&self) -> &'static str {
        "Crio"
    }
    fn default_paths(&self) -> &'static [&'static str] {
        &[DEFAULT_CONFIG]
    }
    fn configure(&self, t: &Target, o: &SetAsDefault, cx: &Context) -> Result<Vec<Change>> {
        check_runtime_path(&cx.install.runtime_path)?;
        let drop_in_path = t.drop_in();
        let current = cx.files.read(&drop_in_path)?;
        if let Ownership::Foreign { path, why } = self.ownership(t, cx)? {
            if !cx.force {
                return Err(foreign(&path, "the file", &why));
            }
        }
        let s = Settings {
            runtime_path: &cx.install.runtime_path,
            set_as_default: o.set_as_default,
            force: cx.force,
        };
        let new = drop_in(&sources(cx.files, &t.main(), &drop_in_path)?, &s)?;
        Ok(if current.as_deref() == Some(new.as_str()) {
            vec![]
        } else {
            vec![Change::write(drop_in_path, new, 0o644)]
        })
    }
    fn unconfigure(&self, t: &Target, cx: &Context) -> Result<Vec<Change>> {
        Ok(match self.ownership(t, cx)? {
            Ownership::Ours => vec![Change::remove(t.drop_in())],
            Ownership::Foreign { path, why } => return Err(foreign(&path, "the file", &why)),
            Ownership::Absent => vec![],
        })
    }
    /// vgpuctl's drop-in: ours by its header.
    fn ownership(&self, t: &Target, cx: &Context) -> Result<Ownership> {
        let path = t.drop_in();
        Ok(match cx.files.read(&path)? {
            Some(text) if is_ours(&text) => Ownership::Ours,
            Some(_) => Ownership::Foreign {
                path,
                why: "no vgpuctl header".into(),
            },
            None => Ownership::Absent,
        })
    }
    fn restart_hint(&self) -> &'static str {
        "restart CRI-O to apply: systemctl restart crio"
    }
    fn notes(&self, t: &Target, cx: &Context) -> Vec<String> {
        nvidia_note(cx.files.read(&t.main()).ok().flatten().as_deref())
    }
}

/// CRI-O's config files in the order it reads them: the main file (if any), then every file of the
/// drop-in folder by name, except vgpuctl's own drop-in.
fn sources(files: &dyn Files, main: &Path, ours: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    if let Some(text) = files.read(main)? {
        out.push((main.to_path_buf(), text));
    }
    let dir = ours.parent().unwrap_or(Path::new("."));
    for p in files.list(dir)?.into_iter().filter(|p| p != ours) {
        if let Some(text) = files.read(&p)? {
            out.push((p, text));
        }
    }
    Ok(out)
}

pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
    /// Write the drop-in even where a handler `vgpu` of someone else's is defined.
    pub force: bool,
}

/// Whether a drop-in at our path was written by vgpuctl.
pub fn is_ours(text: &str) -> bool {
    text.starts_with(HEADER)
}

/// Deep-merges `over` into `base`, as CRI-O reads a drop-in over what came before.
fn merge(base: &mut Table, over: &Table) {
    for (k, v) in over.iter() {
        match (base.get_mut(k).and_then(Item::as_table_mut), v.as_table()) {
            (Some(b), Some(o)) => merge(b, o),
            _ => {
                base.insert(k, v.clone());
            }
        }
    }
}

/// The drop-in's text, given CRI-O's config files in the order CRI-O reads them (`(path, text)`: crio.conf
/// if there is one, then the other drop-ins of `crio.conf.d/`, by name).
pub fn drop_in(sources: &[(PathBuf, String)], s: &Settings) -> Result<String> {
    let mut doc = DocumentMut::new();
    for (path, text) in sources {
        let d = parse_toml(path, text)?;
        let theirs = d
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("runtimes"))
            .and_then(|r| r.get(RUNTIME));
        if theirs.is_some() && !s.force {
            return Err(foreign(
                path,
                "a CRI-O runtime handler vgpu",
                "defined outside vgpuctl's drop-in",
            ));
        }
        merge(doc.as_table_mut(), d.as_table());
    }
    let runtime = doc.get("crio").and_then(|c| c.get("runtime"));
    // CRI-O's own default handler is runc unless the config names another.
    let default = runtime
        .and_then(|r| r.get("default_runtime"))
        .and_then(Item::as_str)
        .unwrap_or("runc");
    let base = runtime
        .and_then(|r| r.get("runtimes"))
        .and_then(|r| r.get(default))
        .and_then(Item::as_table_like);
    let mut vgpu = Table::new();
    vgpu.insert("runtime_path", Item::Value(Value::from(s.runtime_path)));
    vgpu.insert("runtime_type", Item::Value(Value::from("oci")));
    for key in COPIED {
        if let Some(v) = base.and_then(|b| b.get(key)).and_then(Item::as_value) {
            let mut v = v.clone();
            v.decor_mut().clear();
            vgpu.insert(key, Item::Value(v));
        }
    }
    // Without it CRI-O would use /run/vgpu as runc's state root, mixing runc's state with vgpu's.
    if !vgpu.contains_key("runtime_root") {
        vgpu.insert(
            "runtime_root",
            Item::Value(Value::from(format!("/run/{default}"))),
        );
    }
    vgpu.insert(
        "allowed_annotations",
        Item::Value(Value::Array(Array::from_iter([
            vgpu_ledger::keys::ANNOTATION_PREFIX,
        ]))),
    );

    let mut out = DocumentMut::new();
    let mut crio = Table::new();
    crio.set_implicit(true);
    let mut rt = Table::new();
    rt.set_implicit(!s.set_as_default);
    if s.set_as_default {
        rt.insert("default_runtime", Item::Value(Value::from(RUNTIME)));
    }
    let mut runtimes = Table::new();
    runtimes.set_implicit(true);
    runtimes.insert(RUNTIME, Item::Table(vgpu));
    rt.insert("runtimes", Item::Table(runtimes));
    crio.insert("runtime", Item::Table(rt));
    out.insert("crio", Item::Table(crio));
    let body = out.to_string();
    Ok(format!(
        "{HEADER}{}{body}",
        if body.starts_with('[') { "\n" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::error::EngineError;

    const P: &str = "/etc/crio/crio.conf";
    fn settings(def: bool) -> Settings<'static> {
        Settings {
            runtime_path: "/usr/bin/vgpu-container-runtime",
            set_as_default: def,
            force: false,
        }
    }
    fn sources(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    }
    fn gen(main: Option<&str>, def: bool) -> String {
        let src = main.map(|m| sources(&[(P, m)])).unwrap_or_default();
        drop_in(&src, &settings(def)).unwrap()
    }

    /// The default runtime and its settings come from the drop-ins too, the later file winning, as CRI-O
    /// reads them (CRI-O 1.2x ships crio.conf.d/10-crun.conf making crun the default).
    #[test]
    fn drop_ins_choose_the_default_runtime() {
        let main = "[crio.runtime]\ndefault_runtime = \"runc\"\n[crio.runtime.runtimes.runc]\nruntime_root = \"/run/runc\"\n";
        let crun = "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_root = \"/run/crun\"\nmonitor_path = \"/usr/libexec/crio/conmon\"\n";
        let later = "[crio.runtime.runtimes.crun]\nruntime_root = \"/run/crun-late\"\n";
        let out = drop_in(
            &sources(&[
                (P, main),
                ("/etc/crio/crio.conf.d/10-crun.conf", crun),
                ("/etc/crio/crio.conf.d/20-late.conf", later),
            ]),
            &settings(false),
        )
        .unwrap();
        let d: DocumentMut = out.parse().unwrap();
        let t = &d["crio"]["runtime"]["runtimes"]["vgpu"];
        assert_eq!(t["runtime_root"].as_str(), Some("/run/crun-late"), "{out}");
        assert_eq!(t["monitor_path"].as_str(), Some("/usr/libexec/crio/conmon"));
    }

    /// A handler named vgpu defined in crio.conf or another drop-in is someone else's: refused (our drop-in
    /// would override it), unless --force.
    #[test]
    fn a_foreign_vgpu_handler_is_refused() {
        let theirs = "[crio.runtime.runtimes.vgpu]\nruntime_path = \"/usr/bin/kata-runtime\"\n";
        let src = sources(&[(P, ""), ("/etc/crio/crio.conf.d/50-kata.conf", theirs)]);
        let e = drop_in(&src, &settings(false)).unwrap_err();
        assert!(matches!(e, EngineError::Foreign { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "/etc/crio/crio.conf.d/50-kata.conf: a CRI-O runtime handler vgpu exists and is not vgpu's \
             (defined outside vgpuctl's drop-in); left untouched (configure --force replaces it)"
        );
        let forced = Settings {
            force: true,
            ..settings(false)
        };
        assert!(is_ours(&drop_in(&src, &forced).unwrap()));
    }

    /// A 99-vgpu.toml without vgpuctl's header is someone else's: configure and unconfigure refuse it,
    /// --force replaces it.
    #[test]
    fn foreign_crio_drop_in_is_never_clobbered() {
        use crate::engines::api::Install;
        use crate::engines::files::MemFiles;
        let theirs = "[crio.runtime.runtimes.other]\nruntime_path = \"/usr/bin/crun\"\n";
        let d = "/etc/crio/crio.conf.d/99-vgpu.toml";
        let disk = MemFiles::with(&[(d, theirs)]);
        let install = Install::default();
        let mut cx = Context {
            files: &disk,
            record: Path::new("/var/lib/vgpu/engines.json"),
            install: &install,
            force: false,
        };
        let t = Target::default();
        let e = Crio
            .configure(&t, &SetAsDefault::default(), &cx)
            .unwrap_err();
        assert!(
            matches!(&e, EngineError::Foreign { path, why, .. }
                if path.ends_with("99-vgpu.toml") && why == "no vgpuctl header"),
            "{e}"
        );
        assert!(Crio.unconfigure(&t, &cx).is_err());
        cx.force = true;
        let ch = Crio.configure(&t, &SetAsDefault::default(), &cx).unwrap();
        assert_eq!(ch[0].path, Path::new(d));
        assert!(is_ours(ch[0].contents.as_deref().unwrap()));
        // The drop-in folder's other files are read in name order; vgpuctl's own is not.
        let disk = MemFiles::with(&[
            (P, "[crio.runtime]\ndefault_runtime = \"runc\"\n"),
            (
                "/etc/crio/crio.conf.d/10-crun.conf",
                "[crio.runtime]\ndefault_runtime = \"crun\"\n",
            ),
            (d, &ch[0].contents.clone().unwrap()),
        ]);
        let got = super::sources(&disk, Path::new(P), Path::new(d)).unwrap();
        let names: Vec<_> = got.iter().map(|(p, _)| p.to_str().unwrap()).collect();
        assert_eq!(names, [P, "/etc/crio/crio.conf.d/10-crun.conf"]);
    }

    /// Golden files: tests/golden/crio/<case>.conf (input crio.conf) → <case>.expected.toml (the drop-in).
    #[test]
    fn golden() {
        let n = crate::engines::change::golden("crio", "conf", |case, input| {
            let got = gen(
                if input.is_empty() { None } else { Some(input) },
                case.ends_with("set-as-default"),
            );
            // The drop-in itself is valid TOML naming the handler.
            let d: DocumentMut = got.parse().unwrap();
            assert_eq!(
                d["crio"]["runtime"]["runtimes"]["vgpu"]["runtime_type"].as_str(),
                Some("oci")
            );
            got
        });
        assert!(n >= 3, "golden cases: {n}");
    }

    #[test]
    fn copies_default_runtime_settings() {
        let main = "[crio.runtime]\ndefault_runtime = \"crun\"\n[crio.runtime.runtimes.crun]\nruntime_path = \"/usr/bin/crun\"\nruntime_root = \"/run/crun\" # state\nmonitor_path = \"/usr/libexec/crio/conmon\"\nallowed_annotations = [\"io.kubernetes.cri-o.Devices\"]\n";
        let out = gen(Some(main), false);
        let d: DocumentMut = out.parse().unwrap();
        let t = &d["crio"]["runtime"]["runtimes"]["vgpu"];
        assert_eq!(
            t["runtime_path"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(t["runtime_root"].as_str(), Some("/run/crun"));
        assert_eq!(t["monitor_path"].as_str(), Some("/usr/libexec/crio/conmon"));
        assert_eq!(t["allowed_annotations"].as_array().unwrap().len(), 1);
        assert!(!out.contains("# state"));
        assert!(is_ours(&out));
        assert!(d["crio"]["runtime"].get("default_runtime").is_none());
        assert_eq!(
            gen(Some(main), true).parse::<DocumentMut>().unwrap()["crio"]["runtime"]
                ["default_runtime"]
                .as_str(),
            Some("vgpu")
        );
    }

    #[test]
    fn bad_main_config_is_reported_with_line() {
        let e = drop_in(
            &sources(&[(P, "[crio]\n\n[crio.runtime\n")]),
            &settings(false),
        )
        .unwrap_err();
        assert!(matches!(e, EngineError::Syntax { line: 3, .. }), "{e}");
        assert!(e.to_string().starts_with("/etc/crio/crio.conf:3:"), "{e}");
    }
}
