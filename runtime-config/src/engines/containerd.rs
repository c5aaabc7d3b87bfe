//! containerd: a runtime handler `vgpu` in `/etc/containerd/config.toml`, edited with toml_edit so every
//! other key, the comments and the layout stay as they were.
//!
//! Config version 2 (containerd 1.x) keeps the CRI runtimes under
//! `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`, version 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`. The handler is a runc v2 shim whose
//! `BinaryName` is vgpu-container-runtime; it starts as a copy of the default runtime (so `SystemdCgroup`
//! and friends match) and lets `vgpu.io/*` pod and container annotations through to the OCI spec.
use super::{foreign, is_shim, line_col, parse_error, Change};
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use toml_edit::{Array, DocumentMut, Item, Table, Value};

pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
const RUNTIME: &str = "vgpu";
const RUNC_V2: &str = "io.containerd.runc.v2";
const ANNOTATIONS: &str = "vgpu.io/*";
/// First line of a config file vgpuctl created because there was none; unconfigure removes such a file
/// again once nothing but the version is left in it.
const CREATED: &str = "# Created by `vgpuctl runtime configure --runtime=containerd`";
/// `--set-as-default` keeps the replaced `default_runtime_name` in a comment on the same line: its text
/// and the whitespace and comment around it, as a JSON array, so unconfigure restores the line exactly.
const PREVIOUS: &str = "vgpuctl: previous default_runtime_name ";
const WAS_UNSET: &str = "vgpuctl: default_runtime_name was unset";
/// On a table that had no header of its own until `--set-as-default` put a key in it.
const HEADER_ADDED: &str = "# vgpuctl: header added for default_runtime_name";
/// containerd replaces its built-in runtimes map with the file's as soon as the file names any runtime,
/// so adding `vgpu` alone would make the built-in `runc` (the usual default) disappear. vgpuctl then
/// restates it, marked with this comment, and unconfigure removes it again.
const RUNC_RESTATED: &str =
    "# vgpuctl: containerd's built-in runc, restated because the file now names runtimes";

pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
    /// Replace a `runtimes.vgpu` that is not vgpu's.
    pub force: bool,
    /// Version for a config created from nothing; None = ask `containerd --version` (2 for 1.x, 3 for 2.x).
    pub version_for_new_file: Option<i64>,
}

fn cri_plugin(version: i64) -> &'static str {
    if version >= 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut> {
    text.parse::<DocumentMut>().map_err(|e| {
        let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        parse_error(path, line, col, e.message())
    })
}

fn version_of(path: &Path, doc: &DocumentMut) -> Result<i64> {
    match doc.get("version") {
        Some(v) => match v.as_integer() {
            Some(n @ (2 | 3)) => Ok(n),
            _ => bail!("{}: unsupported containerd config version {} (vgpuctl knows 2 and 3)", path.display(), v.to_string().trim()),
        },
        None => bail!(
            "{}: no `version` key, so containerd reads it as config version 1, which vgpuctl does not edit; \
             add `version = 2` (containerd 1.x) after checking the file, or migrate it",
            path.display()
        ),
    }
}

/// containerd 2.x reads version 3; 1.x reads version 2.
fn installed_version() -> i64 {
    let out = std::process::Command::new("containerd")
        .arg("--version")
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or "... v2.0.0 ..."
    let major = text.split_whitespace().nth(2).and_then(|v| {
        v.trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<i64>()
            .ok()
    });
    if major.unwrap_or(1) >= 2 {
        3
    } else {
        2
    }
}

/// The table at `key` under `parent`, created (implicit: no header of its own) if missing.
fn child<'a>(parent: &'a mut Table, key: &str, path: &Path) -> Result<&'a mut Table> {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(true);
        Item::Table(t)
    });
    item.as_table_mut().ok_or_else(|| {
        anyhow!(
            "{}: `{key}` is not a [table] (inline tables are not edited by vgpuctl)",
            path.display()
        )
    })
}

/// Why `runtimes.vgpu` is not vgpu's (None: it is). vgpu's handler is the one whose `options.BinaryName`
/// is the shim; anything else (a kata handler, another runc wrapper) belongs to someone else.
fn foreign_why(vgpu: &Item) -> Option<String> {
    let Some(t) = vgpu.as_table_like() else {
        return Some("it is not a table".into());
    };
    let binary = t
        .get("options")
        .and_then(Item::as_table_like)
        .and_then(|o| o.get("BinaryName"))
        .and_then(Item::as_str);
    match binary {
        Some(b) if is_shim(b) => None,
        Some(b) => Some(format!("its BinaryName is {b}")),
        None => Some(match t.get("runtime_type").and_then(Item::as_str) {
            Some(rt) => format!("runtime_type {rt}, no vgpu BinaryName"),
            None => "it has no vgpu BinaryName".into(),
        }),
    }
}

