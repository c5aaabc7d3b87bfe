//! containerd's config as containerd reads it: the main file, then each file it imports, then their
//! imports, each file once (containerd's `LoadConfigWithPlugins`, cmd/containerd/server/config); an entry
//! is relative to the importing file's folder and, with a `*`, a glob whose matches come in name order
//! (`resolveImports`). How a later file combines with what came before depends on the version: containerd
//! 1.x (config version 2) replaces a whole plugin section with a later file's, containerd 2.x (version 3)
//! merges key by key (`mergeConfig`: tables deeply, arrays appended, other values overridden). The
//! default runtime and the settings vgpu's handler copies come from that merged view.
use super::handler::RUNTIME;
use super::marks::is_our_drop_in;
use super::tables::{bare, table_of};
use super::version::cri_plugin;
use crate::engines::error::{EngineError, Result};
use crate::engines::files::{glob_matches, Files};
use crate::engines::syntax::parse_toml;
use std::collections::{HashSet, VecDeque};
use std::path::{Component, Path, PathBuf};
use toml_edit::{DocumentMut, Item, Table, Value};

/// `p` with `.` and `..` resolved lexically, as Go's `filepath.Clean`.
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// One file of containerd's config, in the order containerd reads them.
pub struct Source {
    pub path: PathBuf,
    /// None: vgpuctl's drop-in, which is about to be (re)written.
    pub doc: Option<DocumentMut>,
    /// A drop-in vgpuctl wrote (its header), at this path or another.
    pub ours: bool,
}

impl Source {
    /// This file's CRI runtime plugin section, read at the file's own config version (the main file's
    /// when it names none).
    pub fn cri(&self, root_version: i64) -> Option<&Item> {
        let doc = self.doc.as_ref()?;
        let v = doc
            .get("version")
            .and_then(Item::as_integer)
            .unwrap_or(root_version);
        doc.get("plugins")?.get(cri_plugin(v))
    }
    pub fn containerd(&self, root_version: i64) -> Option<&Item> {
        self.cri(root_version)?.get("containerd")
    }
    pub fn vgpu(&self, root_version: i64) -> Option<&Item> {
        self.containerd(root_version)?.get("runtimes")?.get(RUNTIME)
    }
    pub fn sets_default(&self, root_version: i64) -> bool {
        self.containerd(root_version)
            .and_then(|c| c.get("default_runtime_name"))
            .is_some()
    }
}

/// The `imports` of a file (each entry as written).
pub fn imports_of(path: &Path, doc: &DocumentMut) -> Result<Vec<String>> {
    let Some(item) = doc.get("imports") else {
        return Ok(vec![]);
    };
    let err = || EngineError::shape(path, "`imports` is not an array of strings");
    item.as_array()
        .ok_or_else(err)?
        .iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(err))
        .collect()
}

/// An `imports` entry of `parent` as the paths containerd loads: relative to the parent's folder, a glob's
/// matches in name order; `target` (vgpuctl's drop-in, which may not exist yet) among them when it matches.
pub fn resolve(
    parent: &Path,
    entry: &str,
    files: &dyn Files,
    target: Option<&Path>,
) -> Result<Vec<PathBuf>> {
    let p = Path::new(entry);
    let p = clean(&if p.is_absolute() {
        p.to_path_buf()
    } else {
        parent.parent().unwrap_or(Path::new("/")).join(p)
    });
    // As containerd: a glob only when there is a `*`.
    if !entry.contains('*') {
        return Ok(vec![p]);
    }
    let mut out = files.glob(&p)?;
    if let Some(t) = target {
        if glob_matches(&p, t)? && !out.iter().any(|m| m == t) {
            out.push(t.to_path_buf());
        }
    }
    out.sort();
    Ok(out)
}

/// containerd's config files in the order it reads them, starting from the main file `main` (its current
/// document `main_doc`). `target`, vgpuctl's drop-in, is listed without being read. A missing import is an
/// error when `strict` (containerd would not start), skipped otherwise.
pub fn load_chain(
    main: &Path,
    main_doc: &DocumentMut,
    files: &dyn Files,
    target: Option<&Path>,
    strict: bool,
) -> Result<Vec<Source>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut pending = VecDeque::from([(main.to_path_buf(), main.to_path_buf())]);
    while let Some((path, parent)) = pending.pop_front() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let src = if path == main {
            Source {
                path,
                doc: Some(main_doc.clone()),
                ours: false,
            }
        } else if Some(path.as_path()) == target {
            Source {
                path,
                doc: None,
                ours: true,
            }
        } else {
            match files.read(&path)? {
                Some(text) => Source {
                    doc: Some(parse_toml(&path, &text)?),
                    ours: is_our_drop_in(&text),
                    path,
                },
                None if strict => {
                    return Err(EngineError::MissingImport {
                        parent: parent.to_path_buf(),
                        path,
                    })
                }
                None => continue,
            }
        };
        if let Some(doc) = &src.doc {
            for entry in imports_of(&src.path, doc)? {
                for p in resolve(&src.path, &entry, files, target)? {
                    pending.push_back((p, src.path.clone()));
                }
            }
        }
        out.push(src);
    }
    Ok(out)
}

/// containerd 2.x's merge of a later file into what came before: tables key by key, arrays appended (each
/// element once), other values replaced.
pub fn merge(base: &mut Table, over: &Table) {
    for (k, v) in over.iter() {
        match (base.get_mut(k), v) {
            (Some(Item::Table(b)), Item::Table(o)) => merge(b, o),
            (Some(Item::Value(Value::Array(b))), Item::Value(Value::Array(o))) => {
                for x in o.iter() {
                    if !b.iter().any(|y| bare(y) == bare(x)) {
                        b.push(x.clone());
                    }
                }
            }
            _ => {
                base.insert(k, v.clone());
            }
        }
    }
}

