//! libvgpu_core.so: the CUDA driver API / NVML interposer core that enforces a container's GPU memory
//! quota and shows the quota as the GPU's size. See docs/libvgpu.md (behaviour) and docs/architecture.md
//! (the module table).
//!
//! Nothing runs at load time: the library only exports hook symbols and initialises on the first hooked
//! call. Layers, each importing only those below it:
//! - `interpose` (dlsym routing, cuGetProcAddress) and `hooks` (one module per allocation family);
//! - `compute` (the compute share: launches held back and measured against the container's bucket),
//!   `turns` (the time-quanta turn gate of oversubscribed GPUs),
//!   `driver` (the seam the policies call the driver through), `settings` and `lifecycle` (configuration
//!   and process life), `devices` (which quota governs a device), `quota` (one GPU's ledger and slot),
//!   `records` (what this process charged), `identity` (a device's UUID, MIG parent and NVML index),
//!   `userfiles` (the environment mode's per-user folder and which of its files may be used);
//! - leaves: `config` (the one settings model: the limits file or the environment, each GPU's
//!   `GpuSettings`), `clock` (CLOCK_MONOTONIC), `virt` (arithmetic of the view), `solo` (what a launch is charged under
//!   a compute share), `real` (the real symbols), `error`,
//!   `guard` (panics and exit), `log`, `ffi`.

mod clock;
pub mod compute;
pub mod config;
mod devices;
mod driver;
pub mod error;
mod ffi;
mod guard;
pub mod hooks;
mod identity;
pub mod interpose;
mod launch_charge;
mod lifecycle;
mod live;
mod log;
mod quota;
mod real_symbols;
mod records;
mod settings;
mod streams;
#[cfg(test)]
mod surface;
mod turns;
mod userfiles;
pub mod virt;
