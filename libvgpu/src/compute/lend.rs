//! The elastic share in the process (issue 42): a share with a request (its floor) below its limit (its
//! cap) runs at its limit while the GPU is its alone, at its request as soon as a neighbour is busy, and
//! is lent what the busy tenants leave idle in proportion to its request. Who is busy comes from the
//! driver (NVML's per-process SM utilisation, `busy`), never from a neighbour's ledger: no tenant learns
//! more of another than NVML shows it. The host's share wall applies `vgpu_host::division` to the same
//! figures and freezes a borrower that keeps a floor starved; this is the tenant's own side, which makes
//! the wall's freezes rare.
//!
//! A tenant sees neither the others' requests nor their limits, so it cannot compute the division
//! itself; it converges on it instead, as TCP's flows converge on a fair rate:
//! - alone (the others below `IDLE_BELOW`, NVML's figures summed; for `ALONE_AFTER_NS` when it shared the
//!   GPU before: a neighbour paced by its own bucket pauses for most of each window): the limit;
//! - a neighbour busy while it was alone: the floor at once, nothing lent. NVML's samples of a waking
//!   neighbour come late (every 200 ms on an H200, every other query empty: a floor waited 435 ms at
//!   the median for its time back), so the GPU's own timing answers first: while alone, the borrower's
//!   last few ms of measured work (`launch_charge::SoloBook::wake_stretch`: `Σ elapsed / Σ solo` over
//!   4-8 ms of its work, where the charge's `stretch` sums ~64 ms and took tens of ms of sliced work to
//!   move) reading as stretched `WAKE_STRETCH` past what its 64 ms stretch read when NVML last found it
//!   alone (another context took GPU time between its kernels) gives the floor back at once
//!   (`stretched`), and NVML's readings decide from there as after any wake (quiet for
//!   `ALONE_AFTER_NS`: alone again). False wakes are bounded: a saturated GPU's lower clock reads ~0.15
//!   (under the bar); one whose streams stretch each other alone reads as stretched at its baseline; a
//!   gap in one interval moves the window by that interval's part of it at most (each interval reads as
//!   two contexts at most). A false wake only lowers the tenant's own entitlement to its request (never
//!   below, nobody else's) until NVML's quiet second gives the GPU back, and a wake then needs
//!   `WAKE_STRETCH` past the false one (`false_wake`, for `FALSE_WAKE_KEPT_NS`): three false wakes at
//!   most a minute;
//! - every `STEP_NS` while others are busy, on the figures smoothed over `SMOOTH_NS` (a paced tenant's
//!   use comes in bursts): where more than `SATURATED_BELOW` of the GPU is idle and the tenant wants more
//!   (its bucket held it back since the last step), it is lent `request × (idle − margin)` more (so the
//!   busy tenants grow in proportion to their requests, and together approach the margin without
//!   crossing it); where less is idle, what it was lent is halved (every borrower alike: a neighbour may
//!   be held below its floor by what it borrows, which it cannot see). Growth in proportion to the
//!   request and halving bring the lent parts to the proportions of the requests (weighted max-min), each
//!   entitlement between its request and its limit.
//!
//! Without NVML nothing changes: the entitlement stays the limit, as a share without a request is. Before
//! NVML's PID of this process is known, its own use counts among the others': it is never alone, and
//! grows into an idle GPU step by step (a tenant that kept its PID from being learned gains nothing).

use crate::launch_charge::CONTEXT;