/// The CRI runtime plugin section as containerd sees it after reading `sources` in order: version 2
/// (containerd 1.x) takes the last file's section whole, version 3 (containerd 2.x) merges them.
pub fn merged_view<'a>(sources: impl IntoIterator<Item = &'a Source>, version: i64) -> Table {
    let mut view = Table::new();
    for s in sources {
        if let Some(t) = s.cri(version).and_then(table_of) {
            if version >= 3 {
                merge(&mut view, &t);
            } else {
                view = t;
            }
        }
    }
    view
}

/// `view`'s `containerd` table (empty if none).
pub fn view_containerd(view: &Table) -> Table {
    view.get("containerd")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::engines::containerd::{configure, unconfigure, Settings};
    use crate::engines::files::MemFiles;

    /// `mergeConfig`'s rules, as containerd 2.x applies them between files.
    #[test]
    fn version_3_merges_key_by_key() {
        let a: DocumentMut = "x = 1\nl = ['a']\n[t]\nk = 1\nj = 2\n".parse().unwrap();
        let b: DocumentMut = "x = 2\nl = ['a', 'b']\n[t]\nk = 3\n".parse().unwrap();
        let mut m = a.as_table().clone();
        merge(&mut m, b.as_table());
        let d = DocumentMut::from(m);
        assert_eq!(d["x"].as_integer(), Some(2), "values overridden");
        assert_eq!(
            d["l"].as_array().unwrap().len(),
            2,
            "arrays appended, each element once"
        );
        assert_eq!(
            (d["t"]["k"].as_integer(), d["t"]["j"].as_integer()),
            (Some(3), Some(2))
        );
    }

    /// `resolveImports`: relative to the importer's folder, cleaned, globs in name order, and vgpuctl's
    /// drop-in (not written yet) among a glob's matches.
    #[test]
    fn imports_resolve_as_containerd_resolves_them() {
        let f = MemFiles::with(&[("/etc/c/conf.d/b.toml", ""), ("/etc/c/conf.d/a.toml", "")]);
        let main = Path::new("/etc/c/config.toml");
        assert_eq!(
            resolve(main, "x/../y.toml", &f, None).unwrap(),
            [Path::new("/etc/c/y.toml")]
        );
        let got = resolve(
            main,
            "conf.d/*.toml",
            &f,
            Some(Path::new("/etc/c/conf.d/99-vgpu.toml")),
        );
        let want = [
            "/etc/c/conf.d/99-vgpu.toml",
            "/etc/c/conf.d/a.toml",
            "/etc/c/conf.d/b.toml",
        ];
        assert_eq!(got.unwrap(), want.map(PathBuf::from));
    }

    /// The default runtime and the options copied come from the merged view: here an import (relative glob,
    /// relative to the main file's folder) makes nvidia the default, so its options are copied; the import
    /// itself is never written.
    #[test]
    fn imports_are_read_for_the_default_runtime() {
        let mut disk = MemFiles::with(&[
            (P, V3_MAIN),
            ("/etc/containerd/conf.d/50-nvidia.toml", V3_NVIDIA),
        ]);
        let c = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap();
        assert_eq!(c.changes.len(), 1);
        assert_eq!(
            c.changes[0].path,
            Path::new(P),
            "only the main file is written"
        );
        disk.apply(&c.changes);
        let t = vgpu_table(disk.get(P).unwrap(), "io.containerd.cri.v1.runtime");
        assert_eq!(
            t["options"]["SystemdCgroup"].as_bool(),
            Some(true),
            "nvidia's options"
        );
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        // Absolute and non-glob entries too; a missing one is one line naming who imports it.
        let main = "version = 3\nimports = ['/opt/ctd/extra.toml', 'missing.toml']\n";
        let disk = MemFiles::with(&[(P, main), ("/opt/ctd/extra.toml", V3_NVIDIA)]);
        let e = configure(Path::new(P), disk.get(P), &disk, None, &s(false)).unwrap_err();
        assert!(
            matches!(&e, EngineError::MissingImport { path, .. }
                if path == Path::new("/etc/containerd/missing.toml")),
            "{e}"
        );
        // The line the operator reads, whole.
        assert_eq!(
            e.to_string(),
            "/etc/containerd/config.toml: imports /etc/containerd/missing.toml, which does not exist \
             (containerd would not start); fix the imports first"
        );
    }

    /// A vgpu handler in an import vgpuctl did not write: refused, with --force too (vgpuctl never edits
    /// it, and it is read after the main file); unconfigure leaves it.
    #[test]
    fn a_foreign_handler_in_an_import_is_refused() {
        let kata = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.vgpu]\n  runtime_type = 'io.containerd.kata.v2'\n";
        let disk = MemFiles::with(&[(P, V3_MAIN), ("/etc/containerd/conf.d/20-kata.toml", kata)]);
        for force in [false, true] {
            let st = Settings { force, ..s(false) };
            let e = configure(Path::new(P), disk.get(P), &disk, None, &st).unwrap_err();
            assert!(matches!(e, EngineError::ImportedForeign { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with("/etc/containerd/conf.d/20-kata.toml: the containerd runtime handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2"),
                "{msg}"
            );
            assert!(
                msg.contains("vgpuctl does not edit files it did not write"),
                "{msg}"
            );
        }
        assert!(unconfigure(Path::new(P), disk.get(P), &disk, None, None)
            .unwrap()
            .is_empty());
    }
}
