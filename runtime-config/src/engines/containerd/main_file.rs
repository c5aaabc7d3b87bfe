//! vgpu's handler edited into containerd's main config (the default, without `--drop-in`), and taken out
//! again. The files the main config imports are only read: one that would override the handler (a
//! version 2 file restating the CRI section, a later `default_runtime_name`, a foreign `vgpu` handler)
//! is refused with one line pointing at `--drop-in`.
use super::default_runtime::{base_name, restore_default, set_default};
use super::handler::{add_handler, foreign_why, imported_foreign, RUNTIME};
use super::imports::{imports_of, load_chain, merged_view, view_containerd};
use super::marks::{is_our_drop_in, marked, CREATED, RUNC_RESTATED};
use super::settings::Settings;
use super::tables::{child, prune};
use super::version::{cri_plugin, version_of};
use crate::engines::change::Change;
use crate::engines::error::{EngineError, Result};
use crate::engines::files::Files;
use crate::engines::ownership::foreign;
use crate::engines::record::{Entry, ImportAdded};
use std::path::Path;
use toml_edit::{DocumentMut, Item};

/// The handler edited into the main file.
pub fn configure_main(
    path: &Path,
    doc: &mut DocumentMut,
    version: i64,
    files: &dyn Files,
    entry: &mut Entry,
    s: &Settings,
) -> Result<()> {
    let plugin = cri_plugin(version);
    let chain = load_chain(path, doc, files, None, true)?;
    let recorded = entry.drop_in.as_ref().filter(|d| {
        files
            .read(d)
            .ok()
            .flatten()
            .is_some_and(|t| is_our_drop_in(&t))
    });
    if let Some(d) = chain.iter().find(|c| c.ours).map(|c| &c.path).or(recorded) {
        return Err(EngineError::ConfiguredThroughDropIn {
            path: path.to_path_buf(),
            drop_in: d.clone(),
        });
    }
    for src in &chain[1..] {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            return Err(imported_foreign(&src.path, &why, path));
        }
        if version < 3 && src.cri(version).is_some() {
            return Err(EngineError::RestatesMain {
                src: src.path.clone(),
                plugin: plugin.to_string(),
                main: path.to_path_buf(),
            });
        }
        if s.set_as_default && src.sets_default(version) {
            return Err(EngineError::DefaultOverridden {
                src: src.path.clone(),
                target: path.to_path_buf(),
                drop_in: false,
            });
        }
    }
    let view = merged_view(&chain, version);
    let view_ctd = view_containerd(&view);
    let view_runtimes = view_ctd
        .get("runtimes")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default();
    // Nothing of a drop-in is left to remember (an import entry still there would have failed the chain).
    entry.drop_in = None;
    entry.drop_in_dirs_created = None;
    let still_there = |ia: &ImportAdded| imports_of(path, doc).is_ok_and(|i| i.contains(&ia.entry));
    entry.import_added = entry.import_added.take().filter(still_there);

    let plugins = child(doc.as_table_mut(), "plugins", path)?;
    let cri = child(plugins, plugin, path)?;
    let containerd = child(cri, "containerd", path)?;
    let base = base_name(&view_ctd, Some(&*entry), Some(&*containerd));
    if s.set_as_default {
        if let Some(prev) = set_default(containerd) {
            entry.previous_default = Some(prev);
        }
    }
    let runtimes = child(containerd, "runtimes", path)?;
    if let Some(why) = runtimes.get(RUNTIME).and_then(foreign_why) {
        if !s.force {
            return Err(foreign(path, "the containerd runtime handler vgpu", &why));
        }
        // --force: replaced whole, nothing of the foreign handler's settings kept.
        runtimes.remove(RUNTIME);
    }
    add_handler(runtimes, &view_runtimes, &base, s.runtime_path, path)
}

