//! The arbiter's decisions for one GPU (issue 29, time quanta): a state machine over what each tick sees
//! of the GPU's oversubscribe containers (NVML at each collection: which of them used the GPU and what
//! their processes hold; their ledgers' turn words), answering with the turn words to write and the
//! cgroups to freeze or thaw. Pure: time is passed in, nothing is read or written here. Not here: reading
//! and writing (`run`), the cgroup files (`freezer`), what the status file holds (`record`).
//!
//! **Whose word counts** (issue 44): whatever can freeze, slow or hand the GPU away from a container is
//! decided from what the host measures (NVML's per-process utilisation and memory, attributed by cgroup)
//! and what the arbiter itself told; a container's own turn words may only cost that container (`signs`).
//!
//! * **Wanting the GPU** (`signs`): NVML saw its processes use the GPU within `linger`; or it is owed a
//!   turn: it wanted the GPU when the turns began or was handed past still wanting it (in the queue), or
//!   this arbiter froze it. Told to wait and not queued, its own waiting threads (the library's words)
//!   queue it again, but a turn granted on its words in which NVML never saw it work ends its hearing:
//!   its words are not heard again until the turns end (a forger loses its own turns, no one else's).
//! * **Contention** (serialise only when it helps, `signs::pressure`): two or more want the GPU AND memory
//!   is short by NVML: what their processes need (each one's most in its spell of wanting, as NVML listed
//!   it) with what other processes hold, or the device's used memory, is within `MARGIN` of the total
//!   (left again below twice the margin, so the verdict does not flap; turns end only once memory was not
//!   short for a whole turn, `quantum + grace`) AND taking turns frees something: what all but the largest
//!   need is at least `MARGIN` of the device (a container that holds next to nothing gains nothing by
//!   making a neighbour wait). `force` takes turns whenever two want it (a measurement knob). Not
//!   contended: every container `Free`, and what this arbiter froze thawed.
//! * **Turns** in arrival order (the order they began wanting): the holder `Hold`; every other told to
//!   `Yield` when it was running, then `Wait` once drained (or after `grace`). The holder keeps the GPU
//!   for `quantum`, or less when idle (NVML showed it idle in a reading from after its grant, and not
//!   busy for `idle`) and someone waits; then it is told `Yield`, and the next gets `Hold` when it drained
//!   (`drained == epoch`: its own word, which can only shorten its own turn), when NVML shows it idle
//!   since, or after `grace` whatever it did: no grant is ever lost. It goes to the back of the queue if
//!   it still wants the GPU.
//! * **Revocation and the wall**: the turn words are the tenant's to write, so each is a hint. A
//!   container told to stop (yield or wait) whose processes NVML shows busy, in a reading that covers
//!   only time from `settle` after it was told (NVML's sample tail), is using the GPU out of turn (it
//!   forged its mode or its drain, dropped the preload, or never drained): its cgroup is frozen until its
//!   turn comes, a revocation when it was the holder handed past undrained, else an out-of-turn finding.
//!   A container that did not drain only because it launched nothing since (the library drains at a
//!   launch) is idle by NVML and never frozen. Without NVML nothing is frozen and no turns are taken.
//! * **Work that runs on while frozen** (`runs_on`): a freeze stops CPU threads, not GPU work already
//!   queued. A container held frozen whose processes NVML shows busy in a reading that covers only time
//!   from the grace (at least `settle`) after the freeze began: its work runs on while frozen
//!   (`Action::BusyWhileFrozen`, once per freeze counted); the runner reports it, or kills under the
//!   kill policy.

pub use super::input::{Action, Counts, Figures, GpuNvml, Seen, Settings, Tick, Why, MARGIN};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use vgpu_ledger::region::TurnMode;

