//! The driver API hooks, one module per allocation family, and their shared machinery in `common` (the
//! `hook!` macro, the `Interposer`, which quota a call is charged to, the charge / refund / true-up helpers).
//! This file only lists the modules and re-exports the hooks. Every family's own policy lives in its module.
//!
//! Adding a hook: write it in its family module with `hook!` and add its name to `libvgpu/abi/symbols.rs`.

mod arrays;
mod common;
mod contexts;
mod device;
mod graphs;
mod ipc;
mod launch;
mod legacy;
mod libraries;
mod limits;
mod managed;
mod measure;
mod memory;
mod modules;
mod nvml;
mod placement;
mod pools;
mod stack;
mod streams;
#[cfg(test)]
pub(crate) mod testing;
mod transfers;
mod truth;
mod vmm;

pub use arrays::*;
pub use contexts::*;
pub use device::*;
pub use graphs::*;
pub use ipc::*;
pub use launch::*;
pub use legacy::*;
pub use libraries::*;
pub use limits::*;
pub use memory::*;
pub use modules::*;
pub use nvml::*;
pub use placement::*;
pub use pools::*;
pub use streams::*;
pub use transfers::*;
pub use vmm::*;
