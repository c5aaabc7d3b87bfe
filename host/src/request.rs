//! One GPU of a container with what it asks there: its memory quota and its compute share together
//! ([`GpuRequest`]), the one per-GPU shape of the host tools. The hook and the shim plan a new container
//! into these (`vgpu_oci::plan`), `vgpuctl update` reads a running container's back from its limits file
//! ([`GpuRequest::of_limits`]), and admission checks either against the node's GPUs (`crate::admission`).
//! Not here: reading a request from a spec (`vgpu_oci::request`), the settings' own rules
//! (`vgpu_ledger::settings`).

use vgpu_ledger::limits::Limits;
use vgpu_ledger::GpuSettings;

/// One limited GPU of a container: a memory quota, a compute share, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRequest {
    /// The container's GPU index.
    pub index: usize,
    pub uuid: String,
    /// What the GPU gets, as its limits.json entry holds it (`vgpu_ledger::settings`): memory quota and
    /// mode, compute share, policy and window.
    pub settings: GpuSettings,
}

impl GpuRequest {
    /// The GPUs of a container's limits with their settings as they are.
    pub fn of_limits(limits: &Limits) -> Vec<GpuRequest> {
        limits
            .devices
            .iter()
            .map(|d| GpuRequest {
                index: d.index as usize,
                uuid: d.uuid.clone(),
                settings: d.settings,
            })
            .collect()
    }
}