#[derive(Debug, Clone)]
struct Member {
    /// What it was last told, and when.
    mode: TurnMode,
    epoch: u64,
    told: Instant,
    /// Its last `waited_ns` word (None: none read yet): its waiting threads' time (`signs`).
    waited_ns: Option<u64>,
    /// The last sign it wants the GPU (NVML saw it busy), and since when it has wanted it (arrival order).
    active: Option<Instant>,
    since: Option<Instant>,
    /// The last NVML reading that showed it working (or its grant), and whether the last reading showed
    /// it idle.
    worked: Option<Instant>,
    quiet: bool,
    /// NVML: what its processes hold now, and the most they held in its spell of wanting the GPU.
    held: u64,
    peak: u64,
    /// It is owed a turn (in the queue: it wanted the GPU when told to stop, or was handed past still
    /// wanting it); its place came from its own waiting words (`on_words`), and such a turn idle by
    /// NVML made its words unheard until the turns end (`deaf`).
    owed: bool,
    on_words: bool,
    deaf: bool,
    frozen: Option<Why>,
    /// When the freeze began, and whether its work was found running on while frozen (`runs_on`).
    frozen_at: Option<Instant>,
    ran_on: bool,
    /// When it was told to stop using the GPU (yield, or wait from a going mode), or when it drained
    /// after a yield (work in flight until then was allowed): NVML's evidence against it counts from
    /// `settle` after.
    stopped: Option<Instant>,
    /// It held the GPU and was handed past without draining: caught busy, it is revoked.
    undrained: bool,
    /// Time it waited for the turn while wanting it, as this arbiter saw.
    waited: Duration,
}

impl Member {
    /// What it needs on the device by NVML: the most its processes held in this spell of wanting it.
    fn need(&self) -> u64 {
        self.peak.max(self.held)
    }
}

/// The holder and its quantum.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    id: String,
    since: Instant,
    /// Told to yield: when, at which epoch, and whether for idleness (then it goes back only if it wants).
    yielding: Option<(Instant, u64, bool)>,
}

/// One GPU's arbiter.
#[derive(Debug, Clone)]
pub struct Board {
    s: Settings,
    members: BTreeMap<String, Member>,
    holder: Option<Holder>,
    queue: VecDeque<String>,
    contended: bool,
    epoch: u64,
    nvml: Option<GpuNvml>,
    last: Option<Instant>,
    /// Since when memory has not been short (while taking turns).
    fits_since: Option<Instant>,
    pub counts: Counts,
    /// The figures of the last verdict, for its log line.
    pub why: Figures,
}

impl Board {
    pub fn new(s: Settings) -> Board {
        Board {
            s,
            members: BTreeMap::new(),
            holder: None,
            queue: VecDeque::new(),
            contended: false,
            epoch: 0,
            nvml: None,
            last: None,
            fits_since: None,
            counts: Counts::default(),
            why: Figures::default(),
        }
    }

    pub fn contended(&self) -> bool {
        self.contended
    }

    pub fn holder(&self) -> Option<&str> {
        self.holder.as_ref().map(|h| h.id.as_str())
    }

    /// The holder's grant time.
    pub fn held_since(&self) -> Option<Instant> {
        self.holder.as_ref().map(|h| h.since)
    }

