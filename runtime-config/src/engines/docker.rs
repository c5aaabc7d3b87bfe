//! Docker: the `vgpu` runtime in `/etc/docker/daemon.json` (`runtimes.vgpu.path`, and `default-runtime`
//! with `--set-as-default`). The file is validated as strict JSON (serde_json, which also gives the line of
//! an error) and edited through a concrete syntax tree (jsonc-parser's CST), so everything vgpuctl does
//! not touch keeps its bytes: key order, indentation, inline arrays. Removing what was appended gives the
//! original text back.
use super::api::{ContainerEngine, Context};
use super::change::Change;
use super::error::{EngineError, Result};
use super::ownership::{foreign, Ownership};
use super::record;
use super::shim::{check_runtime_path, is_shim, nvidia_note, ConfigFile, SetAsDefault};
use super::syntax::parse_error;
use jsonc_parser::cst::{CstInputValue, CstObject, CstRootNode};
use jsonc_parser::ParseOptions;
use serde_json::Value;
use std::path::Path;

pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";
const RUNTIME: &str = "vgpu";
const NOT_OBJECT: &str = "the top level is not a JSON object";

/// The engine: `--runtime=docker`.
pub struct Docker;

impl ContainerEngine for Docker {
    type Target = ConfigFile;
    type Options = SetAsDefault;
    fn name(&self) -> &'static str {
        "docker"
    }
    fn title(&self) -> &'static str {
        "Docker"
    }
    fn default_paths(&self) -> &'static [&'static str] {
        &[DEFAULT_CONFIG]
    }
    fn configure(&self, t: &ConfigFile, o: &SetAsDefault, cx: &Context) -> Result<Vec<Change>> {
        check_runtime_path(&cx.install.runtime_path)?;
        let cfg = t.path(DEFAULT_CONFIG);
        let current = cx.files.read(&cfg)?;
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &cfg)?;
        let legacy = cx.files.read(&legacy_path(&cfg))?;
        let s = Settings {
            runtime_path: &cx.install.runtime_path,
            set_as_default: o.set_as_default,
            force: cx.force,
        };
        let c = configure(&cfg, current.as_deref(), &s)?;
        let mut changes = Vec::new();
        // What --set-as-default replaced, unless an earlier configure (this vgpuctl's or an older one's)
        // already remembers it; and that there was no daemon.json, so that unconfigure removes the one it
        // made rather than leave `{}`.
        let created = current.is_none() && prior.is_none();
        let replaced = c
            .replaced_default
            .filter(|_| prior.is_none() && legacy.is_none());
        if created || replaced.is_some() {
            let entry = record::Entry {
                previous_default: replaced.map(|prev| record::PreviousDefault {
                    name: prev,
                    toml: None,
                }),
                created_config: created,
                ..record::Entry::new(self.name(), &cfg)
            };
            changes.extend(record::change(
                cx.record,
                rec_text.as_deref(),
                self.name(),
                &cfg,
                Some(entry),
            )?);
        }
        // The record first: a crash between the two leaves a record unconfigure can use.
        changes.extend(c.changes);
        Ok(changes)
    }
    fn unconfigure(&self, t: &ConfigFile, cx: &Context) -> Result<Vec<Change>> {
        let cfg = t.path(DEFAULT_CONFIG);
        let current = cx.files.read(&cfg)?;
        let (rec_text, prior) = record::read_entry(cx.files, cx.record, self.name(), &cfg)?;
        let legacy_path = legacy_path(&cfg);
        let legacy = cx.files.read(&legacy_path)?;
        // The record's previous default, else an older vgpuctl's file beside daemon.json.
        let prev = match prior.as_ref().and_then(|e| e.previous_default.as_ref()) {
            Some(p) => p.name.clone(),
            None => legacy.as_deref().and_then(read_legacy),
        };
        let mut changes = unconfigure(&cfg, current.as_deref(), prev.as_deref())?;
        // A daemon.json configure created that holds nothing else now goes, as there was none.
        let created = prior.as_ref().is_some_and(|e| e.created_config);
        for c in changes.iter_mut().filter(|c| created && c.path == cfg) {
            let empty = c
                .contents
                .as_deref()
                .and_then(|t| serde_json::from_str::<serde_json::Map<String, Value>>(t).ok());
            if empty.is_some_and(|m| m.is_empty()) {
                *c = Change::remove(cfg.clone());
            }
        }
        if legacy.is_some() {
            changes.push(Change::remove(legacy_path));
        }
        changes.extend(record::change(
            cx.record,
            rec_text.as_deref(),
            self.name(),
            &cfg,
            None,
        )?);
        Ok(changes)
    }
    fn ownership(&self, t: &ConfigFile, cx: &Context) -> Result<Ownership> {
        let cfg = t.path(DEFAULT_CONFIG);
        let Some(text) = cx.files.read(&cfg)?.filter(|t| !t.trim().is_empty()) else {
            return Ok(Ownership::Absent);
        };
        let (_root, obj) = parse(&cfg, &text)?;
        Ok(match foreign_entry(&cfg, &obj)? {
            None => Ownership::Absent,
            Some(None) => Ownership::Ours,
            Some(Some(why)) => Ownership::Foreign { path: cfg, why },
        })
    }
    fn restart_hint(&self) -> &'static str {
        "restart docker to apply: systemctl restart docker"
    }
    fn notes(&self, t: &ConfigFile, cx: &Context) -> Vec<String> {
        nvidia_note(
            cx.files
                .read(&t.path(DEFAULT_CONFIG))
                .ok()
                .flatten()
                .as_deref(),
        )
    }
}