/// A value as written by vgpuctl, whatever its decor, for comparisons.
fn bare(v: &Value) -> String {
    let mut v = v.clone();
    v.decor_mut().clear();
    v.to_string()
}

/// Sets `table[key] = v` unless it already holds that value (so a second configure rewrites nothing).
fn ensure(table: &mut Table, key: &str, v: Value) {
    match table.get_mut(key) {
        Some(Item::Value(old)) if bare(old) == bare(&v) => {}
        // In place, so the key keeps its indentation and comments.
        Some(Item::Value(old)) => *old = v.decorated(" ", ""),
        _ => {
            table.insert(key, Item::Value(v));
        }
    }
}

/// A copy of a table from elsewhere in the file, without its comments, indentation or position.
fn detached(t: &Table) -> Table {
    let mut t = t.clone();
    t.decor_mut().clear();
    t.set_position(None);
    t.set_implicit(false);
    for (mut k, item) in t.iter_mut() {
        k.leaf_decor_mut().clear();
        match item {
            Item::Value(v) => v.decor_mut().clear(),
            Item::Table(sub) => *sub = detached(sub),
            _ => {}
        }
    }
    t
}

fn annotations() -> Value {
    Value::Array(Array::from_iter([ANNOTATIONS]))
}

/// The changes that add the vgpu runtime handler to `path` (current text `current`, None if absent).
pub fn configure(path: &Path, current: Option<&str>, s: &Settings) -> Result<Vec<Change>> {
    let mut doc = match current {
        Some(text) if !text.trim().is_empty() => parse(path, text)?,
        _ => {
            let version = s.version_for_new_file.unwrap_or_else(installed_version);
            parse(path, &format!("{CREATED}\nversion = {version}\n"))?
        }
    };
    let version = version_of(path, &doc)?;
    let plugins = child(doc.as_table_mut(), "plugins", path)?;
    let cri = child(plugins, cri_plugin(version), path)?;
    let containerd = child(cri, "containerd", path)?;

    // The runtime to copy: the configured default (or runc), unless vgpu itself is the default already.
    let mut base_name = containerd
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_string();
    if base_name == RUNTIME {
        base_name = previous_default(containerd)
            .flatten()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "runc".into());
    }
    if s.set_as_default {
        set_default(containerd);
    }
    let runtimes = child(containerd, "runtimes", path)?;
    if let Some(why) = runtimes.get(RUNTIME).and_then(foreign_why) {
        if !s.force {
            return Err(foreign(path, "the containerd runtime handler vgpu", &why));
        }
        // --force: replaced whole, nothing of the foreign handler's settings kept.
        runtimes.remove(RUNTIME);
    }
    let base = runtimes
        .get(&base_name)
        .and_then(Item::as_table)
        .filter(
            |t| !matches!(t.get("runtime_type").and_then(Item::as_str), Some(rt) if rt != RUNC_V2),
        )
        .map(detached);

    if base_name == "runc" && !runtimes.contains_key("runc") && !runtimes.contains_key(RUNTIME) {
        let mut runc = Table::new();
        runc.decor_mut().set_prefix(format!("\n{RUNC_RESTATED}\n"));
        runc.insert("runtime_type", Item::Value(Value::from(RUNC_V2)));
        runtimes.insert("runc", Item::Table(runc));
    }
    if !runtimes.contains_key(RUNTIME) {
        let mut t = base.clone().unwrap_or_default();
        // Annotations are ours to set; the rest of the copy stays.
        t.remove("pod_annotations");
        t.remove("container_annotations");
        runtimes.insert(RUNTIME, Item::Table(t));
    }
    let vgpu = runtimes[RUNTIME]
        .as_table_mut()
        .ok_or_else(|| anyhow!("{}: runtimes.{RUNTIME} is not a [table]", path.display()))?;
    ensure(vgpu, "runtime_type", Value::from(RUNC_V2));
    ensure(vgpu, "pod_annotations", annotations());
    ensure(vgpu, "container_annotations", annotations());
    if !vgpu.contains_key("options") {
        let opts = base
            .as_ref()
            .and_then(|b| b.get("options"))
            .and_then(Item::as_table)
            .cloned()
            .unwrap_or_default();
        vgpu.insert("options", Item::Table(opts));
    }
    let options = vgpu["options"].as_table_mut().ok_or_else(|| {
        anyhow!(
            "{}: runtimes.{RUNTIME}.options is not a [table]",
            path.display()
        )
    })?;
    ensure(options, "BinaryName", Value::from(s.runtime_path));

    let new = doc.to_string();
    Ok(if current == Some(new.as_str()) {
        vec![]
    } else {
        vec![Change::write(path.to_path_buf(), new, 0o644)]
    })
}

