//! One GPU's quota in this process: the container's ledger, this process's slot in it (attached on the
//! first charge), and the limit, followed live when the host updates the limits file (`live`). Charging,
//! refunding, the measurement lock and the fork gate live here; which quota governs which device does not
//! (`devices`).

use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_ledger::{DeviceLimit, Kind, Ledger, MeasureLock, MemoryMode, Slot};

use crate::config::LedgerMode;
use crate::error::Error;
use crate::guard::exiting;
use crate::log;
use crate::userfiles::{private_dir, trusted};

/// How long a context creation waits for another process's measurement before measuring without it.
const MEASURE_WAIT: Duration = Duration::from_secs(3);
/// After a failed slot attach (slot table full, EMFILE), the next try waits this long.
const ATTACH_BACKOFF: Duration = Duration::from_millis(100);
/// A limits generation odd this long is no host writing (that takes milliseconds): an update that died
/// half way, or a tenant keeping the word odd to put its processes off reading a shrink. The file is
/// then read without the bracket (`live::entry_unbracketed`).
pub(crate) const ODD_BOUND: Duration = Duration::from_secs(1);

pub struct DeviceQuota {
    pub ordinal: i32,
    pub uuid: String,
    /// Bytes; changed when the host updates the limits file (`limit()` follows it).
    limit: AtomicU64,
    /// The limits file whose updates this quota follows (a limits file configuration; never in the
    /// environment mode, which no host updates).
    follows: OnceLock<PathBuf>,
    /// The ledger's limits generation last applied (`vgpu_ledger::live`); 0: the file as first loaded.
    applied: AtomicU64,
    /// `millis()` + 1 when the generation was first seen odd since the last applied (0: not seen odd).
    odd_since: AtomicU64,
    /// The limits file itself, looked at once a second whatever the generation says (`live::FileWatch`).
    watch: crate::live::FileWatch,
    /// Plain, spill or oversubscribe (`hooks::memory`); plain until the configuration says otherwise.
    pub memory: MemoryMode,
    ledger_path: PathBuf,
    ledger: Ledger,
    /// This process's slot: null until the first charge (a leaked Box once attached).
    slot: AtomicPtr<Slot>,
    /// Milliseconds since `epoch()` before which no new attach is tried (after a failure).
    attach_after: AtomicU64,
}

impl DeviceQuota {
    /// Opens (or creates) the ledger at `path` and attaches a slot at once (unit tests).
    #[cfg(test)]
    pub fn open(ordinal: i32, uuid: &str, limit: u64, path: &Path) -> Result<DeviceQuota, Error> {
        let q = Self::open_unattached(ordinal, uuid, limit, path, LedgerMode::File)?;
        q.slot()?;
        Ok(q)
    }

    /// Opens (or creates) the ledger without taking a slot: enough to show the quota and to know it can
    /// be enforced; the slot is attached on the first charge. A container's ledger (`Provisioned`) is
    /// only opened: it must be there, a regular file (see `provisioned`). In the environment mode the per-user folder
    /// is made first (see `private_dir`), a ledger is created for this user alone, and one that is a
    /// symbolic link, belongs to another user than this one or root, or that other users can write is not
    /// used (see `trusted`).
    pub fn open_unattached(
        ordinal: i32,
        uuid: &str,
        limit: u64,
        path: &Path,
        mode: LedgerMode<'_>,
    ) -> Result<DeviceQuota, Error> {
        let fail = |e: String| Error::Ledger(format!("ledger {}: {e}", path.display()));
        if mode == LedgerMode::Provisioned {
            provisioned(path).map_err(fail)?;
        }
        let env_mode = matches!(mode, LedgerMode::Env { .. });
        if let LedgerMode::Env { dir: Some(dir) } = mode {
            private_dir(dir)
                .map_err(|e| Error::Ledger(format!("ledger folder {}: {e}", dir.display())))?;
        }
        if env_mode {
            trusted(path, true).map_err(fail)?;
        }
        let ledger = match mode {
            LedgerMode::Provisioned => Ledger::open(path),
            LedgerMode::Env { .. } => Ledger::open_or_create_with_mode(path, uuid, limit, 0o600),
            LedgerMode::File => Ledger::open_or_create(path, uuid, limit),
        }
        .map_err(|e| Error::Ledger(e.to_string()))?;
        if env_mode {
            // Checked again now that it exists: in a sticky folder such as /tmp, a file that is ours or
            // root's cannot be replaced by another user any more.
            trusted(path, false).map_err(fail)?;
        }
        // Usage left by processes killed earlier goes back to the quota now.
        let _ = ledger.reclaim_dead();
        Ok(DeviceQuota {
            ordinal,
            uuid: uuid.to_string(),
            limit: AtomicU64::new(limit),
            follows: OnceLock::new(),
            applied: AtomicU64::new(0),
            odd_since: AtomicU64::new(0),
            watch: crate::live::FileWatch::off(),
            memory: MemoryMode::Plain,
            ledger_path: path.to_path_buf(),
            ledger,
            slot: AtomicPtr::new(ptr::null_mut()),
            attach_after: AtomicU64::new(0),
        })
    }