/// What `configure` needs to know.
pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
    /// Replace a `runtimes.vgpu` that is not vgpu's.
    pub force: bool,
}

/// Where vgpuctl before the record (`super::record`) remembered the `default-runtime` that
/// `--set-as-default` replaced: a small hidden file beside daemon.json. Still read (and removed) by
/// unconfigure, for daemon.json files configured by those versions.
pub fn legacy_path(config: &Path) -> std::path::PathBuf {
    let name = config
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    config.with_file_name(format!(".{name}.vgpuctl-previous-default"))
}

/// Checks `text` is a JSON object (as strictly as dockerd does) and returns its syntax tree.
fn parse(path: &Path, text: &str) -> Result<(CstRootNode, CstObject)> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(_)) => {}
        Ok(_) => return Err(EngineError::shape(path, NOT_OBJECT)),
        Err(e) => return Err(parse_error(path, e.line(), e.column(), &e.to_string())),
    }
    let root = CstRootNode::parse(text, &ParseOptions::default())
        .map_err(|e| parse_error(path, e.line_display(), e.column_display(), &e.to_string()))?;
    let obj = root
        .object_value()
        .ok_or_else(|| EngineError::shape(path, NOT_OBJECT))?;
    Ok((root, obj))
}

/// The string value of `obj[key]`: Ok(None) if absent, an error if it is not a string.
fn string_at(path: &Path, obj: &CstObject, key: &str) -> Result<Option<String>> {
    let Some(prop) = obj.get(key) else {
        return Ok(None);
    };
    match prop.value().and_then(|v| v.to_serde_value()) {
        Some(Value::String(s)) => Ok(Some(s)),
        _ => Err(EngineError::shape(
            path,
            format!("\"{key}\" is not a string"),
        )),
    }
}

/// Whether `runtimes.vgpu` is vgpu's: Ok(None) if there is none, Ok(Some(why not)) if it is someone else's.
/// JSON has no comments to mark an entry with, so vgpu's is the one whose `path` is the shim.
fn foreign_entry(path: &Path, obj: &CstObject) -> Result<Option<Option<String>>> {
    let Some(rt) = obj.object_value("runtimes").and_then(|r| r.get(RUNTIME)) else {
        return Ok(None);
    };
    let why = match rt.value().and_then(|v| v.to_serde_value()) {
        Some(Value::Object(o)) => match o.get("path").and_then(Value::as_str) {
            Some(p) if is_shim(p) => None,
            Some(p) => Some(format!("its path is {p}")),
            None => Some("it has no path".into()),
        },
        _ => {
            return Err(EngineError::shape(
                path,
                "\"runtimes.vgpu\" is not a JSON object",
            ))
        }
    };
    Ok(Some(why))
}

/// The daemon.json vgpuctl writes where there was none (or an empty one).
fn fresh(s: &Settings) -> String {
    let mut v = serde_json::json!({ "runtimes": { RUNTIME: { "path": s.runtime_path } } });
    if s.set_as_default {
        v["default-runtime"] = Value::String(RUNTIME.into());
    }
    serde_json::to_string_pretty(&v).expect("a JSON value serializes") + "\n"
}

