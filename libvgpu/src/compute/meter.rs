//! Launches measured or not. Events cost a launch-bound loop a fifth of its speed on an H200 (records
//! and queries are each about a launch's own cost), and a loop well inside its share needs none: while
//! the bucket holds what the process could take beyond its share if it kept the whole GPU busy until
//! the driver's next figure of it is charged (`(1 − share) × (UNMETERED_READ_NS + NVML_LAG_NS)`),
//! launches go unmeasured. They are debited what such launches took by the last figures and the floor
//! (`truth`) charges what the driver saw, whatever ran: the process can then overdraw no more than a
//! measured one spends of its bucket. A loop near its share (a 30% tenant that would take the whole GPU)
//! is measured launch by launch, as before. So at the default 1 s window a share from about 75% up lets
//! a loop inside it run without events; below, launches stay measured.
//!
//! Never unmeasured: before the driver's figure of the process is read (no NVML, or its PID in NVML's
//! list not learned), or before `CONVERGED` launches were measured (the debit starts from their average).
//! A floor that found measured launches short does not keep them measured: unmeasured, nothing but the
//! driver's figure charges them.
//!
//! **Opt-in for now** (`VGPU_COMPUTE_METERED=0`): how the driver's samples come on a real GPU decides how
//! closely the floor follows unmeasured work, and that is not measured yet (`tests/gpu/seal.sh`); on the
//! fake driver a loop whose launches flip between measured and not learned its debit from mixed intervals
//! and was overcharged (1.7 s for 1.06 s of kernels). By default every launch is measured, as before. The share's side: `unmeasured`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// While launches go unmeasured, the launching thread asks NVML this often; with the lag of the driver's
/// samples, the time until what it launches now is charged.
pub(super) const UNMETERED_READ_NS: u64 = 500_000_000;
pub(super) const NVML_LAG_NS: u64 = 250_000_000;
/// Measured launches before any goes unmeasured: the moving average (weight 1/8) an unmeasured launch is
/// debited until the driver's figure teaches its cost has forgotten its first guess.
pub(super) const CONVERGED: u64 = 64;

/// One device's metering in this process.
pub struct Meter {
    /// Launches go unmeasured for now (`Share::meter`).
    pub(super) unmeasured: AtomicBool,
    /// Unmeasured launches ran since the last reading (the floor charges them).
    pub(super) ran: AtomicBool,
    /// What an unmeasured launch is debited when queued (ns; 0: not learned), and since the last reading
    /// how many ran and what they were debited: the bucket follows the work between readings, the floor
    /// corrects it.
    pub(super) cost: AtomicU64,
    pub(super) count: AtomicU64,
    pub(super) debited: AtomicU64,
    /// Launches charged from their events so far.
    pub measured: AtomicU64,
    /// `VGPU_COMPUTE_METERED=0`: launches may go unmeasured (opt-in; otherwise every launch is measured).
    pub(super) allowed: bool,
}

impl Meter {
    pub fn new() -> Meter {
        Meter {
            unmeasured: AtomicBool::new(false),
            ran: AtomicBool::new(false),
            cost: AtomicU64::new(0),
            count: AtomicU64::new(0),
            debited: AtomicU64::new(0),
            measured: AtomicU64::new(0),
            allowed: std::env::var_os(vgpu_ledger::keys::env::COMPUTE_METERED)
                .is_some_and(|v| v == "0"),
        }
    }

    /// Whether launches go unmeasured for now (one load on the launch path).
    pub fn unmeasured(&self) -> bool {
        self.unmeasured.load(Ordering::Relaxed)
    }
}
