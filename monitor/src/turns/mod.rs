//! The time-quanta arbiter (issue 29): per GPU, one oversubscribe container at a time holds the GPU for a
//! quantum while their memory together does not fit it, told through the turn words of each container's
//! ledger (`vgpu_ledger::region::TurnArea`), with the cgroup freezer behind the words. Modules: `decide`
//! (the state machine, pure), `input` (what a tick sees and answers), `run` (the thread: reading ledgers and NVML, writing turns, freezing),
//! `record` (the host-only files: each GPU's status for `vgpuctl status`, what this arbiter froze), `view`
//! (its `vgpu_turn_*` series).

pub mod decide;
pub mod input;
pub mod record;
pub mod run;
pub mod view;
