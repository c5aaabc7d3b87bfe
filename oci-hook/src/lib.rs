//! vgpu's OCI side: the runtime shim (`vgpu-container-runtime`) and the hook (`vgpu-hook`).
//!
//! Both read a container's spec, decide its GPU memory quota ([`plan`]), and provision the per-container
//! state on the host ([`provision`]) that the interposer inside the container reads. The shim edits the
//! spec before the lower runtime sees it ([`shim`], [`edit`]); the hook covers the hooks.d path where no
//! shim ran by bind-mounting the state into the container itself ([`mountns`]). [`gc`] removes state whose
//! container is gone. See docs/oci.md.

pub mod config;
pub mod edit;
pub mod gc;
pub mod gpus;
pub mod hook;
pub mod ledgers;
pub mod mountns;
pub mod nvml;
pub mod plan;
pub mod provision;
pub mod quota;
pub mod rootfs;
pub mod shim;
pub mod spec;

/// Where the state appears inside the container (fixed by docs/architecture.md).
pub mod paths {
    /// The limits file, mounted read-only.
    pub const LIMITS_IN_CONTAINER: &str = "/run/vgpu/limits.json";
    /// The container's ledger folder, mounted read-write.
    pub const LEDGERS_IN_CONTAINER: &str = "/run/vgpu/ledgers";
    /// The interposer, mounted read-only.
    pub const LIBRARY_IN_CONTAINER: &str = "/usr/local/vgpu/libvgpu.so";
    /// The interposer's engine, loaded by the library from its own folder on the first CUDA call.
    pub const CORE_IN_CONTAINER: &str = "/usr/local/vgpu/libvgpu_core.so";
    /// File name of the engine beside the library on the host.
    pub const CORE_FILE_NAME: &str = "libvgpu_core.so";
    /// The generated preload list, mounted read-only.
    pub const PRELOAD_IN_CONTAINER: &str = "/etc/ld.so.preload";
}

/// Annotation the shim (and the precreate stage) adds so the later hook knows the spec was already edited
/// and the state is mounted by the runtime, not by the hook.
pub const MARKER_ANNOTATION: &str = "vgpu.io/provisioned-by";

/// The minimal environment every hook we install runs with: nothing from the container (an image's
/// `LD_PRELOAD` must never reach a process with host privileges).
pub const HOOK_PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