    /// Follows the host's updates of the limits file at `file` (`vgpu_ledger::live`).
    pub fn follow(&self, file: &Path) {
        if self.follows.set(file.to_path_buf()).is_ok() {
            self.watch.start(file);
        }
    }

    /// The limit now: the one last applied, after applying an update the host made since (one load of the
    /// ledger's generation when it made none).
    #[inline]
    pub fn limit(&self) -> u64 {
        if let Some(d) = self.updated_entry() {
            if let Some(new) = d.settings.memory_limit {
                let old = self.limit.swap(new, Ordering::Relaxed);
                if old != new {
                    log::info(format_args!(
                        "device {} ({}): quota updated by the host, {old} -> {new} bytes",
                        self.ordinal, self.uuid
                    ));
                }
            }
        }
        self.limit.load(Relaxed)
    }

    /// The limits file's entry for this ledger when the host updated it since this quota last looked:
    /// Some once per update (per thread that races to it), None otherwise, at the cost of one load and
    /// a coarse clock read. The generation word says at once; the file itself is looked at once a second
    /// all the same (`live::FileWatch`), since the word is the tenant's to write.
    #[inline]
    pub fn updated_entry(&self) -> Option<DeviceLimit> {
        let g = self.ledger.limits_generation();
        if g != self.applied.load(Relaxed) {
            if let Some(d) = self.updated_entry_slow(g) {
                return Some(d);
            }
        }
        if self.watch.due() {
            return self.file_changed(g);
        }
        None
    }

    /// The watch found the file changed while the generation word did not move (a tenant that wrote
    /// back what it applied, or an update whose word is not there yet): applied from the file.
    #[cold]
    fn file_changed(&self, g: u64) -> Option<DeviceLimit> {
        let file = self.follows.get()?;
        let d = self.watch.changed(file, &self.ledger_path)?;
        self.applied.store(g, Relaxed);
        self.odd_since.store(0, Relaxed);
        log::debug(format_args!(
            "device {} ({}): the limits file changed (generation {g} unchanged): read it",
            self.ordinal, self.uuid
        ));
        Some(d)
    }

    #[cold]
    fn updated_entry_slow(&self, g: u64) -> Option<DeviceLimit> {
        let Some(file) = self.follows.get() else {
            // Nothing to follow (the environment mode): stop looking until the word moves again.
            self.applied.store(g, Relaxed);
            return None;
        };
        if g % 2 == 1 {
            return self.odd_entry(file, g);
        }
        self.odd_since.store(0, Relaxed);
        let (read_at, d) = crate::live::entry(file, &self.ledger, &self.ledger_path)?;
        self.applied.store(read_at, Relaxed);
        self.watch.applied(file);
        Some(d)
    }