/// What `configure` does: the new daemon.json (if it changes), and the `default-runtime` it replaced when
/// `--set-as-default` set it now (`Some(None)`: there was none), for vgpuctl's record.
#[derive(Debug, Default)]
pub struct Configured {
    pub changes: Vec<Change>,
    pub replaced_default: Option<Option<String>>,
}

/// The changes that add the vgpu runtime to `path` (whose current text is `current`).
pub fn configure(path: &Path, current: Option<&str>, s: &Settings) -> Result<Configured> {
    let original = match current {
        Some(t) if !t.trim().is_empty() => t,
        _ => {
            return Ok(Configured {
                changes: vec![Change::write(path.to_path_buf(), fresh(s), 0o644)],
                replaced_default: s.set_as_default.then_some(None),
            })
        }
    };
    let (root, obj) = parse(path, original)?;
    if let Some(Some(why)) = foreign_entry(path, &obj)? {
        if !s.force {
            return Err(foreign(path, "runtimes.vgpu", &why));
        }
        // --force: the foreign entry is replaced whole, not merged with ours.
        obj.object_value("runtimes")
            .and_then(|r| r.get(RUNTIME))
            .expect("just found")
            .remove();
    }
    let runtimes = obj
        .object_value_or_create("runtimes")
        .ok_or_else(|| EngineError::shape(path, "\"runtimes\" is not a JSON object"))?;
    match runtimes.get(RUNTIME) {
        None => {
            runtimes.append(
                RUNTIME,
                CstInputValue::Object(vec![("path".into(), s.runtime_path.into())]),
            );
        }
        Some(_) => {
            let rt = runtimes.object_value(RUNTIME).ok_or_else(|| {
                EngineError::shape(path, "\"runtimes.vgpu\" is not a JSON object")
            })?;
            if string_at(path, &rt, "path").ok().flatten().as_deref() != Some(s.runtime_path) {
                match rt.get("path") {
                    Some(p) => p.set_value(s.runtime_path.into()),
                    None => {
                        rt.append("path", s.runtime_path.into());
                    }
                }
            }
        }
    }

    let mut replaced_default = None;
    if s.set_as_default {
        match string_at(path, &obj, "default-runtime")? {
            Some(d) if d == RUNTIME => {}
            Some(d) => {
                replaced_default = Some(Some(d));
                obj.get("default-runtime")
                    .expect("just read")
                    .set_value(RUNTIME.into());
            }
            None => {
                replaced_default = Some(None);
                obj.append("default-runtime", RUNTIME.into());
            }
        }
    }
    let new = root.to_string();
    let mut changes = Vec::new();
    if new != original {
        changes.push(Change::write(path.to_path_buf(), new, 0o644));
    }
    Ok(Configured {
        changes,
        replaced_default,
    })
}

/// Reads the `default-runtime` an older vgpuctl remembered in `legacy_path`.
pub fn read_legacy(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    v.get("default-runtime")?.as_str().map(str::to_string)
}

/// The changes that take back what `configure` added; `previous_default` is the `default-runtime` that
/// configure replaced (from vgpuctl's record, or an older vgpuctl's file), None when there was none or it is
/// not known: a `default-runtime` of vgpu is then removed.
pub fn unconfigure(
    path: &Path,
    current: Option<&str>,
    previous_default: Option<&str>,
) -> Result<Vec<Change>> {
    let Some(original) = current.filter(|t| !t.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    let (root, obj) = parse(path, original)?;
    if let Some(Some(why)) = foreign_entry(path, &obj)? {
        return Err(foreign(path, "runtimes.vgpu", &why));
    }
    if let Some(runtimes) = obj.object_value("runtimes") {
        if let Some(vgpu) = runtimes.get(RUNTIME) {
            vgpu.remove();
            // An empty "runtimes" is what configure created: drop it again.
            if runtimes.properties().is_empty() {
                obj.get("runtimes").expect("just read").remove();
            }
        }
    }
    if string_at(path, &obj, "default-runtime")
        .ok()
        .flatten()
        .as_deref()
        == Some(RUNTIME)
    {
        let prop = obj.get("default-runtime").expect("just read");
        match previous_default {
            // In place, so the key keeps its position.
            Some(prev) => prop.set_value(prev.into()),
            None => prop.remove(),
        }
    }
    let mut changes = Vec::new();
    let new = root.to_string();
    if new != original {
        changes.push(Change::write(path.to_path_buf(), new, 0o644));
    }
    Ok(changes)
}

#[cfg(test)]
mod tests;
