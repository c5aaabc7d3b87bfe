//! The driver seam: everything the accounting policies ask outside themselves, as one trait. The library
//! uses `RealDriver` (zero-sized, monomorphised: no cost over calling the driver directly); unit tests use
//! the in-process `fake::FakeDriver`. The policies themselves live in `hooks`.

#[cfg(test)]
pub mod fake;
mod graph_nodes;
mod located;
mod real;
mod seam;

pub use located::{alloc_node_place, Place};
pub use real::RealDriver;
pub use seam::Driver;
