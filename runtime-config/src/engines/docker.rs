//! Docker: the `vgpu` runtime in `/etc/docker/daemon.json` (`runtimes.vgpu.path`, and `default-runtime`
//! with `--set-as-default`). The file is JSON: every other key is kept in its place (serde_json with
//! `preserve_order`) and the file's indentation is kept.
use super::{parse_error, Change};
use anyhow::{bail, Result};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::Path;

pub const DEFAULT_CONFIG: &str = "/etc/docker/daemon.json";
const RUNTIME: &str = "vgpu";

/// What `configure` needs to know.
pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
}

/// JSON has no comments, so the `default-runtime` that `--set-as-default` replaced is remembered in a
/// small file beside daemon.json; unconfigure puts it back and removes that file.
pub fn undo_path(config: &Path) -> std::path::PathBuf {
    let name = config.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    config.with_file_name(format!(".{name}.vgpuctl-previous-default"))
}

fn parse(path: &Path, text: &str) -> Result<Map<String, Value>> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => bail!("{}: the top level is not a JSON object", path.display()),
        Err(e) => Err(parse_error(path, e.line(), e.column(), &e.to_string())),
    }
}

/// The file's own indentation (first indented line), so a rewrite changes only what vgpuctl changes.
fn indent_of(text: &str) -> String {
    text.lines()
        .skip(1)
        .find_map(|l| {
            let ws: String = l.chars().take_while(|c| *c == ' ' || *c == '\t').collect();
            (!ws.is_empty()).then_some(ws)
        })
        .unwrap_or_else(|| "  ".to_string())
}

fn render(map: &Map<String, Value>, original: &str) -> Result<String> {
    let indent = indent_of(original);
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    map.serialize(&mut ser)?;
    let mut s = String::from_utf8(out)?;
    if original.is_empty() || original.ends_with('\n') {
        s.push('\n');
    }
    Ok(s)
}

fn runtimes_mut<'a>(path: &Path, map: &'a mut Map<String, Value>) -> Result<&'a mut Map<String, Value>> {
    let v = map.entry("runtimes").or_insert_with(|| Value::Object(Map::new()));
    match v {
        Value::Object(m) => Ok(m),
        _ => bail!("{}: \"runtimes\" is not a JSON object", path.display()),
    }
}

/// The changes that add the vgpu runtime to `path` (whose current text is `current`).
pub fn configure(path: &Path, current: Option<&str>, previous_default: Option<&str>, s: &Settings) -> Result<Vec<Change>> {
    let original = current.unwrap_or("");
    let mut map = parse(path, original)?;
    let runtimes = runtimes_mut(path, &mut map)?;
    let entry = runtimes.entry(RUNTIME).or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(rt) = entry else { bail!("{}: \"runtimes.vgpu\" is not a JSON object", path.display()) };
    rt.insert("path".into(), Value::String(s.runtime_path.into()));

    let mut changes = Vec::new();
    if s.set_as_default {
        match map.get("default-runtime") {
            Some(Value::String(d)) if d == RUNTIME => {}
            Some(Value::String(d)) => {
                // Remember what was there, unless an earlier configure already did.
                if previous_default.is_none() {
                    changes.push(Change::write(undo_path(path), current_undo(d)?, 0o600));
                }
                map.insert("default-runtime".into(), Value::String(RUNTIME.into()));
            }
            Some(_) => bail!("{}: \"default-runtime\" is not a string", path.display()),
            None => {
                map.insert("default-runtime".into(), Value::String(RUNTIME.into()));
            }
        }
    }
    let new = render(&map, original)?;
    if current != Some(new.as_str()) {
        changes.insert(0, Change::write(path.to_path_buf(), new, 0o644));
    }
    Ok(changes)
}

fn current_undo(previous: &str) -> Result<String> {
    Ok(serde_json::to_string(&serde_json::json!({ "default-runtime": previous }))? + "\n")
}

/// Reads the remembered `default-runtime`, if `configure --set-as-default` replaced one.
pub fn read_undo(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    v.get("default-runtime")?.as_str().map(str::to_string)
}

