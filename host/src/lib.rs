//! vgpu's host side, the rooms the runtime shim, the hook and vgpuctl share. Not here: anything the
//! interposer links (that is `vgpu_ledger`, kept lean), a tool's own decisions (planning, admission, gc:
//! `vgpu_oci`; status, the monitor: `vgpuctl`).
//!
//! * [`config`]: `/etc/vgpu/config.toml`, the whole file (its `[monitor]` table too), parsed once into
//!   typed values.
//! * [`nvml`]: the one NVML binding of the host tools, behind the [`nvml::Nvml`] trait, with a fake.
//! * [`inventory`]: the one reader of the state root: containers, their limits, ledgers and owners,
//!   always through the safe host-file reader.

pub mod config;
pub mod inventory;
pub mod nvml;