    pub fn queue(&self) -> impl Iterator<Item = &str> {
        self.queue.iter().map(String::as_str)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Every member: its id, the mode it was told, whether this arbiter holds it frozen and why, and the
    /// time it waited for the turn.
    pub fn members(&self) -> impl Iterator<Item = (&str, TurnMode, Option<Why>, Duration)> {
        self.members
            .iter()
            .map(|(id, m)| (id.as_str(), m.mode, m.frozen, m.waited))
    }

    /// The containers this arbiter holds frozen.
    pub fn frozen(&self) -> impl Iterator<Item = &str> {
        self.members
            .iter()
            .filter(|(_, m)| m.frozen.is_some())
            .map(|(id, _)| id.as_str())
    }

    /// A freeze the runner could not make (no cgroup, frozen by someone else): not held as frozen.
    pub fn not_frozen(&mut self, id: &str) {
        if let Some(m) = self.members.get_mut(id) {
            m.frozen = None;
        }
    }

    fn next_epoch(&mut self, now_ns: u64) -> u64 {
        self.epoch = (self.epoch + 1).max(now_ns);
        self.epoch
    }

    /// One tick: what to write, freeze and thaw.
    pub fn tick(&mut self, t: &Tick) -> Vec<Action> {
        let mut out = Vec::new();
        let now = t.now;
        let dt = self
            .last
            .replace(now)
            .map_or(Duration::ZERO, |l| now.saturating_duration_since(l));
        if t.nvml.is_some() {
            self.nvml = t.nvml;
        }
        self.forget_gone(t, &mut out);
        self.note_signs(t);
        let wanting: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| self.wants(m, now))
            .map(|(id, _)| id.clone())
            .collect();
        let need = |holder: bool| {
            self.members
                .iter()
                .filter(|(id, _)| wanting.contains(id))
                .filter(|(id, _)| holder || self.holder() != Some(id.as_str()))
                .map(|(_, m)| m.need())
                .fold(0, u64::saturating_add)
        };
        let (all, waiting) = (need(true), need(false));
        let largest = self
            .members
            .iter()
            .filter(|(id, _)| wanting.contains(id))
            .map(|(_, m)| m.need())
            .max()
            .unwrap_or(0);
        let n = self.nvml.unwrap_or(GpuNvml {
            at: now,
            since: None,
            total: 0,
            used: 0,
            others: 0,
        });
        self.why = Figures {
            wanting: wanting.len(),
            need: all,
            waiting,
            used: n.used,
            total: n.total,
            others: n.others,
        };
        let pressed = self.s.force || self.pressure(all, largest);
        // Turns hide the pressure they relieve (only the holder's pages are busy): taking turns ends only
        // once they would have fit for a whole turn (`quantum + grace`), or fewer than two want the GPU.
        let fits_since = match pressed {
            true => None,
            false => Some(*self.fits_since.get_or_insert(now)),
        };
        self.fits_since = fits_since;
        let fit_long = fits_since
            .is_some_and(|f| now.saturating_duration_since(f) >= self.s.quantum + self.s.grace);
        let contended = wanting.len() >= 2 && (pressed || (self.contended && !fit_long));
        if !contended {
            self.free_all(t, &mut out);
            return out;
        }
        self.contended = true;
        self.order_queue(&wanting);
        for id in &self.queue {
            if let Some(m) = self.members.get_mut(id) {
                m.waited += dt;
            }
        }
        self.run_holder(t, &mut out);
        self.run_others(t, &mut out);
        self.runs_on(t, &mut out);
        self.rewrite_forged(t, &mut out);
        out
    }

    /// Members no longer listed (the container ended, or is no longer oversubscribed) are forgotten;
    /// what this arbiter froze of them is thawed (a cgroup that is gone has nothing to thaw).
    fn forget_gone(&mut self, t: &Tick, out: &mut Vec<Action>) {
        let gone: Vec<String> = self
            .members
            .keys()
            .filter(|id| !t.members.iter().any(|s| &s.id == *id))
            .cloned()
            .collect();
        for id in gone {
            if self.members.remove(&id).is_some_and(|m| m.frozen.is_some()) {
                out.push(Action::Thaw { id: id.clone() });
            }
            self.queue.retain(|q| q != &id);
            if self.holder.as_ref().is_some_and(|h| h.id == id) {
                self.holder = None;
            }
        }
    }

    /// Not contended: every member `Free`, the holder and queue dropped, what this arbiter froze thawed.
    fn free_all(&mut self, t: &Tick, out: &mut Vec<Action>) {
        self.contended = false;
        self.fits_since = None;
        self.holder = None;
        self.queue.clear();
        let epoch = self.epoch;
        for (id, m) in &mut self.members {
            (m.stopped, m.undrained) = (None, false);
            (m.owed, m.on_words, m.deaf) = (false, false, false);
            if m.frozen.take().is_some() {
                out.push(Action::Thaw { id: id.clone() });
            }
            let read = t.members.iter().find(|s| &s.id == id).and_then(|s| s.turn);
            let forged = read.is_some_and(|r| r.mode != TurnMode::Free);
            if m.mode != TurnMode::Free || forged {
                m.mode = TurnMode::Free;
                m.epoch = epoch;
                m.told = t.now;
                out.push(Action::Write {
                    id: id.clone(),
                    mode: TurnMode::Free,
                    epoch,
                });
            }
        }
    }