/// The changes that take back what `configure` added.
pub fn unconfigure(path: &Path, current: Option<&str>, previous_default: Option<&str>) -> Result<Vec<Change>> {
    let Some(original) = current else { return Ok(Vec::new()) };
    let mut map = parse(path, original)?;
    let mut touched = false;
    if let Some(Value::Object(runtimes)) = map.get_mut("runtimes") {
        touched |= runtimes.shift_remove(RUNTIME).is_some();
        // An empty "runtimes" is what configure created: drop it again.
        if touched && runtimes.is_empty() {
            map.shift_remove("runtimes");
        }
    }
    let mut changes = Vec::new();
    if map.get("default-runtime").and_then(Value::as_str) == Some(RUNTIME) {
        touched = true;
        match previous_default {
            // In place, so the key keeps its position.
            Some(prev) => {
                map.insert("default-runtime".into(), Value::String(prev.into()));
            }
            None => {
                map.shift_remove("default-runtime");
            }
        }
    }
    if previous_default.is_some() {
        changes.push(Change::remove(undo_path(path)));
    }
    if touched {
        changes.insert(0, Change::write(path.to_path_buf(), render(&map, original)?, 0o644));
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::apply_in_memory;
    use proptest::prelude::*;

    const P: &str = "/etc/docker/daemon.json";
    fn settings(def: bool) -> Settings<'static> {
        Settings { runtime_path: "/usr/bin/vgpu-container-runtime", set_as_default: def }
    }
    fn conf(text: Option<&str>, def: bool) -> Option<String> {
        let ch = configure(Path::new(P), text, None, &settings(def)).unwrap();
        apply_in_memory(&ch, P, text)
    }

    #[test]
    fn adds_runtime_keeping_other_keys_in_order() {
        let orig = "{\n    \"log-driver\": \"journald\",\n    \"runtimes\": {\n        \"crun\": {\n            \"path\": \"/usr/bin/crun\"\n        }\n    },\n    \"storage-driver\": \"overlay2\"\n}\n";
        let out = conf(Some(orig), false).unwrap();
        assert_eq!(
            out,
            "{\n    \"log-driver\": \"journald\",\n    \"runtimes\": {\n        \"crun\": {\n            \"path\": \"/usr/bin/crun\"\n        },\n        \"vgpu\": {\n            \"path\": \"/usr/bin/vgpu-container-runtime\"\n        }\n    },\n    \"storage-driver\": \"overlay2\"\n}\n"
        );
        // Idempotent: a second configure changes nothing.
        assert!(configure(Path::new(P), Some(&out), None, &settings(false)).unwrap().is_empty());
        // And unconfigure gives back the original bytes.
        let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
        assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
    }

    #[test]
    fn missing_or_empty_file_gets_a_minimal_one() {
        for start in [None, Some(""), Some("  \n")] {
            let out = conf(start, false).unwrap();
            assert_eq!(out, "{\n  \"runtimes\": {\n    \"vgpu\": {\n      \"path\": \"/usr/bin/vgpu-container-runtime\"\n    }\n  }\n}\n");
        }
    }

    #[test]
    fn set_as_default_remembers_and_restores_previous_default() {
        let orig = "{\n  \"default-runtime\": \"crun\",\n  \"debug\": true\n}\n";
        let ch = configure(Path::new(P), Some(orig), None, &settings(true)).unwrap();
        assert_eq!(ch.len(), 2);
        let out = apply_in_memory(&ch, P, Some(orig)).unwrap();
        assert!(out.contains("\"default-runtime\": \"vgpu\""));
        let undo = ch[1].contents.as_deref().unwrap();
        assert_eq!(read_undo(undo).as_deref(), Some("crun"));
        let ch = unconfigure(Path::new(P), Some(&out), Some("crun")).unwrap();
        assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
        assert!(ch[1].contents.is_none(), "the remembered default is removed");
    }

    #[test]
    fn set_as_default_without_previous_removes_key_on_undo() {
        let orig = "{\n  \"debug\": true\n}\n";
        let out = conf(Some(orig), true).unwrap();
        let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
        assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
    }

    #[test]
    fn unconfigure_of_unconfigured_file_touches_nothing() {
        assert!(unconfigure(Path::new(P), Some("{\"a\": 1}"), None).unwrap().is_empty());
        assert!(unconfigure(Path::new(P), None, None).unwrap().is_empty());
    }

    #[test]
    fn parse_error_names_path_and_line() {
        let e = configure(Path::new(P), Some("{\n  \"a\": 1,\n  oops\n}"), None, &settings(false)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.starts_with("/etc/docker/daemon.json:3:"), "{msg}");
        let e = configure(Path::new(P), Some("[1]"), None, &settings(false)).unwrap_err();
        assert!(format!("{e:#}").contains("not a JSON object"));
        let e = configure(Path::new(P), Some("{\"runtimes\": 3}"), None, &settings(false)).unwrap_err();
        assert!(format!("{e:#}").contains("\"runtimes\" is not a JSON object"));
    }

    proptest! {
        // Any daemon.json made of other keys survives configure + unconfigure byte for byte.
        #[test]
        fn round_trip(keys in proptest::collection::btree_map("[a-z-]{1,12}", any::<u32>(), 0..8),
                      with_runtimes in any::<bool>(), def in any::<bool>()) {
            let mut m = Map::new();
            for (k, v) in keys { if k != "runtimes" && k != "default-runtime" { m.insert(k, Value::from(v)); } }
            if with_runtimes { m.insert("runtimes".into(), serde_json::json!({"crun": {"path": "/usr/bin/crun"}})); }
            let orig = serde_json::to_string_pretty(&m).unwrap() + "\n";
            let out = conf(Some(&orig), def).unwrap();
            let again = configure(Path::new(P), Some(&out), None, &settings(def)).unwrap();
            prop_assert!(again.is_empty());
            let ch = unconfigure(Path::new(P), Some(&out), None).unwrap();
            prop_assert_eq!(apply_in_memory(&ch, P, Some(&out)).unwrap(), orig);
        }
    }
}
