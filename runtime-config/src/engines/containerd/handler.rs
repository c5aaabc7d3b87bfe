//! vgpu's runtime handler in containerd's CRI plugin: a runc v2 shim whose `options.BinaryName` is
//! vgpu-container-runtime, a copy of the runtime it replaces (so `SystemdCgroup` and friends match) with
//! `vgpu.io/*` pod and container annotations let through; and the ownership test, which tells vgpu's
//! handler from someone else's of the same name (the toolkit's `AddRuntime` in config_v1.go sets the same
//! keys for its own runtime).
use super::marks::RUNC_RESTATED;
use super::tables::{detached, ensure};
use crate::engines::error::{EngineError, Result};
use crate::engines::shim::is_shim;
use std::path::Path;
use toml_edit::{Array, Item, Table, Value};

/// The handler's name (the RuntimeClass handler pods ask for).
pub const RUNTIME: &str = "vgpu";
pub const RUNC_V2: &str = "io.containerd.runc.v2";
const ANNOTATIONS: &str = vgpu_ledger::keys::ANNOTATION_GLOB;

/// Why `runtimes.vgpu` is not vgpu's (None: it is). vgpu's handler is the one whose `options.BinaryName`
/// is the shim; anything else (a kata handler, another runc wrapper) belongs to someone else.
pub fn foreign_why(vgpu: &Item) -> Option<String> {
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

/// One line for a handler named vgpu in a file vgpuctl reads but never edits, read after where vgpuctl
/// writes its own.
pub fn imported_foreign(src: &Path, why: &str, ours: &Path) -> EngineError {
    EngineError::ImportedForeign {
        src: src.to_path_buf(),
        why: why.to_string(),
        ours: ours.to_path_buf(),
    }
}

pub fn annotations() -> Value {
    Value::Array(Array::from_iter([ANNOTATIONS]))
}

/// Adds the vgpu handler (a copy of runtime `base_name` from `view_runtimes`) to `runtimes`, restating the
/// built-in runc where containerd would lose it.
pub fn add_handler(
    runtimes: &mut Table,
    view_runtimes: &Table,
    base_name: &str,
    runtime_path: &str,
    path: &Path,
) -> Result<()> {
    let base = view_runtimes
        .get(base_name)
        .and_then(Item::as_table)
        .filter(
            |t| !matches!(t.get("runtime_type").and_then(Item::as_str), Some(rt) if rt != RUNC_V2),
        )
        .map(detached);
    if base_name == "runc"
        && !view_runtimes.contains_key("runc")
        && !runtimes.contains_key("runc")
        && !runtimes.contains_key(RUNTIME)
    {
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
        .ok_or_else(|| EngineError::shape(path, format!("runtimes.{RUNTIME} is not a [table]")))?;
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
        EngineError::shape(path, format!("runtimes.{RUNTIME}.options is not a [table]"))
    })?;
    ensure(options, "BinaryName", Value::from(runtime_path));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::engines::change::apply_in_memory;
    use crate::engines::containerd::{configure, unconfigure, Settings};
    use crate::engines::files::MemFiles;
    use toml_edit::DocumentMut;

    /// A handler named vgpu that someone else wrote (kata here) is refused by configure, left alone by
    /// unconfigure, and replaced whole with --force.
    #[test]
    fn foreign_vgpu_handler_is_never_clobbered() {
        let e = configure(
            Path::new(P),
            Some(KATA),
            &MemFiles::default(),
            None,
            &s(false),
        )
        .unwrap_err();
        assert!(
            matches!(&e, EngineError::Foreign { what, why, .. }
                if what == "the containerd runtime handler vgpu"
                    && why.starts_with("runtime_type io.containerd.kata.v2")),
            "{e}"
        );
        assert!(e.to_string().contains("--force"), "{e}");
        let e =
            unconfigure(Path::new(P), Some(KATA), &MemFiles::default(), None, None).unwrap_err();
        assert!(matches!(e, EngineError::Foreign { .. }), "{e}");
        let other = KATA.replace(
            "io.containerd.kata.v2\"\n",
            "io.containerd.runc.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu.options]\n    BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
        );
        let e = configure(
            Path::new(P),
            Some(&other),
            &MemFiles::default(),
            None,
            &s(false),
        )
        .unwrap_err();
        assert!(
            matches!(&e, EngineError::Foreign { why, .. }
                if why == "its BinaryName is /usr/bin/nvidia-container-runtime"),
            "{e}"
        );
        let forced = Settings {
            force: true,
            ..s(false)
        };
        let c = configure(
            Path::new(P),
            Some(KATA),
            &MemFiles::default(),
            None,
            &forced,
        )
        .unwrap();
        let out = apply_in_memory(&c.changes, P, Some(KATA)).unwrap();
        let t = vgpu_table(&out, "io.containerd.grpc.v1.cri");
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2), "{out}");
        assert_eq!(
            t["options"]["BinaryName"].as_str(),
            Some("/usr/bin/vgpu-container-runtime")
        );
        // After --force the handler is vgpu's: unconfigure removes it.
        assert!(!unconf(&out).unwrap().contains("runtimes.vgpu"));
    }

    #[test]
    fn v2_adds_handler_copies_options_keeps_comments() {
        let (out, entry) = conf_e(Some(V2), false, None);
        assert!(entry.is_empty(), "nothing to record: {entry:?}");
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
    fn non_runc_default_is_not_copied() {
        let orig = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"kata\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata]\n  runtime_type = \"io.containerd.kata.v2\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kata.options]\n    ConfigPath = \"/etc/kata.toml\"\n";
        let t = vgpu_table(&conf(Some(orig), false), "io.containerd.grpc.v1.cri");
        assert!(t["options"].get("ConfigPath").is_none());
        assert_eq!(t["runtime_type"].as_str(), Some(RUNC_V2));
    }
}