/// Makes vgpu the default runtime, keeping the replaced value in a comment on the same line.
fn set_default(containerd: &mut Table) {
    let note = match containerd
        .get("default_runtime_name")
        .and_then(Item::as_value)
    {
        Some(v) if v.as_str() == Some(RUNTIME) => return,
        Some(v) => {
            let raw = |r: Option<&toml_edit::RawString>| {
                r.and_then(|r| r.as_str()).unwrap_or("").to_string()
            };
            let saved = [bare(v), raw(v.decor().prefix()), raw(v.decor().suffix())];
            format!(
                "{PREVIOUS}{}",
                serde_json::to_string(&saved).expect("strings serialize")
            )
        }
        None => WAS_UNSET.to_string(),
    };
    let v = Value::from(RUNTIME).decorated(" ", format!(" # {note}"));
    if containerd.is_implicit() {
        containerd.set_implicit(false);
        containerd
            .decor_mut()
            .set_prefix(format!("\n{HEADER_ADDED}\n"));
    }
    match containerd.get_mut("default_runtime_name") {
        Some(Item::Value(old)) => *old = v,
        _ => {
            containerd.insert("default_runtime_name", Item::Value(v));
        }
    }
}

/// What `set_default` replaced: Some(Some(value as it was written)), Some(None) if unset, None if
/// vgpuctl did not set it.
fn previous_default(containerd: &Table) -> Option<Option<Value>> {
    let v = containerd.get("default_runtime_name")?.as_value()?;
    let comment = v
        .decor()
        .suffix()?
        .as_str()?
        .trim()
        .trim_start_matches('#')
        .trim()
        .to_string();
    if comment == WAS_UNSET {
        return Some(None);
    }
    let [repr, prefix, suffix]: [String; 3] =
        serde_json::from_str(comment.strip_prefix(PREVIOUS)?).ok()?;
    Some(Some(repr.parse::<Value>().ok()?.decorated(prefix, suffix)))
}

/// Whether vgpuctl's comment `mark` is on the line(s) before the table's header.
fn marked(t: &Table, mark: &str) -> bool {
    t.decor()
        .prefix()
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(mark))
}

/// Removes `key` from `parent` if it is an empty table without a header of its own (one that
/// configure created on the way to the runtime).
fn prune(parent: &mut Table, key: &str) {
    if let Some(t) = parent.get(key).and_then(Item::as_table) {
        if t.is_empty() && t.is_implicit() {
            parent.remove(key);
        }
    }
}

