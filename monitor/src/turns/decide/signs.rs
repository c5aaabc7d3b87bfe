//! What a tick takes in of each member, and whose word counts (issue 44): NVML's readings (its processes
//! busy, what they hold) are the host's measure and decide whether a container wants the GPU, worked and
//! what it needs; the turn words are the tenant's and are heard only where they can cost that tenant
//! alone: a container told to wait whose waiting threads' time moves (`waiting > 0` while `waited_ns`
//! moves) is queued for a turn again, and a turn given on such words in which NVML never saw it work
//! makes it deaf (its words unheard) until the turns end. So a container that forges its ledger (a total,
//! `launches`, waiting threads) never makes a neighbour wait or freeze: it wants nothing by NVML, and
//! its forged waits buy it at most one idle turn, which the idle rule cuts short. Memory pressure
//! (`pressure`) is NVML's too. Pure, as the rest of `decide`.

use super::{Board, Member, Tick, MARGIN};
use std::time::{Duration, Instant};
use vgpu_ledger::region::TurnMode;

impl Board {
    /// It wants the GPU: this arbiter froze it or owes it a turn, or NVML saw it busy within `linger`.
    pub(super) fn wants(&self, m: &Member, now: Instant) -> bool {
        wants(m, now, self.s.linger)
    }

    /// Records each member's NVML figures and signs of wanting the GPU and of working, and hears the
    /// waiting words of those told to wait.
    pub(super) fn note_signs(&mut self, t: &Tick) {
        let holder = self.holder.as_ref().map(|h| h.id.clone());
        let contended = self.contended;
        for s in t.members {
            let m = self
                .members
                .entry(s.id.clone())
                .or_insert_with(|| new_member(t.now));
            if let Some(h) = s.held {
                m.held = h;
            }
            if let Some(b) = s.busy {
                m.quiet = !b;
                if b {
                    m.active = Some(t.now);
                    m.worked = Some(t.now);
                }
            }
            let turn = s.turn.unwrap_or_default();
            // A waiting thread adds to `waited_ns` as it waits: a count whose time stands still was left
            // by a thread killed while waiting, and is no sign.
            let waits = s.turn.is_some()
                && turn.waiting > 0
                && m.waited_ns.is_some_and(|w| w != turn.waited_ns);
            if s.turn.is_some() {
                m.waited_ns = Some(turn.waited_ns);
            }
            let told_to_wait = contended && m.mode == TurnMode::Wait;
            if waits && told_to_wait && !m.owed && !m.deaf && holder.as_deref() != Some(&s.id) {
                (m.owed, m.on_words) = (true, true);
            }
        }
        let (now, linger) = (t.now, self.s.linger);
        for m in self.members.values_mut() {
            match (wants(m, now, linger), m.since) {
                (true, None) => m.since = Some(now),
                (false, Some(_)) => m.since = None,
                _ => {}
            }
            m.peak = match m.since {
                Some(_) => m.peak.max(m.held),
                None => m.held,
            };
        }
    }

    /// Memory is short for the containers that want the GPU, by NVML (see the module's header): `need`
    /// is what they need together, `largest` the most one of them needs.
    pub(super) fn pressure(&self, need: u64, largest: u64) -> bool {
        let Some(n) = self.nvml else { return false };
        let total = n.total as f64;
        let margin = if self.contended { 2.0 * MARGIN } else { MARGIN };
        // Taking turns hides the pressure (only the holder runs, the others' pages may leave the device):
        // what each needed at its most in its spell counts, as well as what the device holds now.
        let together = n.used.max(need.saturating_add(n.others));
        // Turns free only what all but the largest need: one that holds next to nothing gains nothing.
        let relief = need.saturating_sub(largest);
        together as f64 >= total * (1.0 - margin) && relief as f64 >= total * MARGIN
    }

    /// The holder's turn was given on its own waiting words and NVML never saw it work in it: its words
    /// are not heard again until the turns end.
    pub(super) fn deafen_if_idle_on_words(&mut self, id: &str, granted: Instant) {
        if let Some(m) = self.members.get_mut(id) {
            if m.on_words && m.worked.is_none_or(|w| w <= granted) {
                m.deaf = true;
            }
            m.on_words = false;
        }
    }

    /// The holder is idle: NVML's last reading, from after its grant, showed it idle, and no reading
    /// showed it working for `idle`.
    pub(super) fn holder_idle(&self, m: &Member, granted: Instant, now: Instant) -> bool {
        let from_grant = self
            .nvml
            .and_then(|n| n.since)
            .is_some_and(|s| s >= granted);
        m.quiet
            && from_grant
            && m.worked
                .is_none_or(|w| now.saturating_duration_since(w) >= self.s.idle)
    }
}

fn wants(m: &Member, now: Instant, linger: Duration) -> bool {
    m.frozen.is_some()
        || m.owed
        || m.active
            .is_some_and(|a| now.saturating_duration_since(a) < linger)
}

fn new_member(now: Instant) -> Member {
    Member {
        mode: TurnMode::Unmanaged,
        epoch: 0,
        told: now,
        waited_ns: None,
        active: None,
        since: None,
        worked: None,
        quiet: false,
        held: 0,
        peak: 0,
        owed: false,
        on_words: false,
        deaf: false,
        frozen: None,
        frozen_at: None,
        ran_on: false,
        stopped: None,
        undrained: false,
        waited: Duration::ZERO,
    }
}
