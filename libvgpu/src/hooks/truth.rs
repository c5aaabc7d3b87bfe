//! The truth-up: memory NVML says this process holds on a device beyond everything its ledger slot holds
//! (code the driver loads lazily at a kernel's first use, driver internals no hook sees) is charged too.
//! Measured per process from NVML's process list; which PID is ours is `measure`'s.
//!
//! Done at synchronisations and memory queries, at most every `PERIOD_MS` per process (a process-list
//! query costs far more than a hooked call), never on an allocation. The excess is charged forced (the
//! memory is already taken) as module memory, and given back as NVML's figure falls. Where NVML is missing
//! or this process's PID is not known yet, nothing happens. On an H200, PyTorch and NCCL's lazily loaded
//! kernels held about 260 MiB per process this way.

use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_ledger::Kind;

use super::common::{Interposer, Target};
use crate::driver::Driver;
use crate::{log, quota};

/// How often a process asks NVML at most.
pub(crate) const PERIOD_MS: u64 = 200;
/// Moves smaller than this are left alone (NVML's figure breathes by a few pages).
const HYSTERESIS: u64 = 2 << 20;

/// When a process last asked (a fork child may ask at once: the worst is one early query).
static LAST: AtomicU64 = AtomicU64::new(0);

/// The unattributed memory to hold charged: NVML's figure for the process less what its slot holds
/// besides the truth-up's own charge.
pub(crate) fn excess(nvml_own: u64, slot_total: u64, charged: u64) -> u64 {
    nvml_own.saturating_sub(slot_total.saturating_sub(charged))
}

impl<D: Driver> Interposer<'_, D> {
    /// Charges (or gives back) what NVML shows this process holding beyond its slot, rate-limited.
    pub(crate) fn reconcile_truth(&self) {
        let now = quota::millis();
        let last = LAST.load(Ordering::Relaxed);
        if now.saturating_sub(last) < PERIOD_MS
            || LAST
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.truth_up();
    }

    /// The truth-up itself, now.
    pub(crate) fn truth_up(&self) {
        if self.drv.unlimited() {
            return;
        }
        // memory opened from an exporter that ended is this process's now (NVML may say so): charged as
        // the open first, so the truth-up does not charge it a second time
        self.settle_ipc_opens();
        let (Target::Charge(q), dev, _) = self.target_current() else {
            return;
        };
        let Some(pid) = self.nvml_pid() else {
            log::debug(format_args!(
                "truth-up on {}: this process's NVML PID is not known",
                q.uuid
            ));
            return;
        };
        let Some(procs) = self.drv.device_processes(&q.uuid) else {
            log::debug(format_args!(
                "truth-up on {}: no per-process usage from NVML",
                q.uuid
            ));
            return;
        };
        let own = procs
            .iter()
            .filter(|p| p.0 == pid)
            .map(|p| p.1)
            .sum::<u64>();
        // What it charged is part of this process's slot (`Records::truth_charged`, per device).
        let slot = q.own_used();
        let (was, want, now) = self.rec.truth_charged.update(
            dev as u64,
            || 0,
            |charged| {
                let was = *charged;
                let want = excess(own, slot, was);
                if want > was + HYSTERESIS || want + HYSTERESIS < was {
                    *charged = want;
                }
                (was, want, *charged)
            },
        );
        log::debug(format_args!(
            "truth-up on {}: NVML {own} bytes for PID {pid}, slot {slot}, unattributed {want} (was {was})",
            q.uuid
        ));
        let delta = now as i128 - was as i128;
        if delta > 0 {
            q.charge_forced(Kind::Module, delta as u64);
        } else if delta < 0 {
            q.refund(Kind::Module, (-delta) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::World;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_excess_is_nvmls_figure_beyond_what_the_slot_holds_besides_itself() {
        assert_eq!(excess(1516 * MIB, 1259 * MIB, 0), 257 * MIB);
        assert_eq!(
            excess(1516 * MIB, 1516 * MIB, 257 * MIB),
            257 * MIB,
            "its own charge is not counted twice"
        );
        assert_eq!(
            excess(100, 500, 0),
            0,
            "a slot above NVML's figure (managed memory not resident) is no excess"
        );
    }

    // Regression (GPU, 2 x H200): NCCL and PyTorch held ~257 MiB per process no hook saw (lazily loaded
    // kernels): NVML 1516 MiB, ledger 1259 MiB.
    #[test]
    fn memory_no_hook_saw_is_charged_and_given_back_as_nvml_falls() {
        let w = World::new(8 << 30);
        w.fake.nvml.set(true);
        w.fake.per_process.set(true);
        w.fake.same_pid_ns.set(true);
        assert!(w.q.charge(Kind::Data, 1259 * MIB));
        w.fake.own_used.set(1516 * MIB);
        w.fake
            .others
            .borrow_mut()
            .insert(w.fake.pid.get() + 1, 4000 * MIB);
        let e = w.interposer();
        e.truth_up();
        assert_eq!(
            w.usage(Kind::Module),
            257 * MIB,
            "another process's usage is not ours"
        );
        e.truth_up();
        assert_eq!(w.usage(Kind::Module), 257 * MIB, "counted once");
        w.fake.own_used.set(1259 * MIB + 257 * MIB + MIB);
        e.truth_up();
        assert_eq!(
            w.usage(Kind::Module),
            257 * MIB,
            "a move within the hysteresis is left alone"
        );
        w.fake.own_used.set(1259 * MIB);
        e.truth_up();
        assert_eq!(
            w.usage(Kind::Module),
            0,
            "given back when NVML's figure falls"
        );
    }

    #[test]
    fn without_our_pid_or_nvml_nothing_happens() {
        let w = World::new(8 << 30);
        w.fake.same_pid_ns.set(false);
        w.fake.own_used.set(1 << 30);
        w.interposer().truth_up();
        assert_eq!(w.used(), 0);
    }
}