    /// The generation is odd (`g`): nothing until it has been for `ODD_BOUND`, then the file as it is.
    fn odd_entry(&self, file: &Path, g: u64) -> Option<DeviceLimit> {
        let now = millis() + 1;
        let since = self.odd_since.load(Relaxed);
        if since == 0 {
            self.odd_since.store(now, Relaxed);
            return None;
        }
        if now - since.min(now) < ODD_BOUND.as_millis() as u64 {
            return None;
        }
        let d = crate::live::entry_unbracketed(file, &self.ledger_path)?;
        self.odd_since.store(0, Relaxed);
        self.applied.store(g, Relaxed);
        self.watch.applied(file);
        log::debug(format_args!(
            "device {} ({}): limits generation odd for {} ms or more: read the limits file without it",
            self.ordinal,
            self.uuid,
            ODD_BOUND.as_millis()
        ));
        Some(d)
    }

    /// This process's slot, attached on first use (under the fork gate, so a fork never copies a slot
    /// half taken). A failure is retried on a later call, at most every ATTACH_BACKOFF.
    fn slot(&self) -> Result<&Slot, Error> {
        let p = self.slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a published slot is a leaked Box, never freed (at exit and in a fork child its
            // contents are dropped in place, the memory stays).
            return Ok(unsafe { &*p });
        }
        if exiting() {
            return Err(Error::Refused);
        }
        if millis() < self.attach_after.load(Ordering::Relaxed) {
            return Err(Error::Unenforceable);
        }
        let _gate = gate_enter();
        let fresh = match self.ledger.attach() {
            Ok(s) => Box::into_raw(Box::new(s)),
            Err(e) => {
                self.attach_after.store(
                    millis() + ATTACH_BACKOFF.as_millis() as u64,
                    Ordering::Relaxed,
                );
                log::error(format_args!(
                    "device {} ({}): cannot take a slot in {}: {e}; retried on the next allocation",
                    self.ordinal,
                    self.uuid,
                    self.ledger_path.display()
                ));
                return Err(Error::Ledger(e.to_string()));
            }
        };
        match self.slot.compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; never freed (see above).
            Ok(_) => Ok(unsafe { &*fresh }),
            Err(won) => {
                // SAFETY: `fresh` was never published: ours alone to free (its drop releases the slot).
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as for any published slot.
                Ok(unsafe { &*won })
            }
        }
    }

    /// The container's ledger (the compute share keeps its bucket there).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn ledger_path(&self) -> &Path {
        &self.ledger_path
    }

    /// Whether this process holds a slot in the ledger.
    #[cfg(test)]
    pub fn attached(&self) -> bool {
        !self.slot.load(Ordering::Acquire).is_null()
    }

    /// fork child: the slot is the parent's. Close our copy of its descriptor without refunding; the next
    /// charge attaches a slot of the child's own. Only the child's one thread runs.
    pub(crate) fn forget_slot_after_fork(&self) {
        let p = self.slot.swap(ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: swapped out, so its contents are moved out exactly once; the memory stays (leaked).
            unsafe { ptr::read(p) }.forget_after_fork();
        }
    }

    /// exit: release the slot, refunding what this process still holds. The memory of the slot stays
    /// allocated: a thread still inside a call reads valid memory.
    pub(crate) fn release_slot(&self) {
        let p = self.slot.swap(ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: swapped out, so its contents are dropped exactly once; the memory is never freed.
            drop(unsafe { ptr::read(p) });
        }
    }

    /// Charges before the driver call; false = the quota would be exceeded.
    pub fn charge(&self, kind: Kind, bytes: u64) -> bool {
        match self.try_charge(kind, bytes) {
            Some(true) => true,
            None => false,
            // Spill mode serves refused plain and pitch memory from the spill budget (which logs its own
            // refusal).
            Some(false) if kind == Kind::Data && self.memory.spill_limit().is_some() => false,
            Some(false) => {
                self.ledger.count_refusal();
                log::warn(format_args!(
                    "quota: refused {bytes} bytes ({kind:?}) on device {} ({}): {} of {} bytes in use",
                    self.ordinal,
                    self.uuid,
                    self.ledger.used(),
                    self.limit()
                ));
                false
            }
        }
    }

    /// `charge` without the refusal's log line (spill mode goes on to the spill budget): Some(false) =
    /// over the quota, None = no slot.
    pub fn try_charge(&self, kind: Kind, bytes: u64) -> Option<bool> {
        if bytes == 0 {
            return Some(true);
        }
        let slot = self.slot().ok()?;
        let limit = self.limit();
        let mut r = self.ledger.charge(slot, kind, bytes, limit);
        // Refused: a killed process may still hold usage; reclaim dead slots and try once more.
        if r.is_err() && matches!(self.ledger.reclaim_dead(), Ok(n) if n > 0) {
            r = self.ledger.charge(slot, kind, bytes, limit);
        }
        Some(r.is_ok())
    }

    /// Records memory the driver already handed out (pool or graph reservation growth found afterwards).
    pub fn charge_forced(&self, kind: Kind, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let recorded = self
            .slot()
            .is_ok_and(|slot| self.ledger.charge(slot, kind, bytes, u64::MAX).is_ok());
        if !recorded {
            log::error(format_args!(
                "ledger full: cannot record {bytes} bytes on {}",
                self.uuid
            ));
            return;
        }
        // A forced overrun (`docs/libvgpu.md`): said once, when this charge takes the device past its quota.
        let used = self.ledger.used();
        let limit = self.limit();
        if crossed(used, bytes, limit) {
            log::warn(format_args!(
                "quota: {bytes} bytes ({kind:?}) the driver already took recorded on device {} ({}): {used} of {} bytes in use, past the quota; further allocations are refused until usage is back under it",
                self.ordinal, self.uuid, limit
            ));
        }
    }

    /// Spill mode: charges `bytes` served as host-preferred managed memory to the container's spill
    /// budget (never to the quota); false = past the budget (or not in spill mode).
    pub fn charge_spill(&self, bytes: u64) -> bool {
        let Some(budget) = self.memory.spill_limit() else {
            return false;
        };
        let Ok(slot) = self.slot() else {
            return false;
        };
        let mut r = self.ledger.charge_spill(slot, bytes, budget);
        if r.is_err() && matches!(self.ledger.reclaim_dead(), Ok(n) if n > 0) {
            r = self.ledger.charge_spill(slot, bytes, budget);
        }
        if r.is_err() {
            self.ledger.count_refusal();
            log::warn(format_args!(
                "quota: refused to spill {bytes} bytes on device {} ({}): {} of {budget} spill bytes in use",
                self.ordinal,
                self.uuid,
                self.ledger.spilled()
            ));
        }
        r.is_ok()
    }

    pub fn refund_spill(&self, bytes: u64) {
        let p = self.slot.load(Ordering::Acquire);
        if bytes > 0 && !p.is_null() {
            // SAFETY: as in `slot`: a published slot's memory is never freed.
            self.ledger.refund_spill(unsafe { &*p }, bytes);
        }
    }

    /// The container's spilled bytes on this GPU (all processes).
    #[cfg(test)]
    pub fn spilled(&self) -> u64 {
        self.ledger.spilled()
    }

    pub fn refund(&self, kind: Kind, bytes: u64) {
        // Without a slot this process never charged anything.
        let p = self.slot.load(Ordering::Acquire);
        if bytes > 0 && !p.is_null() {
            // SAFETY: as in `slot`: a published slot's memory is never freed.
            self.ledger.refund(unsafe { &*p }, kind, bytes);
        }
    }

    /// Serialises memory measurements (context creation) among the processes sharing this quota, and the
    /// threads of this process, so that one measurement does not count another's new context. The
    /// ledger's measurement lock (`vgpu_ledger::MeasureLock`: an OFD lock on the ledger's header bytes,
    /// no file of its own): released by the kernel if the holder dies, never inherited by a fork child.
    ///
    /// The wait is bounded (MEASURE_WAIT): a holder that is stopped or stuck makes this measurement run
    /// without the lock, which can only count another process's concurrent context too (charge more,
    /// never less). None (measure unlocked) too when the lock cannot be asked for (one warning line).
    pub fn measure_lock(&self) -> Option<MeasureLock> {
        let deadline = Instant::now() + MEASURE_WAIT;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.ledger.try_measure_lock() {
                Ok(Some(held)) => return Some(held),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Ok(None) => {
                    log::warn(format_args!(
                        "measurement lock of {} still held after {} s (a stopped process?): measuring \
                         without it; a context created meanwhile by another process may be counted twice",
                        self.ledger_path.display(),
                        MEASURE_WAIT.as_secs()
                    ));
                    return None;
                }
                Err(e) => {
                    log::warn(format_args!(
                        "measurement lock of {}: {e}; measuring without it",
                        self.ledger_path.display()
                    ));
                    return None;
                }
            }
        }
    }

    /// The container's usage of this GPU (all processes).
    pub fn used(&self) -> u64 {
        self.ledger.used()
    }

    /// This process's own usage of this GPU (its slot, all kinds), from a ledger snapshot: for
    /// measurements only (it reads every slot).
    pub fn own_used(&self) -> u64 {
        let p = self.slot.load(Ordering::Acquire);
        if p.is_null() {
            return 0; // no slot yet: this process never charged anything here
        }
        // SAFETY: as in `slot`: a published slot's memory is never freed.
        let index = unsafe { &*p }.index();
        self.ledger
            .snapshot()
            .slots
            .iter()
            .find(|s| s.index == index)
            .map_or(0, |s| s.total())
    }
}

