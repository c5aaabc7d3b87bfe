//! vgpu's handler in a drop-in of its own (`--drop-in`), which the main config imports (an `imports`
//! entry is added unless one of its globs already covers the file), as the toolkit's
//! `ConfigWithDropIn` does (config_drop_in.go). Version 3 drop-ins hold only what vgpu adds (containerd
//! 2.x merges); version 2 ones restate the CRI section read before them, as the toolkit's
//! `getBaseDropInConfigTree` does, because containerd 1.x replaces a plugin section whole. Unconfigure
//! removes the drop-in, the folders configure made for it, and (in `main_file`) the import entry.
use super::default_runtime::base_name;
use super::handler::{add_handler, foreign_why, imported_foreign, RUNTIME};
use super::imports::{imports_of, load_chain, merged_view, view_containerd, Source};
use super::marks::{is_our_drop_in, DROP_IN_HEADER, DROP_IN_V2_NOTE};
use super::settings::Settings;
use super::tables::child;
use super::version::{cri_plugin, version_of};
use crate::engines::change::Change;
use crate::engines::error::{EngineError, Result};
use crate::engines::files::Files;
use crate::engines::ownership::foreign;
use crate::engines::record::{Entry, ImportAdded};
use std::path::{Path, PathBuf};
use toml_edit::{Array, DocumentMut, Item, Table, Value};

/// The handler written into vgpuctl's drop-in `target`, imported from the main file. Returns the drop-in's
/// change, if any; the main file's edit (an `imports` entry) is left in `doc`.
pub fn configure_drop_in(
    path: &Path,
    doc: &mut DocumentMut,
    version: i64,
    files: &dyn Files,
    target: &Path,
    entry: &mut Entry,
    s: &Settings,
) -> Result<Option<Change>> {
    let plugin = cri_plugin(version);
    if target == path {
        return Err(EngineError::DropInIsMain {
            target: target.to_path_buf(),
        });
    }
    let main = Source {
        path: path.to_path_buf(),
        doc: Some(doc.clone()),
        ours: false,
    };
    if main.vgpu(version).is_some_and(|v| foreign_why(v).is_none()) {
        return Err(EngineError::HandlerInMainFile {
            path: path.to_path_buf(),
        });
    }
    let existing = files.read(target)?;
    if let Some(text) = &existing {
        if !is_our_drop_in(text) && !s.force {
            return Err(foreign(target, "the file", "no vgpuctl header"));
        }
    }
    let chain = load_chain(path, doc, files, Some(target), true)?;
    if let Some(other) = chain.iter().find(|c| c.ours && c.path != target) {
        return Err(EngineError::OtherDropIn {
            path: path.to_path_buf(),
            other: other.path.clone(),
            target: target.to_path_buf(),
        });
    }
    // The main file must import the drop-in; an entry (or glob) that already does is left as it is.
    let still_there = |ia: &ImportAdded| imports_of(path, doc).is_ok_and(|i| i.contains(&ia.entry));
    entry.import_added = entry.import_added.take().filter(still_there);
    let chain = if chain.iter().any(|c| c.path == target) {
        chain
    } else {
        let name = target.to_string_lossy().into_owned();
        let created_key = !doc.contains_key("imports");
        if created_key {
            doc.insert("imports", Item::Value(Value::Array(Array::new())));
        }
        doc["imports"]
            .as_array_mut()
            .ok_or_else(|| EngineError::shape(path, "`imports` is not an array of strings"))?
            .push(name.as_str());
        entry.import_added = Some(ImportAdded {
            entry: name,
            created_key,
        });
        load_chain(path, doc, files, Some(target), true)?
    };
    let at = chain
        .iter()
        .position(|c| c.path == target)
        .expect("the drop-in is imported now");
    let (before, after) = (&chain[..at], &chain[at + 1..]);
    for src in before.iter().filter(|c| !c.ours) {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            if !s.force {
                return Err(foreign(
                    &src.path,
                    "the containerd runtime handler vgpu",
                    &why,
                ));
            }
        }
    }
    for src in after.iter().filter(|c| !c.ours) {
        if let Some(why) = src.vgpu(version).and_then(foreign_why) {
            return Err(imported_foreign(&src.path, &why, target));
        }
        if version < 3 && src.cri(version).is_some() {
            return Err(EngineError::RestatesAfterDropIn {
                src: src.path.clone(),
                plugin: plugin.to_string(),
                target: target.to_path_buf(),
            });
        }
        if s.set_as_default && src.sets_default(version) {
            return Err(EngineError::DefaultOverridden {
                src: src.path.clone(),
                target: target.to_path_buf(),
                drop_in: true,
            });
        }
    }
    let view = merged_view(before.iter().filter(|c| !c.ours), version);
    let view_ctd = view_containerd(&view);
    let view_runtimes = view_ctd
        .get("runtimes")
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default();
    let base = base_name(&view_ctd, None, None);

    // Version 2: the whole CRI section as containerd 1.x would see it so far (it replaces sections whole);
    // version 3: only what vgpu adds (containerd 2.x merges).
    let mut cri = if version < 3 { view } else { Table::new() };
    let mut out = DocumentMut::new();
    out.insert("version", Item::Value(Value::from(version)));
    {
        let containerd = child(&mut cri, "containerd", target)?;
        if s.set_as_default {
            containerd.insert("default_runtime_name", Item::Value(Value::from(RUNTIME)));
        }
        let runtimes = child(containerd, "runtimes", target)?;
        // --force: a foreign handler of an earlier file, restated here (version 2), is replaced whole.
        if runtimes.get(RUNTIME).and_then(foreign_why).is_some() {
            runtimes.remove(RUNTIME);
        }
        add_handler(runtimes, &view_runtimes, &base, s.runtime_path, target)?;
    }
    cri.set_implicit(version >= 3);
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(plugin, Item::Table(cri));
    out.insert("plugins", Item::Table(plugins));
    let note = if version < 3 { DROP_IN_V2_NOTE } else { "" };
    let text = format!("{DROP_IN_HEADER}{note}\n{out}");
    if existing.is_none() {
        // The folders written with a new drop-in that were not there: unconfigure removes them again.
        entry.drop_in_dirs_created = target
            .parent()
            .and_then(|p| p.ancestors().take_while(|d| !files.is_dir(d)).last())
            .map(Path::to_path_buf);
    }
    entry.drop_in = Some(target.to_path_buf());
    Ok((existing.as_deref() != Some(text.as_str()))
        .then(|| Change::write(target.to_path_buf(), text, 0o644)))
}

