//! `vgpuctl status`: quota, usage by kind and processes per container and GPU, per GPU what the quotas
//! commit against what it has, read from the state root, and per GPU NVML lists its used memory that no
//! process's figure shows, with the containers that likely hold it; read-only (see `model`). Split in two: the
//! model ([`model::collect`], also `--json`'s shape) and its rendering as a table ([`render::print_table`]).
//! Not here: reading the state root (`vgpu_host::inventory`), the garbage collector (`vgpu_host::gc`).

pub mod model;
pub mod render;

pub use model::{
    collect, Compute, Container, Gpu, GpuTotal, Hami, LikelyHolder, Process, Status, Unattributed,
    SCHEMA_VERSION,
};
pub use render::print_table;

#[cfg(test)]
mod tests;