/// The changes that take back what `configure` added.
pub fn unconfigure(path: &Path, current: Option<&str>) -> Result<Vec<Change>> {
    let Some(text) = current.filter(|t| !t.trim().is_empty()) else {
        return Ok(vec![]);
    };
    let mut doc = parse(path, text)?;
    let version = version_of(path, &doc)?;
    let plugin = cri_plugin(version);
    {
        let Some(containerd) = doc
            .get_mut("plugins")
            .and_then(Item::as_table_mut)
            .and_then(|p| p.get_mut(plugin))
            .and_then(Item::as_table_mut)
            .and_then(|c| c.get_mut("containerd"))
            .and_then(Item::as_table_mut)
        else {
            return Ok(vec![]);
        };
        if containerd
            .get("default_runtime_name")
            .and_then(Item::as_str)
            == Some(RUNTIME)
        {
            match previous_default(containerd) {
                Some(Some(prev)) => {
                    if let Some(Item::Value(v)) = containerd.get_mut("default_runtime_name") {
                        *v = prev;
                    }
                }
                _ => {
                    containerd.remove("default_runtime_name");
                }
            }
        }
        if marked(containerd, HEADER_ADDED) {
            containerd.decor_mut().clear();
            containerd.set_implicit(true);
        }
        if let Some(why) = containerd
            .get("runtimes")
            .and_then(|r| r.get(RUNTIME))
            .and_then(foreign_why)
        {
            return Err(foreign(path, "the containerd runtime handler vgpu", &why));
        }
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
    }
    // Walk back up, dropping the header-less tables configure had to create.
    let plugins = doc["plugins"].as_table_mut().expect("checked above");
    prune(
        plugins[plugin].as_table_mut().expect("checked above"),
        "containerd",
    );
    prune(plugins, plugin);
    prune(doc.as_table_mut(), "plugins");

    let new = doc.to_string();
    if new == text {
        return Ok(vec![]);
    }
    // A file vgpuctl created from nothing goes away again once only its version is left.
    if new.starts_with(CREATED) && doc.len() == 1 && doc.contains_key("version") {
        return Ok(vec![Change::remove(path.to_path_buf())]);
    }
    Ok(vec![Change::write(path.to_path_buf(), new, 0o644)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::apply_in_memory;
    use proptest::prelude::*;

    const P: &str = "/etc/containerd/config.toml";
    fn s(def: bool) -> Settings<'static> {
        Settings {
            runtime_path: "/usr/bin/vgpu-container-runtime",
            set_as_default: def,
            force: false,
            version_for_new_file: Some(2),
        }
    }

    const KATA: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n# kata under the name vgpu\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.kata.v2\"\n";

    /// A handler named vgpu that someone else wrote (kata here) is refused by configure, left alone by
    /// unconfigure, and replaced whole with --force.
    #[test]
    fn foreign_vgpu_handler_is_never_clobbered() {
        let e = configure(Path::new(P), Some(KATA), &s(false)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(
                "handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2"
            ),
            "{msg}"
        );
        assert!(msg.contains("--force"), "{msg}");
        let e = unconfigure(Path::new(P), Some(KATA)).unwrap_err();
        assert!(format!("{e:#}").contains("left untouched"), "{e:#}");
        let other = KATA.replace(
            "io.containerd.kata.v2\"\n",
            "io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu.options]\n    BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        );
        let e = configure(Path::new(P), Some(&other), &s(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("its BinaryName is /usr/bin/nvidia-container-runtime"),
            "{e:#}"
        );
        let forced = Settings {
            force: true,
            ..s(false)
        };
        let ch = configure(Path::new(P), Some(KATA), &forced).unwrap();
        let out = apply_in_memory(&ch, P, Some(KATA)).unwrap();
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2), "{out}");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        // After --force the handler is vgpu's: unconfigure removes it.
        assert!(!unconf(&out).unwrap().contains("runtimes.vgpu"));
    }
    fn conf(text: Option<&str>, def: bool) -> String {
        let ch = configure(Path::new(P), text, &s(def)).unwrap();
        apply_in_memory(&ch, P, text).unwrap()
    }
    fn unconf(text: &str) -> Option<String> {
        let ch = unconfigure(Path::new(P), Some(text)).unwrap();
        apply_in_memory(&ch, P, Some(text))
    }

    const V2: &str = r#"version = 2
# The CRI plugin.
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6" # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          # keep cgroups under systemd
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"#;

    fn is_subsequence(orig: &str, out: &str) -> bool {
        let mut lines = out.lines();
        orig.lines().all(|l| lines.any(|o| o == l))
    }

    fn vgpu_table(doc: &str, plugin: &str) -> Table {
        let d: DocumentMut = doc.parse().unwrap();
        d["plugins"][plugin]["containerd"]["runtimes"]["vgpu"]
            .as_table()
            .unwrap()
            .clone()
    }

    #[test]
    fn v2_adds_handler_copies_options_keeps_comments() {
        let out = conf(Some(V2), false);
        assert!(
            is_subsequence(V2, &out),
            "every original line is kept, in order:\n{out}"
        );
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2));
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(t["options"]["SystemdCgroup"].as_bool(), Some(true));
        assert_eq!(
            t["pod_annotations"]
                .as_array()
                .unwrap()
                .get(0)
                .unwrap()
                .as_str(),
            Some("vgpu.io/*")
        );
        assert_eq!(t["container_annotations"].as_array().unwrap().len(), 1);
        assert!(
            !out.contains("# keep cgroups under systemd\n[plugins"),
            "copied keys carry no comments"
        );
        assert_eq!(conf(Some(&out), false), out, "idempotent");
        assert_eq!(unconf(&out).unwrap(), V2, "unconfigure restores the bytes");
    }

    #[test]
    fn v3_uses_the_v3_plugin() {
        let v3 = "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  BinaryName = '/usr/bin/runc'\n";
        let out = conf(Some(v3), false);
        let t = vgpu_table(&out, "io.containerd.cri.v1.runtime");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        assert_eq!(t["options"]["SystemdCgroup"].as_bool(), Some(false));
        assert!(!out.contains("io.containerd.grpc.v1.cri"));
        assert_eq!(unconf(&out).unwrap(), v3);
    }

    #[test]
    fn missing_file_gets_minimal_config_and_unconfigure_removes_it() {
        let out = conf(None, false);
        assert!(out.starts_with(CREATED));
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        let ch = unconfigure(Path::new(P), Some(&out)).unwrap();
        assert_eq!(ch, vec![Change::remove(P.into())]);
    }

    #[test]
    fn tables_created_on_the_way_are_removed_again() {
        let orig = "version = 2\n# only this\n[debug]\n  level = \"info\"\n";
        let out = conf(Some(orig), false);
        assert_eq!(unconf(&out).unwrap(), orig);
        let out = conf(Some(orig), true);
        assert!(out.contains(HEADER_ADDED));
        assert_eq!(unconf(&out).unwrap(), orig);
    }

    #[test]
    fn builtin_runc_is_restated_when_the_file_names_no_runtime() {
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n";
        let out = conf(Some(orig), false);
        let d: DocumentMut = out.parse().unwrap();
        let runtimes = &d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        assert_eq!(runtimes["runc"]["runtime_type"].as_str(), Some(RUNC_V2));
        assert!(out.contains(RUNC_RESTATED));
        assert_eq!(conf(Some(&out), false), out);
        assert_eq!(unconf(&out).unwrap(), orig);
        // A runc the operator wrote is never removed.
        assert!(unconf(&conf(Some(V2), false))
            .unwrap()
            .contains("runtimes.runc]"));
    }

    #[test]
    fn set_as_default_round_trip() {
        let out = conf(Some(V2), true);
        assert!(out.contains(r#"default_runtime_name = "vgpu" # vgpuctl: previous default_runtime_name ["\"runc\""," ",""]"#), "{out}");
        // The copy is still made from runc, not from vgpu itself.
        assert_eq!(
            vgpu_table(&out, "io.containerd.grpc.v1.cri")["options"]["SystemdCgroup"].as_bool(),
            Some(true)
        );
        assert_eq!(conf(Some(&out), true), out);
        assert_eq!(unconf(&out).unwrap(), V2);
        // Unset before: removed again.
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n";
        let out = conf(Some(orig), true);
        assert!(out.contains(WAS_UNSET));
        assert_eq!(unconf(&out).unwrap(), orig);
    }

    #[test]
    fn non_runc_default_is_not_copied() {
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"kata\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata.options]\n    ConfigPath = \"/etc/kata.toml\"\n";
        let t = vgpu_table(&conf(Some(orig), false), "io.containerd.grpc.v1.cri");
        assert!(t["options"].get("ConfigPath").is_none());
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2));
    }

    #[test]
    fn bad_input_is_reported_with_line() {
        let e = configure(
            Path::new(P),
            Some("version = 2\n[plugins\nfoo = 1\n"),
            &s(false),
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").starts_with("/etc/containerd/config.toml:2:"),
            "{e:#}"
        );
        let e = configure(Path::new(P), Some("[plugins.cri]\nx = 1\n"), &s(false)).unwrap_err();
        assert!(format!("{e:#}").contains("version 1"), "{e:#}");
        let e = configure(Path::new(P), Some("version = 4\n"), &s(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("unsupported containerd config version 4"),
            "{e:#}"
        );
    }

    /// tests/golden/containerd: real configs (Debian's, `containerd config default`, a 2.x version 3) →
    /// the exact file vgpuctl writes; configure again is a no-op and unconfigure gives the input back.
    #[test]
    fn golden() {
        let n = crate::engines::golden("containerd", "toml", |case, input| {
            let def = case.ends_with("set-as-default");
            let out = conf(Some(input), def);
            assert_eq!(conf(Some(&out), def), out, "{case}: idempotent");
            assert_eq!(
                unconf(&out).unwrap(),
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
            let out = conf(Some(&orig), def);
            prop_assert_eq!(conf(Some(&out), def), out.clone());
            prop_assert_eq!(unconf(&out).unwrap(), orig);
        }
    }
}