/// Others using less than this of the GPU together (percent) leave it to this tenant. A neighbour this
/// small keeps its floor anyway: the GPU time-slices busy contexts.
pub const IDLE_BELOW: u32 = 5;
/// How long the others must stay below `IDLE_BELOW` before a tenant that shared the GPU takes it alone.
pub const ALONE_AFTER_NS: u64 = 1_000_000_000;
/// Less than this left idle (percent, smoothed): the GPU is saturated.
pub const SATURATED_BELOW: f64 = 5.0;
/// How often what is lent grows or shrinks while others are busy: NVML's figures are means over up to a
/// second (its sample period is 200 ms on an H200), and faster steps would answer their own echo.
pub const STEP_NS: u64 = 500_000_000;
/// The time constant the figures are smoothed over.
pub const SMOOTH_NS: u64 = 1_000_000_000;
/// How old a borrower's reading may get (a launching thread asks NVML then: 1.4 ms in 200, 0.7% of the
/// borrower's time, only while it borrows).
pub const LEND_REFRESH_NS: u64 = 200_000_000;

/// How far past its stretch when last found alone (thousandths of a context) a tenant's last few ms of
/// work must read as stretched for the GPU's timing to give its floor back before NVML shows the
/// neighbour (and past a false wake's stretch): a second context slicing the GPU stretches it by up to
/// one context, a saturated GPU's lower clock by ~0.15.
pub const WAKE_STRETCH: u64 = 300;
/// How long the bar a false wake raised is kept (`Lending::false_wake`): a process wakes falsely at most
/// three times within it, each costing it at most its borrowing until NVML's quiet second (`ALONE_AFTER_NS`).
pub const FALSE_WAKE_KEPT_NS: u64 = 60_000_000_000;

const PPM: u64 = 1_000_000;

/// One share's lending state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lending {
    /// The GPU was this tenant's alone at the last reading.
    pub alone: bool,
    /// What is lent above the request while others are busy, ppm of the GPU's time.
    pub lent: u64,
    /// When `lent` last grew or shrank (CLOCK_MONOTONIC ns).
    pub stepped_at: u64,
    /// Since when the others have been below `IDLE_BELOW` while this tenant was not alone (0: they are
    /// not).
    pub quiet_since: u64,
    /// The others' and this process's utilisation, percent, smoothed over `SMOOTH_NS`, and when last
    /// read (0: never).
    pub others: f64,
    pub own: f64,
    pub read_at: u64,
    /// This tenant's own stretch (`launch_charge::CONTEXT` thousandths) when NVML last found it alone:
    /// the baseline `stretched` compares with.
    pub alone_stretch: u64,
    /// The wake stretch that gave the floor back, until NVML shows a neighbour (0: none, or confirmed).
    pub woke_by: u64,
    /// The highest wake stretch whose wake NVML never confirmed (0: none): a wake needs `WAKE_STRETCH`
    /// more from then on, until `FALSE_WAKE_KEPT_NS` pass without another.
    pub false_wake: u64,
    /// When the last false wake was found (CLOCK_MONOTONIC ns).
    pub false_wake_at: u64,
}

impl Lending {
    /// Before any reading: the limit (`alone`), as without a request.
    pub const START: Lending = Lending {
        alone: true,
        lent: 0,
        stepped_at: 0,
        quiet_since: 0,
        others: 0.0,
        own: 0.0,
        read_at: 0,
        alone_stretch: CONTEXT,
        woke_by: 0,
        false_wake: 0,
        false_wake_at: 0,
    };

    /// The entitlement, ppm: the limit alone, else the request and what is lent, at most the limit.
    pub fn entitled(&self, request: u64, limit: u64) -> u64 {
        if self.alone {
            limit
        } else {
            request.saturating_add(self.lent).min(limit)
        }
    }

    /// The state after this tenant's last few ms of work read as `stretch` contexts (thousandths,
    /// `launch_charge::SoloBook::wake_stretch`) at `now`: while alone, `WAKE_STRETCH` past its baseline
    /// (and past any wake NVML did not confirm) gives the floor back at once, as a neighbour's NVML
    /// samples would later. Only ever down to the request, nothing lent: the tenant's own entitlement.
    pub fn stretched(self, stretch: u64, now: u64) -> Lending {
        let bar = (self.alone_stretch.max(CONTEXT) + WAKE_STRETCH)
            .max(self.false_wake.saturating_add(WAKE_STRETCH));
        if !self.alone || stretch < bar {
            return self;
        }
        Lending {
            alone: false,
            lent: 0,
            stepped_at: now,
            quiet_since: 0,
            woke_by: stretch,
            ..self
        }
    }

