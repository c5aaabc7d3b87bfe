//! The device model shared by the fake `libcuda.so.1` and the fake `libnvidia-ml.so.1`
//! (see `tests/fake-driver.md`): which devices exist, their UUIDs, how `CUDA_VISIBLE_DEVICES`
//! maps CUDA ordinals to them, and the state file that makes device memory global to every
//! process using the fakes, whatever container or PID namespace it runs in.

pub mod clock;
pub mod config;
pub mod state;

pub use clock::monotonic_ns;
pub use config::{Config, MAX_DEVICES};
pub use state::{Shared, Snapshot};
