//! The state file: device memory shared by every process that uses the fakes.
//!
//! One memory-mapped file per device configuration holds, per device, the bytes in use and, per
//! process, a slot with its usage per device. Charging is a compare-and-swap on the device's
//! counter (no lock), then an add to the process's slot. A process owns its slot by holding an
//! `fcntl` OFD write lock on the slot's first byte: the kernel drops the lock when the process
//! dies, in whatever PID namespace, so a slot whose lock can be taken is dead and its usage can
//! be given back to the devices ("reclaim"). Reclaim is lazy: at process start, when an
//! allocation does not fit, and when NVML reads the state.
//!
//! A process can die between the two steps of a charge or refund, so the device counters and the
//! slots may disagree by that operation. Reclaim therefore does not subtract the dead slots'
//! usage: it raises a flag that holds new operations back, waits until no live process is inside
//! one (each slot counts its operations in flight), and recomputes every device counter as the
//! sum of the live slots. The device counters come back exact whatever instruction a process died
//! at. (A live process stuck inside an operation, e.g. stopped, makes reclaim fall back to
//! subtracting the dead slots' usage after a short wait.)

pub use crate::config::VERSION;
use crate::config::{Config, MAX_DEVICES};
use std::ffi::CString;
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

/// Process slots in the file.
pub const SLOTS: usize = 512;
const MAGIC: u64 = u64::from_le_bytes(*b"FAKECUDA");
const FREE: u32 = 0;
const LIVE: u32 = 1;

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    version: u32,
    ndev: u32,
    nslots: u32,
    /// Non-zero while a reclaim recomputes the device counters: operations wait.
    reclaiming: AtomicU32,
    totals: [u64; MAX_DEVICES],
}

#[repr(C, align(64))]
struct Device {
    used: AtomicU64,
}

#[repr(C, align(64))]
struct Slot {
    state: AtomicU32,
    /// The owner's PID as the owner sees it (informational: NVML lists it).
    pid: AtomicU32,
    /// Charges and refunds of this process in progress (all its threads).
    in_flight: AtomicU32,
    /// Inode of the owner's PID namespace (0: unknown), so NVML can name it by the PID its caller sees.
    pid_ns: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    /// When the owner's kernel queue drains (CLOCK_MONOTONIC ns; the fake CUDA's `timeline`), for the
    /// time slicing between processes. In the slot's padding: the layout and format version are as before.
    busy_until: AtomicU64,
    /// The owner's own work queued so far (ns) and when it claimed the slot: the fake NVML's utilisation.
    busy_ns: AtomicU64,
    claimed_at: AtomicU64,
    /// Managed memory (`cuMemAllocManaged`) the owner holds per device, and the part of it charged to the
    /// device (resident): the paging model (`activity`).
    managed: [AtomicU64; MAX_DEVICES],
    managed_resident: [AtomicU64; MAX_DEVICES],
}
const _: () = assert!(size_of::<Slot>() == 448);

#[repr(C)]
struct Layout {
    header: Header,
    devices: [Device; MAX_DEVICES],
    slots: [Slot; SLOTS],
}

/// What NVML shows: per device (total, used) and the live processes with their usage.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub devices: Vec<(u64, u64)>,
    /// (PID as the process sees it, its PID namespace inode or 0, usage per device).
    pub processes: Vec<(u32, u64, Vec<u64>)>,
}

/// An open state file, optionally with a claimed process slot.
#[derive(Debug)]
pub struct Shared {
    fd: i32,
    map: *mut Layout,
    ndev: usize,
    slot: Option<usize>,
}

// SAFETY: the mapping is only accessed through atomics; the fd is an integer.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// Inode of this process's PID namespace (0 when /proc cannot tell).
pub fn own_pid_ns() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m))
}

fn slot_offset(i: usize) -> i64 {
    (std::mem::offset_of!(Layout, slots) + i * size_of::<Slot>()) as i64
}

