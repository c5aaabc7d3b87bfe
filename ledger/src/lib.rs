//! The vgpu ledger crate: everything the other components share, each contract written once.
//! Not here: anything only one component needs (the hook's planning, the library's hooks, vgpuctl's engines),
//! nor what only the host tools share (`vgpu_host`: atomic writes, the limits file's and a live update's
//! writes, safe host reads, the host-only names, the state folder's marker, what a pending shrink allows,
//! the annotations' compute percents).
//!
//! * [`region`]: the ledger ("shared region") — one memory-mapped file per GPU and container that every
//!   process of the container charges and refunds, lock-free, with exact admission and crash-safe reclaim.
//! * [`limits`]: limits.json, the per-container limits written by the hook.
//! * [`live`]: live updates of a running container's limits (`vgpuctl update`): the protocol and the
//!   library's read (the host's write is `vgpu_host::live`).
//! * [`layout`]: where the state lives on the host and inside the container.
//! * [`envlimits`]: the limit environment (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`), read by the hook and the library.
//! * [`envcompute`]: the compute-share environment (`CUDA_DEVICE_SM_LIMIT[_<i>]`, `CUDA_DEVICE_SM_REQUEST[_<i>]`,
//!   `GPU_CORE_UTILIZATION_POLICY`).
//! * [`memmode`]: the unified-memory modes (plain, spill, oversubscribe) and their annotations/variables.
//! * [`keys`]: the registry of the annotation and variable names a container carries (the host-only names,
//!   the Kubernetes annotations among them, are `vgpu_host::keys`).
//! * [`settings`]: one GPU's settings (memory quota and mode, compute share, policy, window), as the hook
//!   plans them, limits.json stores them and `vgpuctl update` changes them.
//! * [`quantity`]: "4Gi" ⇄ bytes.
//! * `fixtures` (tests only, the `test-fixtures` feature): limits files and provisioned folders the
//!   crates' tests share.
//!
//! The formats are described in docs/architecture.md.

pub mod envcompute;
pub mod envlimits;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod keys;
pub mod layout;
pub mod limits;
pub mod live;
pub mod memmode;
pub mod quantity;
pub mod region;
pub mod settings;

pub use limits::{Creator, DeviceLimit, KubeNames, Limits, LimitsError, LIMITS_VERSION};
pub use memmode::MemoryMode;
pub use quantity::{
    format_bytes, parse_quantity, BelowFloor, QuantityError, QuantityProblem, MIN_QUOTA,
};
pub use region::{Kind, Ledger, LedgerError, MeasureLock, Refused, Slot, SlotSnapshot, Snapshot};
pub use settings::GpuSettings;
