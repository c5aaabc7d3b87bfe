//! Where vgpu's per-container state lives, on the host and inside the container (docs/architecture.md,
//! "State on the host"): every path both sides agree on. Not here: the state root's own paths, the names
//! only the host writes in a state folder (its marker, the create token) and its walk
//! (`vgpu_host::state_root`, `vgpu_host::walk`), which only the host tools use.

use std::path::{Path, PathBuf};

/// Inside the container: the folder of vgpu's state.
pub const CONTAINER_STATE_DIR: &str = "/run/vgpu";
/// Inside the container: the limits file (mounted read-only).
pub const CONTAINER_LIMITS_PATH: &str = "/run/vgpu/limits.json";
/// Inside the container: the folder of the ledgers. Each GPU's ledger file is bind-mounted (read-write) at
/// [`container_ledger_path`] in it; the folder itself is the container's own, never the host's.
pub const CONTAINER_LEDGERS_DIR: &str = "/run/vgpu/ledgers";
/// Inside the container: the interposer (mounted read-only).
pub const CONTAINER_LIBRARY_PATH: &str = "/usr/local/vgpu/libvgpu.so";
/// Inside the container: the interposer's engine, which the library loads from its own folder on the first
/// CUDA call (mounted read-only).
pub const CONTAINER_CORE_PATH: &str = "/usr/local/vgpu/libvgpu_core.so";
/// Inside the container: the generated preload list (mounted read-only over the image's).
pub const CONTAINER_PRELOAD_PATH: &str = "/etc/ld.so.preload";
/// On the host: file name of the engine beside the configured library.
pub const CORE_FILE_NAME: &str = "libvgpu_core.so";

/// File names inside a container's state folder.
pub const LIMITS_FILE_NAME: &str = "limits.json";
/// A second name of the limits file's inode as provisioned, the one bind-mounted into the container: the
/// host's `limits.json` is replaced by rename (the owner's record, updates), which never reaches the
/// container's mount, so `vgpuctl update` rewrites this one in place (`crate::live`).
pub const MOUNTED_LIMITS_FILE_NAME: &str = "limits.mounted.json";
pub const LEDGERS_DIR_NAME: &str = "ledgers";
pub const PRELOAD_FILE_NAME: &str = "ld.so.preload";
/// Extension of a ledger file: `ledgers/<uuid>.ledger`.
pub const LEDGER_EXTENSION: &str = "ledger";

/// Longest container id or GPU uuid accepted as a path component: a file name has at most 255 bytes, and
/// vgpu's hidden temporary names add up to 19 bytes to an id or uuid (`.tmp-<id>-XXXXXX`, `.rm-<id>-<pid>`,
/// `.<uuid>.ledger.XXXXXX.tmp`). Engines' ids are 64 characters.
pub const MAX_NAME_LEN: usize = 200;

/// A name that cannot be used as a path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name:?}: {problem}")]
pub struct LayoutError {
    what: &'static str,
    name: String,
    problem: &'static str,
}

const TOO_LONG: &str =
    "longer than 200 bytes (vgpu's limit: its temporary names must fit in a file name)";
const _: () = assert!(MAX_NAME_LEN == 200, "TOO_LONG names the limit");

/// Check that `name` is usable as one path component: engines choose container ids and a malicious one
/// ("../../etc") must not move our state outside the root.
fn check_component(what: &'static str, name: &str) -> Result<(), LayoutError> {
    let problem = if name.is_empty() {
        Some("empty")
    } else if name.len() > MAX_NAME_LEN {
        Some(TOO_LONG)
    } else if name.contains('/') {
        Some("contains '/'")
    } else if name.contains('\0') {
        Some("contains a NUL byte")
    } else if name == "." || name == ".." || name.contains("..") {
        Some("is '.' or contains '..'")
    } else if name.starts_with('.') {
        // Temporary files in our folders start with '.'; a name never may.
        Some("starts with '.'")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(LayoutError {
            what,
            name: shortened(name),
            problem,
        }),
        None => Ok(()),
    }
}

/// `name` for a message: a long one cut to its first 64 characters.
fn shortened(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &name[..end]),
        None => name.to_string(),
    }
}

/// Validate a container id as the engines hand it to us.
pub fn check_container_id(id: &str) -> Result<(), LayoutError> {
    check_component("container id", id)
}

/// Validate a GPU uuid before it names a ledger file.
pub fn check_gpu_uuid(uuid: &str) -> Result<(), LayoutError> {
    check_component("GPU uuid", uuid)
}

/// The ledger's path relative to a container's state folder: `ledgers/<uuid>.ledger` (what limits.json
/// records, so the same file works on the host and in the container).
pub fn relative_ledger_path(uuid: &str) -> Result<PathBuf, LayoutError> {
    check_gpu_uuid(uuid)?;
    Ok(Path::new(LEDGERS_DIR_NAME).join(format!("{uuid}.{LEDGER_EXTENSION}")))
}

/// Inside the container: where the ledger of GPU `uuid` is mounted, `/run/vgpu/ledgers/<uuid>.ledger` (the
/// limits file's relative `ledger` path, resolved from its folder).
pub fn container_ledger_path(uuid: &str) -> Result<PathBuf, LayoutError> {
    Ok(Path::new(CONTAINER_STATE_DIR).join(relative_ledger_path(uuid)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            relative_ledger_path("GPU-1").unwrap(),
            Path::new("ledgers/GPU-1.ledger")
        );
        assert_eq!(
            container_ledger_path("GPU-1").unwrap(),
            Path::new(CONTAINER_LEDGERS_DIR).join("GPU-1.ledger")
        );
        assert!(container_ledger_path("../x").is_err());
    }

    #[test]
    fn in_container_paths_agree() {
        assert_eq!(
            Path::new(CONTAINER_LIMITS_PATH),
            Path::new(CONTAINER_STATE_DIR).join(LIMITS_FILE_NAME)
        );
        assert_eq!(
            Path::new(CONTAINER_LEDGERS_DIR),
            Path::new(CONTAINER_STATE_DIR).join(LEDGERS_DIR_NAME)
        );
        // The library loads its engine from its own folder.
        assert_eq!(
            Path::new(CONTAINER_CORE_PATH),
            Path::new(CONTAINER_LIBRARY_PATH).with_file_name(CORE_FILE_NAME)
        );
    }

    #[test]
    fn accepts_engine_ids() {
        let docker = "3f2a9c0d1e2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5";
        assert!(check_container_id(docker).is_ok());
        assert!(check_container_id("k8s_app_pod-1_default_0a1b").is_ok());
        assert!(check_container_id("my.container-1").is_ok());
        assert!(check_container_id(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn rejects_unsafe_ids() {
        for (id, problem) in [
            ("", "empty"),
            ("a/b", "contains '/'"),
            ("/etc", "contains '/'"),
            ("..", "'..'"),
            ("a..b", "'..'"),
            (".", "is '.'"),
            (".hidden", "starts with '.'"),
            ("a\0b", "NUL"),
        ] {
            let err = check_container_id(id).unwrap_err().to_string();
            assert!(
                err.contains("invalid container id") && err.contains(problem),
                "{id:?}: {err}"
            );
        }
        for long in [MAX_NAME_LEN + 1, 256, 300] {
            let err = check_container_id(&"x".repeat(long))
                .unwrap_err()
                .to_string();
            assert!(err.contains("longer than 200 bytes"), "{err}");
            assert!(err.len() < 200, "the message shows a shortened id: {err}");
        }
        assert!(relative_ledger_path("../x")
            .unwrap_err()
            .to_string()
            .contains("invalid GPU uuid"));
    }
}