/// Byte of the header whose lock serialises reclaimers (byte 0 serialises initialisation).
const RECLAIM_LOCK: i64 = 1;
/// How long a reclaim waits for live processes to finish their operations in flight.
const QUIESCE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Tries (or with `wait`, waits) to take an OFD lock of `kind` on one byte at `off`.
fn ofd_lock(fd: i32, off: i64, kind: i32, wait: bool) -> bool {
    // SAFETY: flock is plain data; zeroed is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = off;
    fl.l_len = 1;
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: fd is ours, fl is a valid flock.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

impl Shared {
    /// Opens (creating when absent) the state file of `cfg`. Claims no slot.
    pub fn open(cfg: &Config) -> Result<Shared, String> {
        let path = cfg.state_file();
        let dir = CString::new(cfg.state_dir.as_str())
            .map_err(|_| "state dir has a NUL byte".to_string())?;
        let cpath =
            CString::new(path.as_str()).map_err(|_| "state path has a NUL byte".to_string())?;
        // SAFETY: valid C strings; errors are checked.
        unsafe {
            if libc::mkdir(dir.as_ptr(), 0o1777) == 0 {
                libc::chmod(dir.as_ptr(), 0o1777); // whoever comes next (another container, user) shares it
            }
            let fd = libc::open(
                cpath.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o666,
            );
            if fd < 0 {
                return Err(format!(
                    "cannot open {path}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            libc::fchmod(fd, 0o666);
            let me = Shared::map_and_init(fd, cfg, &path);
            if me.is_err() {
                libc::close(fd);
            }
            me
        }
    }

    /// Maps the file, initialising it under an OFD lock on byte 0 when it is new.
    unsafe fn map_and_init(fd: i32, cfg: &Config, path: &str) -> Result<Shared, String> {
        let len = size_of::<Layout>();
        ofd_lock(fd, 0, libc::F_WRLCK, true);
        let result = (|| {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                return Err(format!("cannot stat {path}"));
            }
            let fresh = st.st_size == 0;
            // Allocated for real, not sparse (as the ledgers are): a sparse file on a file system that
            // cannot back its pages (a full or small tmpfs) killed a process with SIGBUS at its first
            // touch of one, far from the cause; now creating fails with one line.
            if fresh {
                let e = libc::posix_fallocate(fd, 0, len as libc::off_t);
                if e != 0 {
                    libc::ftruncate(fd, 0);
                    return Err(format!(
                        "cannot allocate {path} ({len} bytes): {}",
                        std::io::Error::from_raw_os_error(e)
                    ));
                }
            } else if !fresh && st.st_size as usize != len {
                return Err(format!(
                    "{path}: size {} is not {len}: not a fake-cuda state file",
                    st.st_size
                ));
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(format!(
                    "cannot map {path}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let map = p as *mut Layout;
            let h = &mut (*map).header;
            if fresh {
                h.version = VERSION;
                h.ndev = cfg.totals.len() as u32;
                h.nslots = SLOTS as u32;
                h.totals[..cfg.totals.len()].copy_from_slice(&cfg.totals);
                h.magic.store(MAGIC, Release);
            } else if h.magic.load(Acquire) != MAGIC
                || h.version != VERSION
                || h.ndev as usize != cfg.totals.len()
                || h.totals[..cfg.totals.len()] != cfg.totals[..]
            {
                libc::munmap(p, len);
                return Err(format!("{path}: header does not match this configuration"));
            }
            Ok(Shared {
                fd,
                map,
                ndev: cfg.totals.len(),
                slot: None,
            })
        })();
        ofd_lock(fd, 0, libc::F_UNLCK, false);
        result
    }

    fn layout(&self) -> &Layout {
        // SAFETY: map points at a live mapping of a whole Layout for the life of self.
        unsafe { &*self.map }
    }

    /// Number of physical devices.
    pub fn ndev(&self) -> usize {
        self.ndev
    }

    /// Memory of physical device `dev`.
    pub fn total(&self, dev: usize) -> u64 {
        self.layout().header.totals[dev]
    }

    /// Bytes in use on physical device `dev`, all processes together.
    pub fn used(&self, dev: usize) -> u64 {
        self.layout().devices[dev].used.load(Relaxed)
    }

    /// This process's slot, once claimed.
    pub fn slot(&self) -> Option<usize> {
        self.slot
    }

    /// Bytes this process holds on `dev`.
    pub fn my_usage(&self, dev: usize) -> u64 {
        self.slot
            .map_or(0, |s| self.layout().slots[s].used[dev].load(Relaxed))
    }

    /// Gives back the usage of every dead process; then claims a slot for this one.
    pub fn claim(&mut self) -> Result<usize, String> {
        if let Some(s) = self.slot {
            return Ok(s);
        }
        self.reclaim_dead();
        let pid = std::process::id();
        for i in 0..SLOTS {
            let slot = &self.layout().slots[i];
            if slot.state.load(Relaxed) != FREE
                || !ofd_lock(self.fd, slot_offset(i), libc::F_WRLCK, false)
            {
                continue;
            }
            // Holding the lock: nobody else can claim or reclaim this slot.
            if slot.state.load(Acquire) == LIVE {
                self.give_back(i); // died between our sweep and now
            }
            slot.pid.store(pid, Relaxed);
            slot.pid_ns.store(own_pid_ns(), Relaxed);
            slot.in_flight.store(0, Relaxed);
            for u in slot
                .used
                .iter()
                .chain(&slot.managed)
                .chain(&slot.managed_resident)
            {
                u.store(0, Relaxed);
            }
            slot.busy_until.store(0, Relaxed);
            slot.busy_ns.store(0, Relaxed);
            slot.claimed_at.store(crate::clock::monotonic_ns(), Relaxed);
            slot.state.store(LIVE, Release);
            self.slot = Some(i);
            return Ok(i);
        }
        Err(format!(
            "all {SLOTS} process slots of the state file are in use"
        ))
    }

    /// Returns the usage of slot `i` (whose lock we hold) to the devices by subtraction (exact
    /// unless the process died inside an operation); frees the slot.
    fn give_back(&self, i: usize) -> u64 {
        let slot = &self.layout().slots[i];
        let mut total = 0;
        for d in 0..self.ndev {
            let u = slot.used[d].swap(0, AcqRel);
            if u != 0 {
                let _ = self.layout().devices[d]
                    .used
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(u)));
                total += u;
            }
        }
        slot.in_flight.store(0, Release);
        slot.state.store(FREE, Release);
        total
    }

    /// Is slot `i` owned by a dead process? Takes its lock when so (the caller must release it).
    fn lock_if_dead(&self, i: usize) -> bool {
        if Some(i) == self.slot || self.layout().slots[i].state.load(Acquire) != LIVE {
            return false;
        }
        if !ofd_lock(self.fd, slot_offset(i), libc::F_WRLCK, false) {
            return false;
        }
        if self.layout().slots[i].state.load(Acquire) == LIVE {
            return true;
        }
        ofd_lock(self.fd, slot_offset(i), libc::F_UNLCK, false);
        false
    }

    /// Gives back the usage of every process that died; returns the bytes returned.
    pub fn reclaim_dead(&self) -> u64 {
        let l = self.layout();
        let mut dead: Vec<usize> = (0..SLOTS).filter(|&i| self.lock_if_dead(i)).collect();
        if dead.is_empty() {
            return 0;
        }
        let before: u64 = (0..self.ndev)
            .map(|d| l.devices[d].used.load(Acquire))
            .sum();
        let exclusive = ofd_lock(self.fd, RECLAIM_LOCK, libc::F_WRLCK, false);
        let mut exact = false;
        if exclusive {
            l.header.reclaiming.store(1, SeqCst);
            exact = self.quiesce(&mut dead);
            if exact {
                // Every live process is outside its operations: the live slots are the truth.
                for d in 0..self.ndev {
                    let sum: u64 = (0..SLOTS)
                        .filter(|i| l.slots[*i].state.load(Acquire) == LIVE && !dead.contains(i))
                        .map(|i| l.slots[i].used[d].load(Acquire))
                        .sum();
                    l.devices[d].used.store(sum, SeqCst);
                }
                for &i in &dead {
                    let slot = &l.slots[i];
                    for d in 0..self.ndev {
                        slot.used[d].store(0, Release);
                    }
                    slot.in_flight.store(0, Release);
                    slot.state.store(FREE, Release);
                }
            }
        }
        if !exact {
            for &i in &dead {
                self.give_back(i);
            }
        }
        if exclusive {
            l.header.reclaiming.store(0, SeqCst);
            ofd_lock(self.fd, RECLAIM_LOCK, libc::F_UNLCK, false);
        }
        for &i in &dead {
            ofd_lock(self.fd, slot_offset(i), libc::F_UNLCK, false);
        }
        let after: u64 = (0..self.ndev)
            .map(|d| l.devices[d].used.load(Acquire))
            .sum();
        before.saturating_sub(after)
    }

    /// With the reclaiming flag up: waits until no live slot has an operation in flight. A slot
    /// whose process dies meanwhile joins `dead`. False after [`QUIESCE_WAIT`].
    fn quiesce(&self, dead: &mut Vec<usize>) -> bool {
        let l = self.layout();
        let start = std::time::Instant::now();
        loop {
            let mut busy = false;
            for i in 0..SLOTS {
                if dead.contains(&i)
                    || l.slots[i].state.load(Acquire) != LIVE
                    || l.slots[i].in_flight.load(SeqCst) == 0
                {
                    continue;
                }
                if self.lock_if_dead(i) {
                    dead.push(i); // died inside an operation: exactly the case the recount fixes
                } else {
                    busy = true;
                }
            }
            if !busy {
                return true;
            }
            if start.elapsed() > QUIESCE_WAIT {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Marks an operation of our slot in flight, after any reclaim in progress.
    fn enter(&self, s: usize) {
        let l = self.layout();
        loop {
            while l.header.reclaiming.load(Acquire) != 0 {
                // A reclaimer holds RECLAIM_LOCK while the flag is up: if the lock is free, it died.
                if ofd_lock(self.fd, RECLAIM_LOCK, libc::F_WRLCK, false) {
                    l.header.reclaiming.store(0, SeqCst);
                    ofd_lock(self.fd, RECLAIM_LOCK, libc::F_UNLCK, false);
                }
                std::thread::yield_now();
            }
            l.slots[s].in_flight.fetch_add(1, SeqCst);
            if l.header.reclaiming.load(SeqCst) == 0 {
                return;
            }
            l.slots[s].in_flight.fetch_sub(1, SeqCst);
        }
    }

    fn leave(&self, s: usize) {
        self.layout().slots[s].in_flight.fetch_sub(1, Release);
    }

    /// Takes `bytes` of device `dev` for this process; false when the device is full.
    /// Lock-free: a compare-and-swap on the device counter, then an add to our slot.
    pub fn charge(&self, dev: usize, bytes: u64) -> bool {
        let Some(s) = self.slot else { return false };
        let l = self.layout();
        let total = l.header.totals[dev];
        let used = &l.devices[dev].used;
        self.enter(s);
        let mut cur = used.load(Relaxed);
        let ok = loop {
            match cur.checked_add(bytes) {
                Some(n) if n <= total => {
                    match used.compare_exchange_weak(cur, n, AcqRel, Relaxed) {
                        Ok(_) => break true,
                        Err(v) => cur = v,
                    }
                }
                _ => break false,
            }
        };
        if ok {
            l.slots[s].used[dev].fetch_add(bytes, Relaxed);
        }
        self.leave(s);
        ok
    }

    /// Like [`charge`](Self::charge), but when the device is full first gives back the memory of
    /// dead processes and tries again.
    pub fn charge_or_reclaim(&self, dev: usize, bytes: u64) -> bool {
        self.charge(dev, bytes) || (self.reclaim_dead() > 0 && self.charge(dev, bytes))
    }

    /// Returns `bytes` of device `dev` taken by this process.
    pub fn refund(&self, dev: usize, bytes: u64) {
        let Some(s) = self.slot else { return };
        let l = self.layout();
        self.enter(s);
        l.slots[s].used[dev].fetch_sub(bytes, Relaxed);
        l.devices[dev].used.fetch_sub(bytes, AcqRel);
        self.leave(s);
    }

    /// Device totals/usage and the live processes, after reclaiming dead ones.
    pub fn snapshot(&self) -> Snapshot {
        self.reclaim_dead();
        let l = self.layout();
        let devices = (0..self.ndev)
            .map(|d| (l.header.totals[d], l.devices[d].used.load(Acquire)))
            .collect();
        let processes = (0..SLOTS)
            .filter(|&i| l.slots[i].state.load(Acquire) == LIVE)
            .map(|i| {
                let s = &l.slots[i];
                (
                    s.pid.load(Relaxed),
                    s.pid_ns.load(Relaxed),
                    (0..self.ndev).map(|d| s.used[d].load(Relaxed)).collect(),
                )
            })
            .collect();
        Snapshot { devices, processes }
    }

    /// In a child after `fork`: drops the inherited file descriptor (so the parent's slot lock
    /// dies with the parent) and forgets the parent's slot. The mapping stays usable; call
    /// [`reopen_after_fork`](Self::reopen_after_fork) before claiming a slot of our own.
    /// Only async-signal-safe calls: this runs in a `pthread_atfork` child handler.
    pub fn forget_after_fork(&mut self) {
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(self.fd) };
        self.fd = -1;
        self.slot = None;
    }

    /// After [`forget_after_fork`](Self::forget_after_fork): opens the file anew (a new open file
    /// description, so our locks are our own).
    pub fn reopen_after_fork(&mut self, cfg: &Config) -> Result<(), String> {
        if self.fd >= 0 {
            return Ok(());
        }
        let c = CString::new(cfg.state_file()).map_err(|_| "bad path".to_string())?;
        // SAFETY: valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "cannot reopen {}: {}",
                cfg.state_file(),
                std::io::Error::last_os_error()
            ));
        }
        self.fd = fd;
        Ok(())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: our mapping and descriptor; dropping the descriptor releases our slot lock, so
        // whatever we still hold is reclaimed by the next process.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, size_of::<Layout>());
            if self.fd >= 0 {
                libc::close(self.fd);
            }
        }
    }
}

mod activity;
#[cfg(test)]
mod tests;
