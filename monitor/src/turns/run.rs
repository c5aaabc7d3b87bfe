//! The arbiter at work: a thread of the monitor that ticks (`[monitor.turns] tick_ms`, 50 ms by default).
//! Each tick it takes the GPUs' oversubscribe containers from the collector's last reading (their
//! limits, cgroups, and at each new collection NVML's figures: which of their processes used the GPU and
//! what they hold, as the watchdog attributed them), reads each one's ledger (`hostfile::read_ledger`: the turn
//! words alone, tenant-writable, so hints; its charge is never read), hands all that to the GPU's `decide::Board`, writes the turns it
//! decides into the ledgers (`vgpu_host::turn_write`, one `pwrite` each, opened as
//! `hostfile::open_regular_for_update` opens: no link followed, one link, the ledger's size) and the
//! heartbeat into every other, freezes and thaws cgroups (`freezer`) and rewrites each GPU's status
//! file when it changed (`record`). A clean stop writes `Unmanaged` into every ledger it manages and
//! thaws what it froze; a start thaws what a previous run recorded as frozen by it. Switched off, it
//! only writes `Unmanaged` where a previous run left another word. Not here: the decisions (`decide`).

use super::decide::{self, Action, Board, GpuNvml, Seen, Tick, Why};
use super::input::{busy, held, members, others};
use super::record::{self, GpuTurns, MemberTurn};
use super::view::TurnsView;
use crate::config::Turns;
use crate::freezer;
use crate::frozen::Frozen;
use crate::share_run::Victim;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vgpu_host::attribution::Truth;
use vgpu_host::nvml::GpuReading;
use vgpu_host::state_root::StateRoot;
use vgpu_host::turn_write;
use vgpu_host::usage::ContainerState;
use vgpu_ledger::region::{TurnMode, FILE_SIZE};

/// NVML's sample tail: its utilisation of a process counts against it from this long after it was told
/// to stop.
pub const SETTLE: Duration = Duration::from_secs(1);

/// One collection, as the arbiter reads it (the collector's last).
#[derive(Clone, Copy)]
pub struct Collection<'a> {
    pub containers: &'a [ContainerState],
    pub gpus: Option<&'a [GpuReading]>,
    pub truth: &'a Truth,
    /// When it was finished.
    pub at: Instant,
}

/// The arbiter of every GPU of the node.
pub struct Arbiter {
    turns: Turns,
    /// The monitor's kill policy: kill what runs on while frozen (`ran_on`).
    kill: bool,
    settings: decide::Settings,
    root: StateRoot,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    boards: BTreeMap<String, Board>,
    /// The ledgers of each GPU's members, by container id.
    ledgers: BTreeMap<String, BTreeMap<String, PathBuf>>,
    /// Cgroups this arbiter froze: container id → (directory, the GPUs whose boards hold it frozen).
    frozen: BTreeMap<String, (PathBuf, BTreeSet<String>)>,
    /// The last collection taken in, and the one before.
    last_at: Option<Instant>,
    prev_at: Option<Instant>,
    /// Each GPU's status as last written, and its holder's grant (holder, grants counted then, Unix ms).
    written: BTreeMap<String, GpuTurns>,
    granted: BTreeMap<String, (String, u64, u64)>,
    /// Ledgers a write failed on (logged once until one works again).
    failing: BTreeSet<PathBuf>,
    failures: u64,
    stopped: bool,
    /// Under the kill policy: the processes to kill that this tick found (`ran_on`).
    victims: Vec<Victim>,
}

fn log(msg: &str) {
    crate::stderr::log(&format!("turns: {msg}"));
}

fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Arbiter {
    /// An arbiter of the containers under `root`; `interval` is the collector's (how often NVML's
    /// figures come: a sign of wanting the GPU counts for two of them and the idle spell).
    pub fn new(turns: Turns, root: StateRoot, interval: Duration) -> Arbiter {
        Arbiter {
            settings: decide::Settings {
                quantum: turns.quantum,
                idle: turns.idle,
                grace: turns.grace,
                linger: interval * 2 + turns.idle,
                settle: SETTLE,
                force: turns.force,
            },
            turns,
            kill: false,
            root,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// This arbiter under the monitor's kill policy (`kill`: what runs on while frozen is killed).
    pub fn with_kill(mut self, kill: bool) -> Arbiter {
        self.kill = kill;
        self
    }

    pub fn turns(&self) -> Turns {
        self.turns
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// At the start: thaws what a previous run recorded as frozen by it (it stopped without thawing).
    pub fn thaw_left_frozen(&self) {
        record::frozen_record(&self.root).thaw_left();
    }

    /// One tick over the collector's last reading (none yet: nothing to do). Returns, under the kill
    /// policy, the processes to kill (their work runs on while their container is frozen: `ran_on`).
    pub fn tick(&self, c: Option<Collection>) -> Vec<Victim> {
        let mut w = self.lock();
        self.tick_locked(&mut w, c);
        std::mem::take(&mut w.victims)
    }

    fn tick_locked(&self, w: &mut Inner, c: Option<Collection>) {
        let Some(c) = c.filter(|_| !w.stopped) else {
            return;
        };
        let fresh = w.last_at != Some(c.at);
        if fresh {
            w.prev_at = w.last_at.replace(c.at);
        }
        let members = members(c.containers);
        if !self.turns.enabled {
            if fresh {
                self.unmanage_left(w, c, &members);
            }
            return;
        }
        let (now, now_ns) = (Instant::now(), monotonic_ns());
        let gone: Vec<String> = w
            .boards
            .keys()
            .filter(|u| !members.contains_key(*u))
            .cloned()
            .collect();
        for uuid in gone {
            // No oversubscribe container left there: what the board froze is thawed, its counters kept
            // (they are the GPU's, and Prometheus counters do not go back).
            let actions = w.boards.get_mut(&uuid).map_or(vec![], |b| {
                b.tick(&Tick {
                    now,
                    now_ns,
                    members: &[],
                    nvml: None,
                })
            });
            for a in actions {
                if let Action::Thaw { id } = a {
                    self.thaw(w, &uuid, &id);
                }
            }
            w.ledgers.remove(&uuid);
            if w.written.remove(&uuid).is_some() {
                record::remove_gpu(&self.root, &uuid);
            }
        }
        for (uuid, list) in &members {
            self.tick_gpu(w, c, uuid, list, fresh, now, now_ns);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn tick_gpu(
        &self,
        w: &mut Inner,
        c: Collection,
        uuid: &str,
        list: &[(usize, usize)],
        fresh: bool,
        now: Instant,
        now_ns: u64,
    ) {
        let reading = c.gpus.and_then(|g| g.iter().find(|r| r.uuid == uuid));
        let nvml = reading.filter(|_| fresh).map(|r| GpuNvml {
            at: c.at,
            since: w.prev_at,
            total: r.total,
            used: r.used,
            others: others(r, list, c.truth),
        });
        let mut ledgers = BTreeMap::new();
        let seen: Vec<Seen> = list
            .iter()
            .map(|&(ci, gi)| {
                let cs = &c.containers[ci];
                let path = self.root.ledger_path(&cs.id, uuid).ok();
                let snap = path
                    .as_deref()
                    .and_then(|p| vgpu_host::hostfile::read_ledger(p).ok());
                if let Some(p) = path {
                    ledgers.insert(cs.id.clone(), p);
                }
                Seen {
                    id: cs.id.clone(),
                    turn: snap.map(|s| s.turn),
                    held: reading
                        .filter(|_| fresh && c.truth.knows(uuid))
                        .and_then(|r| held(r, c.truth, ci, gi)),
                    busy: reading
                        .filter(|_| fresh && c.truth.knows(uuid))
                        .and_then(|r| busy(r, c.truth, ci, gi)),
                }
            })
            .collect();
        w.ledgers.insert(uuid.to_string(), ledgers);
        let board = w
            .boards
            .entry(uuid.to_string())
            .or_insert_with(|| Board::new(self.settings));
        let was = (board.contended(), board.counts);
        let actions = board.tick(&Tick {
            now,
            now_ns,
            members: &seen,
            nvml,
        });
        let is = board.contended();
        if was.0 != is {
            let f = board.why;
            let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
            log(&format!(
                "GPU {uuid}: {} ({} want it; their processes need {} by NVML, {} of it those not holding it; the device: {} used of {}, {} by other processes)",
                if is {
                    "contended: taking turns"
                } else {
                    "no longer contended: every oversubscribed container runs freely"
                },
                f.wanting,
                gib(f.need),
                gib(f.waiting),
                gib(f.used),
                gib(f.total),
                gib(f.others),
            ));
        }
        let mut wrote = BTreeSet::new();
        for a in actions {
            match a {
                Action::Write { id, mode, epoch } => {
                    self.write(w, uuid, &id, mode, epoch, now_ns);
                    wrote.insert(id);
                }
                Action::Freeze { id, why } => {
                    let cs = c.containers.iter().find(|cs| cs.id == id);
                    self.freeze(w, uuid, &id, why, cs);
                }
                Action::Thaw { id } => self.thaw(w, uuid, &id),
                Action::BusyWhileFrozen { id, after, begins } => {
                    self.ran_on(w, c, uuid, list, &id, after, begins)
                }
            }
        }
        for s in seen.iter().filter(|s| !wrote.contains(&s.id)) {
            self.beat(w, uuid, &s.id, now_ns);
        }
        self.note_status(w, uuid);
    }

    fn ledger(&self, w: &Inner, uuid: &str, id: &str) -> Option<PathBuf> {
        w.ledgers.get(uuid)?.get(id).cloned()
    }

    /// Writes a turn (or, `mode` None, the heartbeat alone) into a member's ledger; a failure is logged
    /// once until a write there works again.
    fn put(&self, w: &mut Inner, path: PathBuf, turn: Option<(TurnMode, u64)>, now_ns: u64) {
        let r =
            vgpu_host::hostfile::open_regular_for_update(&path, FILE_SIZE as u64).and_then(|f| {
                match turn {
                    Some((mode, epoch)) => turn_write::write_turn(&f, mode, epoch, now_ns),
                    None => turn_write::write_heartbeat(&f, now_ns),
                }
            });
        match r {
            Ok(()) => {
                w.failing.remove(&path);
            }
            // The container ended, or has not made its ledger yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                if w.failing.insert(path.clone()) {
                    w.failures += 1;
                    log(&format!(
                        "cannot write the turn into {}: {e}",
                        path.display()
                    ));
                }
            }
        }
    }

    fn write(&self, w: &mut Inner, uuid: &str, id: &str, mode: TurnMode, epoch: u64, ns: u64) {
        if let Some(p) = self.ledger(w, uuid, id) {
            self.put(w, p, Some((mode, epoch)), ns);
        }
    }

    fn beat(&self, w: &mut Inner, uuid: &str, id: &str, ns: u64) {
        if let Some(p) = self.ledger(w, uuid, id) {
            self.put(w, p, None, ns);
        }
    }

    /// Freezes a member's cgroup for a board; one that cannot be frozen is given back to the board.
    fn freeze(&self, w: &mut Inner, uuid: &str, id: &str, why: Why, cs: Option<&ContainerState>) {
        let what = match why {
            Why::Revoked => "revoked: it held the GPU, did not drain within the grace after it was told to yield, and NVML shows it still using the GPU",
            Why::OutOfTurn => "used the GPU out of turn: NVML shows its processes busy while it was told to wait",
        };
        if let Some(f) = w.frozen.get_mut(id) {
            f.1.insert(uuid.to_string());
            log(&format!(
                "GPU {uuid}: container {id} {what}; frozen already"
            ));
            return;
        }
        let dir = cs
            .ok_or_else(|| "it is gone".to_string())
            .and_then(vgpu_host::cgroup::of_container);
        let r = dir.and_then(freezer::freeze_for_wall);
        match r {
            Ok(Some(d)) => {
                log(&format!(
                    "GPU {uuid}: container {id} {what}; froze {} until its turn",
                    d.display()
                ));
                w.frozen
                    .insert(id.to_string(), (d, [uuid.to_string()].into()));
                self.save_frozen(w);
            }
            Ok(None) => self.not_frozen(w, uuid, id),
            Err(e) => {
                w.failures += 1;
                log(&format!("GPU {uuid}: container {id} {what}; {e}"));
                self.not_frozen(w, uuid, id);
            }
        }
    }

    fn not_frozen(&self, w: &mut Inner, uuid: &str, id: &str) {
        if let Some(b) = w.boards.get_mut(uuid) {
            b.not_frozen(id);
        }
    }

    /// A board lets a member go; its cgroup is thawed when no board holds it frozen.
    fn thaw(&self, w: &mut Inner, uuid: &str, id: &str) {
        let Some(f) = w.frozen.get_mut(id) else {
            return;
        };
        f.1.remove(uuid);
        if !f.1.is_empty() {
            return;
        }
        let Some((dir, _)) = w.frozen.remove(id) else {
            return;
        };
        if let Err(e) = freezer::set_frozen(&dir, false) {
            if dir.exists() {
                w.failures += 1;
                log(&format!("cannot thaw {}: {e}", dir.display()));
            }
        }
        self.save_frozen(w);
    }

    fn save_frozen(&self, w: &Inner) {
        let list: Vec<Frozen> = w
            .frozen
            .iter()
            .map(|(id, (d, _))| Frozen {
                container: id.clone(),
                cgroup: d.clone(),
            })
            .collect();
        record::frozen_record(&self.root).save(&list);
    }

    /// Rewrites the GPU's status file when it changed.
    fn note_status(&self, w: &mut Inner, uuid: &str) {
        let Some(b) = w.boards.get(uuid) else { return };
        let holder = b.holder().map(str::to_string);
        let grants = b.counts.grants;
        let since = holder.as_ref().map(|h| match w.granted.get(uuid) {
            Some((g, n, at)) if g == h && *n == grants => *at,
            _ => {
                let at = unix_ms();
                w.granted.insert(uuid.to_string(), (h.clone(), grants, at));
                at
            }
        });
        let g = GpuTurns {
            uuid: uuid.to_string(),
            contended: b.contended(),
            holder,
            held_since_unix_ms: since,
            queue: b.queue().map(str::to_string).collect(),
            epoch: b.epoch(),
            grants: b.counts.grants,
            revocations: b.counts.revocations,
            out_of_turn: b.counts.out_of_turn,
            busy_while_frozen: b.counts.busy_while_frozen,
            members: b
                .members()
                .map(|(id, mode, frozen, waited)| MemberTurn {
                    id: id.to_string(),
                    mode: record::mode_name(mode).into(),
                    frozen: frozen.map(|f| match f {
                        Why::Revoked => "revoked".into(),
                        Why::OutOfTurn => "out_of_turn".into(),
                    }),
                    waited_seconds: waited.as_secs(),
                })
                .collect(),
        };
        if w.written.get(uuid) == Some(&g) {
            return;
        }
        match record::write_gpu(&self.root, &g) {
            Ok(()) => {
                w.written.insert(uuid.to_string(), g);
            }
            Err(e) => {
                if w.written.remove(uuid).is_some() || w.failures == 0 {
                    log(&format!("cannot write the status of GPU {uuid}: {e}"));
                }
                w.failures += 1;
            }
        }
    }

    /// Switched off: `Unmanaged` where a previous run left another word (its containers would wait for
    /// the library's stale bound at each launch).
    fn unmanage_left(
        &self,
        w: &mut Inner,
        c: Collection,
        members: &BTreeMap<String, Vec<(usize, usize)>>,
    ) {
        for (uuid, list) in members {
            for &(ci, _) in list {
                let Ok(p) = self.root.ledger_path(&c.containers[ci].id, uuid) else {
                    continue;
                };
                let left = vgpu_host::hostfile::read_ledger(&p)
                    .is_ok_and(|s| s.turn.mode != TurnMode::Unmanaged);
                if left {
                    self.put(w, p, Some((TurnMode::Unmanaged, 0)), monotonic_ns());
                }
            }
        }
    }

    /// The monitor stops: `Unmanaged` into every managed ledger, everything it froze thawed, its status
    /// files removed. No tick runs after.
    pub fn stop(&self) {
        let mut w = self.lock();
        w.stopped = true;
        let ns = monotonic_ns();
        let all: Vec<(String, PathBuf)> = w
            .ledgers
            .iter()
            .flat_map(|(u, l)| l.values().map(|p| (u.clone(), p.clone())))
            .collect();
        for (_, p) in all {
            self.put(&mut w, p, Some((TurnMode::Unmanaged, 0)), ns);
        }
        let frozen: Vec<(String, BTreeSet<String>)> = w
            .frozen
            .iter()
            .map(|(id, (_, g))| (id.clone(), g.clone()))
            .collect();
        for (id, gpus) in frozen {
            for uuid in gpus {
                self.thaw(&mut w, &uuid, &id);
            }
        }
        let uuids: Vec<String> = w.boards.keys().cloned().collect();
        for u in uuids {
            record::remove_gpu(&self.root, &u);
        }
    }

    /// The scrape's view; `index` finds a container GPU (container id, GPU UUID) in the scrape's reading.
    pub fn view(&self, index: impl Fn(&str, &str) -> Option<(usize, usize)>) -> TurnsView {
        let w = self.lock();
        let mut v = TurnsView {
            on: self.turns.enabled,
            failures: w.failures,
            ..Default::default()
        };
        for (uuid, b) in &w.boards {
            v.gpus.push((
                uuid.clone(),
                b.contended(),
                b.queue().count(),
                b.counts.grants,
                b.counts.revocations,
                b.counts.out_of_turn,
                b.counts.busy_while_frozen,
            ));
            for (id, _, frozen, waited) in b.members() {
                if let Some((c, g)) = index(id, uuid) {
                    v.members.push((
                        c,
                        g,
                        b.holder() == Some(id),
                        waited.as_secs_f64(),
                        frozen.is_some(),
                    ));
                }
            }
        }
        v
    }
}

mod ran_on;
#[cfg(test)]
mod tests;