/// Whether a container's ledger can be opened: vgpu-hook provisioned it as a regular file and it is
/// mounted into the container, so missing, or anything else (a FIFO, a link), means it was tampered with.
fn provisioned(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => Err(format!(
            "is not a regular file ({:?}); a container's ledger is one vgpu-hook provisioned",
            m.file_type()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
            "is missing; a container's ledger is provisioned by vgpu-hook, never created here"
                .into(),
        ),
        Err(e) => Err(e.to_string()),
    }
}

/// Milliseconds since the first call (a monotonic clock for backoffs).
pub(crate) fn millis() -> u64 {
    static EPOCH: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::mono_ns() / 1_000_000;
    let e = EPOCH.load(Ordering::Relaxed);
    if e == 0 {
        let _ = EPOCH.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }
    now.saturating_sub(EPOCH.load(Ordering::Relaxed)) + 1
}

// ---- the fork gate ------------------------------------------------------------------------------------
// A slot is attached inside the gate and fork waits until no attach is in flight, so a child never
// inherits a slot's descriptor that nobody will forget. Attaches do not wait for a fork that is only
// waiting (the gate favours them), so no attach can be held up behind a fork that waits for it.

const FORKING: usize = 1 << (usize::BITS - 1);
static GATE: AtomicUsize = AtomicUsize::new(0);

struct GateGuard;

fn gate_enter() -> GateGuard {
    loop {
        let s = GATE.load(Ordering::Acquire);
        if s & FORKING == 0
            && GATE
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return GateGuard;
        }
        std::thread::yield_now();
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        GATE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// fork prepare: wait until no slot is being attached, and hold new attaches back until the fork is done.
pub(crate) fn fork_prepare() {
    while GATE
        .compare_exchange_weak(0, FORKING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        std::thread::yield_now();
    }
}

/// fork parent and child: attaches may go on.
pub(crate) fn fork_done() {
    GATE.store(0, Ordering::Release);
}

#[cfg(test)]
impl DeviceQuota {
    /// The container's usage of `kind` (all slots), from a ledger snapshot.
    pub fn usage_of(&self, kind: Kind) -> u64 {
        self.ledger
            .snapshot()
            .slots
            .iter()
            .map(|s| s.usage[kind.index()])
            .sum()
    }
}

/// Whether a charge of `bytes` that brought usage to `used` took it from within `limit` to past it.
fn crossed(used: u64, bytes: u64, limit: u64) -> bool {
    used > limit && used.saturating_sub(bytes) <= limit
}

#[cfg(test)]
pub(crate) mod tests;
