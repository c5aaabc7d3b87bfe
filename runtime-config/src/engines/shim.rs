//! What the engines that run containers through the shim (Docker, containerd, CRI-O) share: the shim's
//! name, by which their `vgpu` entries are recognised, their `--config` and `--set-as-default` options,
//! and the advice for hosts that run NVIDIA's runtime.
use super::error::{EngineError, Result};
use std::path::{Path, PathBuf};

/// The file name of the shim; a runtime entry whose binary has this name is vgpu's, whatever folder it is in
/// (an operator may install it elsewhere, and unconfigure is not told where).
pub const SHIM_NAME: &str = vgpu_host::keys::host::RUNTIME_BIN;

/// Whether `binary` (a path from an engine's config) is the vgpu shim.
pub fn is_shim(binary: &str) -> bool {
    Path::new(binary).file_name() == Some(std::ffi::OsStr::new(SHIM_NAME))
}

/// Entries are recognised as vgpu's by the binary's name; one under another name could never be told
/// apart from someone else's again.
pub fn check_runtime_path(runtime_path: &str) -> Result<()> {
    if !is_shim(runtime_path) {
        return Err(EngineError::RuntimePathName {
            shim: SHIM_NAME,
            given: runtime_path.to_string(),
        });
    }
    Ok(())
}

/// `--config`: the engine's config file.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigFile {
    /// The engine's config file. containerd: the files it imports are read as containerd reads them (for
    /// the default runtime, and for a vgpu handler that is not vgpu's), never edited.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

impl ConfigFile {
    /// `--config`, else the engine's default.
    pub fn path(&self, default: &str) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| PathBuf::from(default))
    }
}

/// `--set-as-default` (configure).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SetAsDefault {
    /// Also make vgpu the engine's default runtime (Docker, containerd, CRI-O; refused for Podman, whose
    /// hooks apply under any runtime). The previous default is kept in vgpuctl's record, and unconfigure
    /// puts it back.
    #[arg(long)]
    pub set_as_default: bool,
}

/// Advice printed after configure: an engine that already runs containers through NVIDIA's runtime
/// should keep doing so underneath the vgpu shim, which hands over to `lower_runtime` (default runc).
pub fn nvidia_note(config_text: Option<&str>) -> Vec<String> {
    if config_text.is_some_and(|t| t.contains("nvidia-container-runtime")) {
        vec!["note: this engine's config names nvidia-container-runtime, and vgpu's lower_runtime is not it: so \
              that NVIDIA's device injection still happens under vgpu, set lower_runtime to its absolute path in \
              /etc/vgpu/config.toml (configure does, where it finds one and --no-nvidia-lower-runtime is not given)"
            .into()]
    } else {
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_is_known_by_its_file_name() {
        assert!(is_shim("/opt/vgpu/vgpu-container-runtime"));
        assert!(!is_shim("/usr/bin/runc"));
        assert!(check_runtime_path("/opt/bin/my-shim").is_err());
        assert_eq!(nvidia_note(Some("x nvidia-container-runtime")).len(), 1);
        assert!(nvidia_note(None).is_empty());
    }
}
