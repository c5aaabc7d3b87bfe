//! Work that runs on while frozen: a freeze stops a container's CPU threads, not the GPU work it queued
//! before (one long kernel, a deep queue), which runs on beside the next holder. A container this arbiter
//! holds frozen whose processes NVML shows busy in a reading that covers only time from the grace after
//! the freeze began (and at least `settle`, NVML's sample tail) is found: `busy_while_frozen`, once per
//! freeze counted. Pure, as the rest of `decide`; the runner reports it or kills (`run`).

use super::{Action, Board, Tick};
use std::time::{Duration, Instant};

/// The rule of `busy_while_frozen`: frozen since `frozen_at`, its processes busy (`busy`) in NVML's reading
/// that covers the time from `since` on. Work queued before a freeze may run on for the grace (as a holder
/// told to yield has the grace to drain); a busy reading that begins `max(grace, settle)` or more after the
/// freeze shows work that ran on past it (the settle keeps the sample tail of before the freeze out).
pub fn runs_on_while_frozen(
    frozen_at: Instant,
    busy: bool,
    since: Option<Instant>,
    grace: Duration,
    settle: Duration,
) -> bool {
    busy && since.is_some_and(|s| s >= frozen_at + grace.max(settle))
}

impl Board {
    /// Each member this arbiter holds frozen, at a new NVML reading: its work runs on while frozen
    /// (`runs_on_while_frozen`)? `Action::BusyWhileFrozen` at each such reading, `begins` (and counted) at
    /// the first of the freeze.
    pub(super) fn runs_on(&mut self, t: &Tick, out: &mut Vec<Action>) {
        let since = self.nvml.and_then(|n| n.since);
        let (grace, settle) = (self.s.grace, self.s.settle);
        for s in t.members {
            let Some(m) = self.members.get_mut(&s.id) else {
                continue;
            };
            let (Some(_), Some(at)) = (m.frozen, m.frozen_at) else {
                continue;
            };
            let busy = s.busy == Some(true);
            if !runs_on_while_frozen(at, busy, since, grace, settle) {
                continue;
            }
            let begins = !m.ran_on;
            m.ran_on = true;
            if begins {
                self.counts.busy_while_frozen += 1;
            }
            out.push(Action::BusyWhileFrozen {
                id: s.id.clone(),
                after: since.map_or(Duration::ZERO, |s| s.saturating_duration_since(at)),
                begins,
            });
        }
    }
}
