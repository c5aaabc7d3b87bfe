//! The share's side of metering (`meter`): the floor after each reading of the driver's figure, whether
//! launches go unmeasured for now, and a launch let through unmeasured.

use std::sync::atomic::Ordering;

use vgpu_ledger::region::PPM;

use super::meter::{goes_unmeasured, learned_debit, CONVERGED, NVML_LAG_NS, UNMETERED_READ_NS};
use super::{lock, mono_ns, trace, Share};
use crate::ffi::*;
use crate::log;

impl Share {
    /// After a reading of NVML: what this process used by the driver's figure and was not charged
    /// (`truth`) is charged now. The launches in flight count as charged (their estimates are debited).
    pub(super) fn floor(&self) {
        if !self.busy.truth.has_news() {
            return;
        }
        let in_flight = {
            let q = lock(&self.timer.flights);
            q.queue
                .iter()
                .chain(q.retired.iter())
                .map(|f| f.estimate)
                .sum()
        };
        let short = self.busy.truth.floor(in_flight);
        // Unmeasured launches since the last reading: the floor is the rest of their charge, not a
        // shortfall. What they took each teaches their next debit: nine tenths of it (a debit too high is
        // never given back; one too low, the next floor makes up).
        let m = &self.meter;
        let unmeasured = m.ran.swap(false, Ordering::Relaxed);
        self.busy.truth.set_suspect(short > 0 && !unmeasured);
        let n = m.count.swap(0, Ordering::Relaxed);
        let debited = m.debited.swap(0, Ordering::Relaxed);
        if let Some(cost) = learned_debit(debited, short, n, self.estimate.load(Ordering::Relaxed))
        {
            m.cost.store(cost, Ordering::Relaxed);
        }
        if short > 0 {
            self.area().charge(short);
            if trace::on() {
                log::debug(format_args!(
                    "compute share: device {}: charged {} us the driver saw used and the events did not",
                    self.quota.ordinal,
                    short / 1000
                ));
            }
        }
    }

    /// Whether launches go unmeasured for now (the module's rule), decided at every launch let through
    /// with the bucket's level `tokens`.
    pub(super) fn meter(&self, tokens: i64) {
        let (truth, m) = (&self.busy.truth, &self.meter);
        if !m.allowed {
            return; // the default: nothing to decide, and no write per launch
        }
        let headroom = (PPM - self.rate.ppm().min(PPM)) * (UNMETERED_READ_NS + NVML_LAG_NS) / PPM;
        let free = truth.active()
            && m.measured.load(Ordering::Relaxed) >= CONVERGED
            && goes_unmeasured(
                m.unmeasured.load(Ordering::Relaxed),
                tokens,
                headroom,
                mono_ns().saturating_sub(m.held_at.load(Ordering::Relaxed)),
            );
        if m.unmeasured.swap(free, Ordering::Relaxed) != free && trace::on() {
            log::debug(format_args!(
                "compute share: device {}: launches {}",
                self.quota.ordinal,
                if free {
                    "unmeasured (the driver's figure charges them)"
                } else {
                    "measured"
                }
            ));
        }
    }

    /// A launch let through while launches go unmeasured: no event; debited what such launches took by
    /// the last figures (until one taught it, what measured launches cost on average). NVML is read every
    /// `UNMETERED_READ_NS` meanwhile.
    pub(super) fn launch_unmeasured(
        &self,
        entered: Option<u64>,
        held: u64,
        launch: impl FnOnce() -> CUresult,
    ) -> CUresult {
        self.busy.refresh_every(mono_ns(), UNMETERED_READ_NS);
        let (r, driver) = trace::timed(entered, launch);
        if r == CUDA_SUCCESS {
            let m = &self.meter;
            let ns = match m.cost.load(Ordering::Relaxed) {
                0 => self.estimate.load(Ordering::Relaxed),
                ns => ns,
            };
            m.ran.store(true, Ordering::Relaxed);
            m.count.fetch_add(1, Ordering::Relaxed);
            m.debited.fetch_add(ns, Ordering::Relaxed);
            let tokens = self.area().settle_launches(ns, 0, 1);
            self.busy.truth.booked(ns);
            if trace::on() {
                // Counted as untimed at its debit, and the interval's line written from here too: a
                // process whose launches all go unmeasured otherwise writes none.
                self.trace.untimed(ns);
                let gate = self.area().gate_closed();
                self.trace.tick(mono_ns(), self.quota.ordinal, tokens, gate);
            }
        }
        self.spent(entered, driver, held);
        r
    }
}
