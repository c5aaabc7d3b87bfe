//! What the scrape shows of the time-quanta arbiter (`Arbiter::view`), registered as the `vgpu_turn_*`
//! series by `metrics::turns`: per GPU whether it is contended, its queue, grants, revocations, out-of-turn
//! findings and freezes whose work ran on (`busy_while_frozen`); per oversubscribe container GPU whether it
//! holds the GPU, the time it waited for its turn (as the arbiter measured it) and whether the arbiter holds
//! it frozen. Not here: the decisions (`decide`), the thread
//! (`run`), the series themselves (`metrics::turns`).

/// The arbiter's figures at a scrape.
#[derive(Debug, Clone, Default)]
pub struct TurnsView {
    /// The arbiter runs (`[monitor.turns] enabled`).
    pub on: bool,
    /// Per GPU with oversubscribe containers: (UUID, contended, queue length, grants, revocations, out of
    /// turn, busy while frozen).
    pub gpus: Vec<(String, bool, usize, u64, u64, u64, u64)>,
    /// Per member: (container index, its GPU's index in it, holds the GPU, seconds waited, frozen by the
    /// arbiter), indices into the scrape's reading.
    pub members: Vec<(usize, usize, bool, f64, bool)>,
    /// Writes, freezes and thaws it could not make.
    pub failures: u64,
}