/// vgpuctl's drop-ins to remove on unconfigure: the one `drop_in` names, the record's, and any file with
/// vgpuctl's header among those containerd reads from the main file `path` (`doc`, if there is one).
pub fn removals(
    path: &Path,
    doc: Option<&DocumentMut>,
    files: &dyn Files,
    prior: Option<&Entry>,
    drop_in: Option<&Path>,
) -> Result<Vec<Change>> {
    let mut drop_ins: Vec<PathBuf> = drop_in
        .map(Path::to_path_buf)
        .into_iter()
        .chain(prior.and_then(|e| e.drop_in.clone()))
        .collect();
    if let Some(doc) = doc {
        version_of(path, doc)?;
        let chain = load_chain(path, doc, files, None, false)?;
        drop_ins.extend(chain.into_iter().filter(|c| c.ours).map(|c| c.path));
    }
    let mut removals = Vec::new();
    for d in drop_ins {
        if removals.iter().any(|c: &Change| c.path == d) {
            continue;
        }
        match files.read(&d)? {
            Some(t) if is_our_drop_in(&t) => removals.push(Change::remove(d)),
            Some(_) => return Err(foreign(&d, "the file", "no vgpuctl header")),
            None => {}
        }
    }
    Ok(removals)
}

/// The folders configure created for the recorded drop-in, deepest first (each removed only if empty),
/// when the drop-in is among `removals`.
pub fn folders_made(prior: Option<&Entry>, removals: &[Change]) -> Vec<Change> {
    let mut dirs = Vec::new();
    if let Some((d, top)) =
        prior.and_then(|e| e.drop_in.as_ref().zip(e.drop_in_dirs_created.as_ref()))
    {
        if removals.iter().any(|c| &c.path == d) && d.starts_with(top) {
            for dir in d.ancestors().skip(1) {
                dirs.push(Change::remove_empty_dir(dir.to_path_buf()));
                if dir == top {
                    break;
                }
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests;