    /// The queue: those that want the GPU and do not hold it, in the order they began wanting it.
    fn order_queue(&mut self, wanting: &[String]) {
        let holder = self.holder.as_ref().map(|h| h.id.clone());
        self.queue.retain(|id| wanting.contains(id));
        let mut new: Vec<(Instant, String)> = wanting
            .iter()
            .filter(|id| Some(*id) != holder.as_ref() && !self.queue.contains(id))
            .filter_map(|id| Some((self.members.get(id)?.since?, id.clone())))
            .collect();
        new.sort();
        for (_, id) in new {
            if let Some(m) = self.members.get_mut(&id) {
                m.owed = true;
            }
            self.queue.push_back(id);
        }
    }

    fn tell(&mut self, id: &str, mode: TurnMode, epoch: u64, now: Instant, out: &mut Vec<Action>) {
        if let Some(m) = self.members.get_mut(id) {
            m.mode = mode;
            m.epoch = epoch;
            m.told = now;
        }
        out.push(Action::Write {
            id: id.to_string(),
            mode,
            epoch,
        });
    }

    fn freeze(&mut self, id: &str, why: Why, now: Instant, out: &mut Vec<Action>) {
        if let Some(m) = self.members.get_mut(id) {
            if m.frozen.is_none() {
                m.frozen = Some(why);
                (m.frozen_at, m.ran_on) = (Some(now), false);
                out.push(Action::Freeze {
                    id: id.to_string(),
                    why,
                });
            }
        }
    }

    /// Gives the GPU to the queue's first, thawing it if this arbiter froze it.
    fn grant_next(&mut self, t: &Tick, out: &mut Vec<Action>) {
        let Some(id) = self.queue.pop_front() else {
            return;
        };
        let epoch = self.next_epoch(t.now_ns);
        if let Some(m) = self.members.get_mut(&id) {
            if m.frozen.take().is_some() {
                out.push(Action::Thaw { id: id.clone() });
            }
            // Granted, it wants the GPU for `linger` on the arbiter's word (it was gated: NVML could not
            // see it want it); then by NVML alone.
            (m.worked, m.active) = (Some(t.now), Some(t.now));
            (m.stopped, m.undrained, m.owed) = (None, false, false);
        }
        self.tell(&id, TurnMode::Hold, epoch, t.now, out);
        self.counts.grants += 1;
        self.holder = Some(Holder {
            id,
            since: t.now,
            yielding: None,
        });
    }

    /// The holder's quantum: hold, yield when it is over (or idle) and someone waits, hand on when
    /// drained or after the grace (then watched: busy after its yield, it is revoked).
    fn run_holder(&mut self, t: &Tick, out: &mut Vec<Action>) {
        let now = t.now;
        let Some(h) = self.holder.clone() else {
            self.grant_next(t, out);
            return;
        };
        let Some(m) = self.members.get(&h.id).cloned() else {
            self.holder = None;
            self.grant_next(t, out);
            return;
        };
        match h.yielding {
            None => {
                if self.queue.is_empty() {
                    return;
                }
                let over = now.saturating_duration_since(h.since) >= self.s.quantum;
                let idle = self.holder_idle(&m, h.since, now);
                if over || idle {
                    let epoch = self.next_epoch(t.now_ns);
                    self.tell(&h.id, TurnMode::Yield, epoch, now, out);
                    if let Some(m) = self.members.get_mut(&h.id) {
                        m.stopped = Some(now);
                    }
                    if let Some(h) = &mut self.holder {
                        h.yielding = Some((now, epoch, idle && !over));
                    }
                }
            }
            Some((at, epoch, for_idle)) => {
                let seen = t.members.iter().find(|s| s.id == h.id);
                let drained = seen
                    .and_then(|s| s.turn)
                    .is_some_and(|r| r.drained == epoch)
                    || self.idle_after(seen, at);
                let late = now.saturating_duration_since(at) >= self.s.grace;
                if !drained && !late {
                    return;
                }
                let e = self.epoch;
                self.tell(&h.id, TurnMode::Wait, e, now, out);
                if let Some(m) = self.members.get_mut(&h.id) {
                    m.undrained = !drained;
                    // Drained: what it ran until now was its own turn's work still in flight (a long
                    // kernel drains only at the next launch), so NVML's evidence counts from here.
                    if drained {
                        m.stopped = Some(now);
                    }
                }
                self.holder = None;
                self.deafen_if_idle_on_words(&h.id, h.since);
                let back = !drained || !for_idle || self.wants(&m, now);
                if back && !self.queue.contains(&h.id) {
                    self.queue.push_back(h.id.clone());
                    if let Some(m) = self.members.get_mut(&h.id) {
                        m.since.get_or_insert(now);
                        m.owed = true;
                    }
                }
                self.grant_next(t, out);
            }
        }
    }