/// Takes vgpu's handler (and `--set-as-default`, and the `imports` entry vgpuctl added for its drop-in) out
/// of the main file `path` whose text is `text`. `leave_foreign`: a foreign handler here is not in the way
/// (vgpu was configured through a drop-in), so it is left without an error.
pub fn unconfigure_main(
    path: &Path,
    text: &str,
    mut doc: DocumentMut,
    prior: Option<&Entry>,
    leave_foreign: bool,
) -> Result<Option<Change>> {
    let version = version_of(path, &doc)?;
    let plugin = cri_plugin(version);
    let foreign_here = doc
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|c| c.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(RUNTIME))
        .and_then(foreign_why);
    if let Some(why) = &foreign_here {
        if !leave_foreign {
            return Err(foreign(path, "the containerd runtime handler vgpu", why));
        }
    }
    if let Some(containerd) = doc
        .get_mut("plugins")
        .and_then(Item::as_table_mut)
        .and_then(|p| p.get_mut(plugin))
        .and_then(Item::as_table_mut)
        .and_then(|c| c.get_mut("containerd"))
        .and_then(Item::as_table_mut)
        .filter(|_| foreign_here.is_none())
    {
        restore_default(containerd, prior);
        if let Some(runtimes) = containerd.get_mut("runtimes").and_then(Item::as_table_mut) {
            runtimes.remove(RUNTIME);
            if runtimes
                .get("runc")
                .and_then(Item::as_table)
                .is_some_and(|t| marked(t, RUNC_RESTATED))
            {
                runtimes.remove("runc");
            }
        }
        prune(containerd, "runtimes");
        // Walk back up, dropping the header-less tables configure had to create.
        let plugins = doc["plugins"].as_table_mut().expect("found above");
        prune(
            plugins[plugin].as_table_mut().expect("found above"),
            "containerd",
        );
        prune(plugins, plugin);
        prune(doc.as_table_mut(), "plugins");
    }
    if let Some(ia) = prior.and_then(|e| e.import_added.as_ref()) {
        if let Some(imports) = doc.get_mut("imports").and_then(Item::as_array_mut) {
            let at = imports
                .iter()
                .position(|v| v.as_str() == Some(ia.entry.as_str()));
            if let Some(i) = at {
                imports.remove(i);
            }
            if imports.is_empty() && ia.created_key {
                doc.remove("imports");
            }
        }
    }
    let new = doc.to_string();
    if new == text {
        return Ok(None);
    }
    // A file vgpuctl created from nothing goes away again once only its version is left.
    if new.starts_with(CREATED) && doc.len() == 1 && doc.contains_key("version") {
        return Ok(Some(Change::remove(path.to_path_buf())));
    }
    Ok(Some(Change::write(path.to_path_buf(), new, 0o644)))
}

#[cfg(test)]
mod tests {
    use super::super::marks::HEADER_ADDED;
    use super::super::testing::*;
    use super::*;
    use crate::engines::containerd::{configure, unconfigure};
    use crate::engines::files::MemFiles;

    #[test]
    fn missing_file_gets_minimal_config_and_unconfigure_removes_it() {
        let out = conf(None, false);
        assert!(out.starts_with(CREATED));
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        let ch = unconfigure(Path::new(P), Some(&out), &MemFiles::default(), None, None).unwrap();
        assert_eq!(ch, vec![Change::remove(P.into())]);
    }

    #[test]
    fn tables_created_on_the_way_are_removed_again() {
        let orig = "version = 2\n# only this\n[debug]\n  level = \"info\"\n";
        let out = conf(Some(orig), false);
        assert_eq!(unconf(&out).unwrap(), orig);
        let (out, entry) = conf_e(Some(orig), true, None);
        assert!(out.contains(HEADER_ADDED));
        assert_eq!(unconf_e(&out, Some(&entry)).unwrap(), orig);
    }

    #[test]
    fn bad_input_is_reported_with_line() {
        let cfg = |text: &str| {
            configure(
                Path::new(P),
                Some(text),
                &MemFiles::default(),
                None,
                &s(false),
            )
            .map(|_| ())
            .unwrap_err()
        };
        let e = cfg("version = 2\n[plugins\nfoo = 1\n");
        assert!(matches!(e, EngineError::Syntax { line: 2, .. }), "{e}");
        assert!(
            e.to_string().starts_with("/etc/containerd/config.toml:2:"),
            "{e}"
        );
        let e = cfg("[plugins.cri]\nx = 1\n");
        assert!(matches!(e, EngineError::NoVersion { .. }), "{e}");
        let e = cfg("version = 4\n");
        assert!(
            matches!(&e, EngineError::UnsupportedVersion { version, .. } if version == "4"),
            "{e}"
        );
        let e = cfg("version = 2\nimports = \"/etc/containerd/conf.d/*.toml\"\n");
        assert!(matches!(e, EngineError::Shape { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "/etc/containerd/config.toml: `imports` is not an array of strings"
        );
    }
}
