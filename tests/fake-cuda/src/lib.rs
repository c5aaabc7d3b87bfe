//! Fake `libcuda.so.1`: a test double of NVIDIA's driver API for machines without a GPU.
//! See `tests/fake-driver.md` for what it models and the environment it reads.
//!
//! Layout: `types` (CUresult codes, handle types), `driver` (the per-process state, init, fork,
//! contexts), `mem` (the device address arenas and the allocation map), one module per API area
//! (`api_*`), `timeline` (kernel durations and event times; `stream_queues`, a queue per stream), `paging` (managed memory's paging cost), and `procaddr` (`cuGetProcAddress`, resolved against our own symbol table).
//! Every exported function goes through [`cu_fn!`], which turns a Rust `Result` into a `CUresult`
//! and stops any panic at the FFI edge.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

#[macro_use]
mod types;
mod api_batch;
mod api_capture;
mod api_ctx;
mod api_device;
mod api_graph;
mod api_green;
mod api_ipc;
mod api_launch;
mod api_library;
mod api_managed;
mod api_mem;
mod api_module;
mod api_pool;
mod api_share;
mod api_vmm;
mod driver;
mod errors;
mod mem;
mod paging;
mod procaddr;
mod stream_queues;
mod timeline;