    /// NVML's reading found this tenant alone while its work read as `stretch` (the charge's horizon,
    /// `launch_charge::SoloBook::stretch`: steadier than the wake's): the baseline.
    pub fn seen_alone(self, stretch: u64) -> Lending {
        match self.alone {
            true => Lending {
                alone_stretch: stretch,
                ..self
            },
            false => self,
        }
    }

    /// The state after a reading at `now` of the others' and this process's SM utilisation (percent), for
    /// a share of `request` and `limit` ppm; `wants`: its bucket held it back since the last step (it has
    /// work beyond its entitlement).
    pub fn step(
        self,
        request: u64,
        limit: u64,
        (others, own): (u32, u32),
        wants: bool,
        now: u64,
    ) -> Lending {
        let a = match self.read_at {
            0 => 1.0,
            t => (now.saturating_sub(t) as f64 / SMOOTH_NS as f64).min(1.0),
        };
        let mut l = Lending {
            quiet_since: 0,
            others: self.others + a * (f64::from(others) - self.others),
            own: self.own + a * (f64::from(own) - self.own),
            read_at: now.max(1),
            // NVML shows the neighbour the stretch woke for: a true wake.
            woke_by: if others < IDLE_BELOW { self.woke_by } else { 0 },
            // A bar raised by false wakes long ago is forgotten: the tenant's work may have changed.
            false_wake: match now.saturating_sub(self.false_wake_at) >= FALSE_WAKE_KEPT_NS {
                true => 0,
                false => self.false_wake,
            },
            ..self
        };
        if others < IDLE_BELOW {
            let since = if self.quiet_since == 0 {
                now.max(1)
            } else {
                self.quiet_since
            };
            if self.alone || now.saturating_sub(since) >= ALONE_AFTER_NS {
                // Alone again without NVML ever showing a neighbour: the stretch woke it falsely, and
                // only a larger one wakes it from now on.
                return Lending {
                    alone: true,
                    lent: 0,
                    stepped_at: now,
                    woke_by: 0,
                    false_wake: l.false_wake.max(l.woke_by),
                    false_wake_at: if l.woke_by > 0 { now } else { l.false_wake_at },
                    ..l
                };
            }
            return Lending {
                quiet_since: since,
                ..l
            };
        }
        if self.alone {
            // A neighbour woke: its floor first, and the figures from here on.
            return Lending {
                alone: false,
                lent: 0,
                stepped_at: now,
                others: f64::from(others),
                own: f64::from(own),
                ..l
            };
        }
        if now.saturating_sub(self.stepped_at) < STEP_NS {
            return l;
        }
        // Saturation on the smoothed figures (a paced neighbour's burst is no full GPU); growth on the
        // lesser of the smoothed and the last reading's idle time (the mean lags a growth just made).
        let idle = (100.0 - l.others - l.own).max(0.0);
        let idle_now = (100.0 - f64::from(others) - f64::from(own)).max(0.0);
        if idle < SATURATED_BELOW {
            // The GPU is full: a neighbour may be held below its floor by what this one borrows (it
            // cannot tell; the neighbour's floor comes first), so every borrower gives back half.
            l.lent = self.lent / 2;
        } else if wants && idle.min(idle_now) - SATURATED_BELOW >= 1.0 {
            let idle = idle.min(idle_now);
            // In proportion to the request and to what is idle past the margin, so that the busy tenants
            // together approach the margin without crossing it; at least a point a step, so that a tenant
            // with a tiny request still fills the GPU.
            let more = ((request as f64 * (idle - SATURATED_BELOW) / 100.0) as u64).max(PPM / 100);
            l.lent = (self.lent + more).min(limit.saturating_sub(request));
        }
        l.stepped_at = now;
        l
    }
}

#[cfg(test)]
mod tests;
