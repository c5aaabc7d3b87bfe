//! libvgpu.so: the CUDA driver API / NVML interposer that enforces a container's GPU memory quota and
//! shows the quota as the GPU's size. See docs/libvgpu.md (behaviour) and docs/architecture.md (contract).
//!
//! Nothing runs at load time: the library only exports hook symbols and initialises on the first hooked
//! call. Modules: `interpose` (dlsym / cuGetProcAddress), `hooks` (driver API), `nvml`, `quota` (per-GPU
//! ledger and slot), `config` (limits file and environment), `track` (what each allocation charged),
//! `virt` (the arithmetic of the virtual view), `real` (the real driver), `lifecycle` (fork, exit, panics).

pub mod config;
mod ffi;
pub mod hooks;
pub mod interpose;
mod lifecycle;
mod log;
pub mod nvml;
mod quota;
mod real;
mod track;
pub mod virt;
