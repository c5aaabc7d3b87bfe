//! vgpu's Kubernetes device plugin (`vgpu-device-plugin`, run by the chart's optional DaemonSet on every GPU
//! node): for clusters without DRA's consumable capacity and without HAMi, GPU memory and compute share as
//! extended resources the default scheduler counts, each container's grant kept on one GPU and written into
//! the container as the quota vgpu's runtime enforces.
//!
//! * [`devices`]: the node's GPUs as the two resources' device IDs (`vgpu.io/memory` in units of
//!   `--memory-unit`, `vgpu.io/compute` in percents), and which GPU an ID is on.
//! * [`prefer`]: `GetPreferredAllocation`'s choice: every ID of a container on one GPU, best fit.
//! * [`allocate`]: `Allocate`'s answer for one container (the quota as `vgpu.io/*` annotations and
//!   HAMi's variables, the GPU's device node), or its refusal when the kubelet's IDs span GPUs.
//! * [`service`]: the gRPC service the kubelet calls on the plugin's socket; [`register`]: the plugin's
//!   registration with the kubelet; [`proto`]: the bindings generated from `proto/`.
//!
//! See docs/engines/kubernetes.md ("The device plugin").

pub mod allocate;
pub mod devices;
pub mod prefer;
pub mod proto;
pub mod register;
pub mod service;
