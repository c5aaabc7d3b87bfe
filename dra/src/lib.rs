//! vgpu's Kubernetes Dynamic Resource Allocation driver (`vgpu-dra-plugin`, run by the chart's DaemonSet
//! on every GPU node): the scheduler, not the tenant, decides a container's quota.
//!
//! At start it publishes the node's GPUs as a ResourceSlice ([`slice`], sent by [`apiserver`]) whose
//! memory and compute share are consumable capacity and whose attributes say what each GPU is
//! ([`node_gpus`]), and serves the kubelet's plugin API on two unix
//! sockets ([`kubelet`], the generated bindings in [`proto`]). When the kubelet prepares a claim, [`plugin`]
//! reads what the scheduler allocated ([`allocation`]), writes a CDI spec per claim whose hook carries the
//! claim's quota ([`claim_spec`]; the hook puts it in place of the container's own quota settings) and
//! remembers the claim in a checkpoint ([`checkpoint`]) so a restarted plugin keeps it. See
//! docs/engines/kubernetes.md.
//!
//! Beside it, [`daemonset_wait`] for `vgpu-daemonset-wait`, the chart's uninstall hook (it needs the same
//! API client).

pub mod allocation;
pub mod apiserver;
pub mod checkpoint;
pub mod claim_spec;
pub mod daemonset_wait;
pub mod kubelet;
pub mod node_gpus;
pub mod plugin;
pub mod proto;
pub mod publisher;
pub mod slice;
