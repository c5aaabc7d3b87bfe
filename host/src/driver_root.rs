//! Finding the node's NVML library from inside a node daemon's pod (vgpu-dra-plugin, vgpu-device-plugin).
//! The pod mounts the driver's root folder of the node read-only (`/` where the driver is installed on the host, `/run/nvidia/driver` where
//! NVIDIA's GPU Operator runs it in a container) and the plugin looks for `libnvidia-ml.so.1` in the
//! library folders distributions and the operator's driver image use, as NVIDIA's own DRA driver does
//! with its `nvidiaDriverRoot`. An explicit library path (`--nvml-library`, else the vgpu config's
//! `nvml_library`, as the hook's) is used when no driver root is given.

use std::path::{Path, PathBuf};

/// NVML's soname.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// The folders under a driver root searched, in order.
pub const LIB_DIRS: [&str; 7] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
];

/// No NVML under the driver root. `Display` is one line naming where it looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no {NVML_SONAME} under the driver root {} (looked in {})", root.display(), LIB_DIRS.join(", "))]
pub struct NotFound {
    pub root: PathBuf,
}

/// The NVML library under `root`.
pub fn nvml_library(root: &Path) -> Result<PathBuf, NotFound> {
    LIB_DIRS
        .iter()
        .map(|d| root.join(d).join(NVML_SONAME))
        .find(|p| p.exists())
        .ok_or_else(|| NotFound {
            root: root.to_path_buf(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_in_a_hosts_and_in_the_operators_layout() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(
            nvml_library(root),
            Err(NotFound {
                root: root.to_path_buf()
            })
        );
        // The operator's driver container (Ubuntu): usr/lib/x86_64-linux-gnu; a RHEL host: usr/lib64.
        std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(root.join("usr/lib/x86_64-linux-gnu").join(NVML_SONAME), "").unwrap();
        assert_eq!(
            nvml_library(root).unwrap(),
            root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
        );
        std::fs::create_dir_all(root.join("usr/lib64")).unwrap();
        std::fs::write(root.join("usr/lib64").join(NVML_SONAME), "").unwrap();
        assert_eq!(
            nvml_library(root).unwrap(),
            root.join("usr/lib64/libnvidia-ml.so.1")
        );
    }
}
