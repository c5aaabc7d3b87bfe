//! What containerd's configure is asked to do, and where its files are by default.
use std::path::Path;

pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// `--drop-in` without a path: this file in the main config's folder.
pub const DEFAULT_DROP_IN: &str = "conf.d/99-vgpu.toml";

pub struct Settings<'a> {
    pub runtime_path: &'a str,
    pub set_as_default: bool,
    /// Replace a `runtimes.vgpu` that is not vgpu's.
    pub force: bool,
    /// Write the handler into this file (absolute) and import it from the main config, instead of editing
    /// the main config.
    pub drop_in: Option<&'a Path>,
}