    /// NVML's reading covers only time from `at` + settle on and shows the member idle.
    fn idle_after(&self, seen: Option<&Seen>, at: Instant) -> bool {
        seen.is_some_and(|s| s.busy == Some(false)) && self.covers(at)
    }

    /// NVML's last reading covers only time from `at` + settle on.
    fn covers(&self, at: Instant) -> bool {
        self.nvml
            .and_then(|n| n.since)
            .is_some_and(|s| s >= at + self.s.settle)
    }

    /// Everyone but the holder: told to yield if it was running, to wait once drained (or after the
    /// grace); the wall.
    fn run_others(&mut self, t: &Tick, out: &mut Vec<Action>) {
        let now = t.now;
        let holder = self.holder.as_ref().map(|h| h.id.clone());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            if Some(&id) == holder.as_ref() {
                continue;
            }
            let Some(m) = self.members.get(&id).cloned() else {
                continue;
            };
            let seen = t.members.iter().find(|s| s.id == id);
            match m.mode {
                TurnMode::Unmanaged | TurnMode::Free | TurnMode::Hold => {
                    let epoch = self.next_epoch(t.now_ns);
                    self.tell(&id, TurnMode::Yield, epoch, now, out);
                    if let Some(m) = self.members.get_mut(&id) {
                        m.stopped = Some(now);
                    }
                }
                TurnMode::Yield => {
                    let drained = seen
                        .and_then(|s| s.turn)
                        .is_some_and(|r| r.drained == m.epoch)
                        || self.idle_after(seen, m.told);
                    if drained || now.saturating_duration_since(m.told) >= self.s.grace {
                        let e = self.epoch;
                        self.tell(&id, TurnMode::Wait, e, now, out);
                        if drained {
                            // its work in flight until the drain was not out of turn
                            if let Some(m) = self.members.get_mut(&id) {
                                m.stopped = Some(now);
                            }
                        }
                    }
                }
                TurnMode::Wait => self.wall(t, &id, &m, seen, out),
            }
        }
    }

    /// A container told to stop whose processes NVML shows busy in a reading that covers only time from
    /// `settle` after it was told: frozen until its turn (revoked when it was the holder that did not
    /// drain, else out of turn).
    fn wall(&mut self, t: &Tick, id: &str, m: &Member, seen: Option<&Seen>, out: &mut Vec<Action>) {
        let busy = seen.and_then(|s| s.busy) == Some(true);
        let from = m.stopped.unwrap_or(m.told);
        if !busy || m.frozen.is_some() || !self.covers(from) {
            return;
        }
        let why = if m.undrained {
            self.counts.revocations += 1;
            Why::Revoked
        } else {
            self.counts.out_of_turn += 1;
            Why::OutOfTurn
        };
        self.freeze(id, why, t.now, out);
        if !self.queue.contains(&id.to_string()) {
            self.queue.push_back(id.to_string());
        }
        if let Some(m) = self.members.get_mut(id) {
            m.owed = true;
        }
    }

    /// A member whose turn words say other than it was told (its own store, or a file replaced) is told
    /// again: the words are hints, but the library must read what the arbiter decided.
    fn rewrite_forged(&mut self, t: &Tick, out: &mut Vec<Action>) {
        for s in t.members {
            let Some(r) = s.turn else { continue };
            let Some(m) = self.members.get(&s.id) else {
                continue;
            };
            let written = out
                .iter()
                .any(|a| matches!(a, Action::Write { id, .. } if id == &s.id));
            if !written && (r.mode != m.mode || r.epoch != m.epoch) {
                out.push(Action::Write {
                    id: s.id.clone(),
                    mode: m.mode,
                    epoch: m.epoch,
                });
            }
        }
    }
}

pub mod runs_on;
pub mod signs;

#[cfg(test)]
mod tests;
