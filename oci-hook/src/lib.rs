//! vgpu's OCI side: the runtime shim (`vgpu-container-runtime`) and the hook (`vgpu-hook`). Not here: the
//! contracts shared with the library and vgpuctl (paths, key names, env grammar, atomic writes, state walk:
//! `vgpu_ledger`).
//!
//! Both run one create pipeline ([`create`]): the container's request read once from its spec ([`request`]; a DRA claim's
//! quota in its place: [`claim_quota`];
//! keys checked by [`unknown_keys`], per-GPU forms by [`pod_keys`], values by [`memory_request`] and
//! [`compute_request`]), its quota decided ([`plan`], the container's GPUs from [`gpus`], the host's from
//! `vgpu_host::nvml`), the edits it gets computed once as a value
//! ([`edits::ContainerEdits`]), the per-container state provisioned on the host ([`provision`]). The shim
//! ([`shim`]; its command line: [`args`]; the runtime under it: [`lower`]) applies the edits to the spec before
//! the lower runtime sees it ([`spec`]); on the hooks.d path, where no shim ran, the hook ([`hook`]) makes the
//! same mounts in the container's namespace itself ([`mountns`], inside the rootfs: [`rootfs`]). The garbage
//! collector the hook runs after each stage, and the removal of state whose create was killed, are the host
//! tools' (`vgpu_host::gc`, `vgpu_host::abandoned`). See docs/oci.md.

pub mod args;
pub mod claim_quota;
pub mod cli;
pub mod compute_request;
pub mod create;
pub mod edits;
pub mod gpus;
pub mod hook;
pub mod lower;
pub mod memory_request;
pub mod mountns;
pub mod plan;
pub mod pod_keys;
pub mod provision;
pub mod request;
pub mod rootfs;
pub mod shim;
pub mod spec;
#[cfg(test)]
mod testing;
pub mod unknown_keys;
