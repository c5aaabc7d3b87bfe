//! containerd's test fixtures: the configs the tests start from, and configure/unconfigure run on a
//! pretend disk (`MemFiles`), the record entry carried between runs.
#![cfg(test)]
use super::{configure, unconfigure, Settings};
use crate::engines::change::{apply_in_memory, Change};
use crate::engines::error::Result;
use crate::engines::files::MemFiles;
use crate::engines::record::Entry;
use std::path::Path;
use toml_edit::{DocumentMut, Table};

pub const P: &str = "/etc/containerd/config.toml";
pub const D: &str = "/etc/containerd/conf.d/99-vgpu.toml";

pub fn s(def: bool) -> Settings<'static> {
    Settings {
        runtime_path: "/usr/bin/vgpu-container-runtime",
        set_as_default: def,
        force: false,
        drop_in: None,
    }
}
pub fn drop_in(def: bool) -> Settings<'static> {
    Settings {
        drop_in: Some(Path::new(D)),
        ..s(def)
    }
}

/// configure, then the main file's text (None: removed) and the record entry.
pub fn conf_e(text: Option<&str>, def: bool, prior: Option<&Entry>) -> (String, Entry) {
    let c = configure(Path::new(P), text, &MemFiles::default(), prior, &s(def)).unwrap();
    (apply_in_memory(&c.changes, P, text).unwrap(), c.entry)
}
pub fn conf(text: Option<&str>, def: bool) -> String {
    conf_e(text, def, None).0
}
pub fn unconf_e(text: &str, prior: Option<&Entry>) -> Option<String> {
    let ch = unconfigure(Path::new(P), Some(text), &MemFiles::default(), prior, None).unwrap();
    apply_in_memory(&ch, P, Some(text))
}
pub fn unconf(text: &str) -> Option<String> {
    unconf_e(text, None)
}
/// A whole configure (with what it records) on a pretend disk; returns the record entry.
pub fn run_conf(disk: &mut MemFiles, prior: Option<&Entry>, st: &Settings) -> Result<Entry> {
    let c = configure(Path::new(P), disk.get(P), disk, prior, st)?;
    disk.apply(&c.changes);
    Ok(c.entry)
}
pub fn run_unconf(disk: &mut MemFiles, prior: Option<&Entry>) -> Result<Vec<Change>> {
    let ch = unconfigure(Path::new(P), disk.get(P), disk, prior, None)?;
    disk.apply(&ch);
    Ok(ch)
}

pub const KATA: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n# kata under the name vgpu\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.vgpu]\n  runtime_type = \"io.containerd.kata.v2\"\n";

pub const V2: &str = r#"version = 2
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

pub const V3_MAIN: &str = "version = 3\nimports = ['conf.d/*.toml']\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'\n";
pub const V3_NVIDIA: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'nvidia'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n  BinaryName = '/usr/bin/nvidia-container-runtime'\n  SystemdCgroup = true\n";

pub fn is_subsequence(orig: &str, out: &str) -> bool {
    let mut lines = out.lines();
    orig.lines().all(|l| lines.any(|o| o == l))
}

pub fn vgpu_table(doc: &str, plugin: &str) -> Table {
    let d: DocumentMut = doc.parse().unwrap();
    d["plugins"][plugin]["containerd"]["runtimes"]["vgpu"]
        .as_table()
        .unwrap()
        .clone()
}
