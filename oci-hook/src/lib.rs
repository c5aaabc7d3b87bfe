//! vgpu's OCI side: the runtime shim (`vgpu-container-runtime`) and the hook (`vgpu-hook`).
//!
//! Both read a container's spec, decide its GPU memory quota ([`plan`]), and provision the per-container
//! state on the host ([`provision`]) that the interposer inside the container reads. The shim edits the
//! spec before the lower runtime sees it ([`shim`], [`edit`]); the hook covers the hooks.d path where no
//! shim ran by bind-mounting the state into the container itself ([`mountns`]). [`gc`] removes state whose
//! container is gone. See docs/oci.md.

pub mod args;
pub mod config;
pub mod edit;
pub mod gc;
pub mod gpus;
pub mod hook;
pub mod ledgers;
pub mod lower;
pub mod mountns;
pub mod nvml;
pub mod plan;
pub mod provision;
pub mod quota;
pub mod rootfs;
pub mod shim;
pub mod spec;

/// Annotation the shim (and the precreate stage) adds so the later hook knows the spec was already edited
/// and the state is mounted by the runtime, not by the hook.
pub const MARKER_ANNOTATION: &str = "vgpu.io/provisioned-by";

/// The minimal environment every hook we install runs with: nothing from the container (an image's
/// `LD_PRELOAD` must never reach a process with host privileges).
pub const HOOK_PATH_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
