//! The state root on the host (`state_root` of /etc/vgpu/config.toml, default /run/vgpu) and the paths of
//! each container's state under it, named by the file names both sides agree on (`vgpu_ledger::layout`),
//! and the names only the host writes there (the marker, the create token). Not here: the walk over its container folders (`walk`).

use std::path::{Path, PathBuf};
use vgpu_ledger::layout::{
    check_container_id, relative_ledger_path, LayoutError, LEDGERS_DIR_NAME, LIMITS_FILE_NAME,
    PRELOAD_FILE_NAME,
};

/// The marker vgpu writes in every folder it makes under the state root — `<root>/containers/` and each
/// `<root>/containers/<id>/` — before anything else goes in. vgpu deletes, replaces or changes only folders
/// that hold it, so a state root pointed at someone else's folder (`/var/lib`, holding Podman's
/// `containers/storage`) loses nothing. A dot-name: never a container id.
pub const MARKER_FILE_NAME: &str = ".vgpu-state";
/// What the marker says to someone who finds it.
pub const MARKER_CONTENT: &str =
    "Made by vgpu (vgpu-hook / vgpu-container-runtime). vgpu removes only folders holding this file.\n";

/// A random token written by the invocation that provisioned the folder (host only, never mounted): a
/// create that fails removes the folder only if it still holds its own token.
pub const CREATE_TOKEN_FILE_NAME: &str = "create.token";

/// The state root on the host (`state_root` of /etc/vgpu/config.toml, default /run/vgpu).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRoot {
    root: PathBuf,
}

impl StateRoot {
    pub fn new(root: PathBuf) -> Self {
        StateRoot { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/containers`
    pub fn containers_dir(&self) -> PathBuf {
        self.root.join("containers")
    }

    /// `<root>/containers/<id>`; refuses ids that are not a single safe path component.
    pub fn container_dir(&self, id: &str) -> Result<PathBuf, LayoutError> {
        check_container_id(id)?;
        Ok(self.containers_dir().join(id))
    }

    /// `<root>/containers/<id>/limits.json`
    pub fn limits_path(&self, id: &str) -> Result<PathBuf, LayoutError> {
        Ok(self.container_dir(id)?.join(LIMITS_FILE_NAME))
    }

    /// `<root>/containers/<id>/ledgers`
    pub fn ledgers_dir(&self, id: &str) -> Result<PathBuf, LayoutError> {
        Ok(self.container_dir(id)?.join(LEDGERS_DIR_NAME))
    }

    /// `<root>/containers/<id>/ledgers/<uuid>.ledger`
    pub fn ledger_path(&self, id: &str, uuid: &str) -> Result<PathBuf, LayoutError> {
        Ok(self.container_dir(id)?.join(relative_ledger_path(uuid)?))
    }

    /// `<root>/containers/<id>/ld.so.preload`
    pub fn preload_path(&self, id: &str) -> Result<PathBuf, LayoutError> {
        Ok(self.container_dir(id)?.join(PRELOAD_FILE_NAME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let r = StateRoot::new(PathBuf::from("/run/vgpu"));
        assert_eq!(r.containers_dir(), Path::new("/run/vgpu/containers"));
        assert_eq!(
            r.container_dir("abc").unwrap(),
            Path::new("/run/vgpu/containers/abc")
        );
        assert_eq!(
            r.limits_path("abc").unwrap(),
            Path::new("/run/vgpu/containers/abc/limits.json")
        );
        assert_eq!(
            r.ledgers_dir("abc").unwrap(),
            Path::new("/run/vgpu/containers/abc/ledgers")
        );
        assert_eq!(
            r.ledger_path("abc", "GPU-1234").unwrap(),
            Path::new("/run/vgpu/containers/abc/ledgers/GPU-1234.ledger")
        );
        assert_eq!(
            r.preload_path("abc").unwrap(),
            Path::new("/run/vgpu/containers/abc/ld.so.preload")
        );
        assert!(r.container_dir("../x").is_err());
        assert!(r
            .ledger_path("ok", "../x")
            .unwrap_err()
            .to_string()
            .contains("invalid GPU uuid"));
        assert!(r.limits_path("a/b").is_err());
        assert!(r.preload_path("..").is_err());
    }
}
