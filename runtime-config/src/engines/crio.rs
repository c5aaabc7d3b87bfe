//! CRI-O: a drop-in `crio.conf.d/99-vgpu.toml` defining the runtime handler `vgpu`. CRI-O's own files
//! are only read (for the default runtime's settings to copy); the drop-in is vgpuctl's alone and
//! unconfigure removes it.
use super::{line_col, parse_error};
use anyhow::Result;
use std::path::Path;
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

pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
}

/// Whether a drop-in at our path was written by vgpuctl.
pub fn is_ours(text: &str) -> bool {
    text.starts_with(HEADER)
}

/// The drop-in's text, given CRI-O's main config (`main`, None if there is none).
pub fn drop_in(main_path: &Path, main: Option<&str>, s: &Settings) -> Result<String> {
    let doc = match main {
        Some(text) => text.parse::<DocumentMut>().map_err(|e| {
            let (line, col) = e
                .span()
                .map(|sp| line_col(text, sp.start))
                .unwrap_or((1, 1));
            parse_error(main_path, line, col, e.message())
        })?,
        None => DocumentMut::new(),
    };
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
        Item::Value(Value::Array(Array::from_iter(["vgpu.io/"]))),
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

    const P: &str = "/etc/crio/crio.conf";
    fn gen(main: Option<&str>, def: bool) -> String {
        drop_in(
            Path::new(P),
            main,
            &Settings {
                runtime_path: "/usr/bin/vgpu-container-runtime",
                set_as_default: def,
            },
        )
        .unwrap()
    }

    /// Golden files: tests/golden/crio/<case>.conf (input crio.conf) → <case>.expected.toml (the drop-in).
    #[test]
    fn golden() {
        let n = crate::engines::golden("crio", "conf", |case, input| {
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
            Path::new(P),
            Some("[crio]\n\n[crio.runtime\n"),
            &Settings {
                runtime_path: "x",
                set_as_default: false,
            },
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").starts_with("/etc/crio/crio.conf:3:"),
            "{e:#}"
        );
    }
}
