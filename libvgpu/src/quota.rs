//! Per-GPU quotas of this process: the ledger, this process's slot in it and the limit, per CUDA ordinal.
//!
//! Resolved lazily (first CUDA call touching a device), by UUID as `cuDeviceGetUuid` reports it, so a
//! reordered CUDA_VISIBLE_DEVICES cannot move a quota. After fork the child drops the parent's slots
//! without refunding them (`Slot::forget_after_fork`) and attaches its own on next use.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use vgpu_ledger::{Kind, Ledger, Slot};

use crate::config::{Config, DeviceSpec, UuidLookup};
use crate::ffi::*;
use crate::log;
use crate::real::{real, Lib};

pub const MAX_DEVICES: usize = 64;

pub struct DeviceQuota {
    pub ordinal: i32,
    pub uuid: String,
    pub limit: u64,
    ledger_path: std::path::PathBuf,
    ledger: Ledger,
    // ManuallyDrop: after fork the child takes the slot out with ptr::read and forgets it (see `child`).
    slot: ManuallyDrop<Slot>,
}

impl DeviceQuota {
    /// Charges before the driver call; false = the quota would be exceeded.
    pub fn charge(&self, kind: Kind, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut r = self.ledger.charge(&self.slot, kind, bytes, self.limit);
        // Refused: a killed process may still hold usage; reclaim dead slots and try once more.
        if r.is_err() && matches!(self.ledger.reclaim_dead(), Ok(n) if n > 0) {
            r = self.ledger.charge(&self.slot, kind, bytes, self.limit);
        }
        match r {
            Ok(()) => true,
            Err(_) => {
                log::warn(format_args!(
                    "quota: refused {bytes} bytes ({kind:?}) on device {} ({}): {} of {} bytes in use",
                    self.ordinal,
                    self.uuid,
                    self.ledger.used(),
                    self.limit
                ));
                false
            }
        }
    }

    /// Records memory the driver already handed out (pool or graph reservation growth found afterwards).
    pub fn charge_forced(&self, kind: Kind, bytes: u64) {
        if bytes > 0
            && self
                .ledger
                .charge(&self.slot, kind, bytes, u64::MAX)
                .is_err()
        {
            log::error(format_args!(
                "ledger full: cannot record {bytes} bytes on {}",
                self.uuid
            ));
        }
    }

    pub fn refund(&self, kind: Kind, bytes: u64) {
        if bytes > 0 {
            self.ledger.refund(&self.slot, kind, bytes);
        }
    }

    /// Serialises memory measurements (context creation) among the processes sharing this quota, so that
    /// one process's measurement does not count another's new context. A POSIX record lock on
    /// `<ledger>.measure`: released by the kernel if the holder dies, and not inherited by a fork child
    /// (an flock or OFD lock would stay held by the child's copy of the descriptor). None (measure
    /// unlocked) if the file cannot be opened.
    pub fn measure_lock(&self) -> Option<std::fs::File> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut path = self.ledger_path.clone().into_os_string();
        path.push(".measure");
        // Created 0666 whatever the umask (the container's processes may run as different users).
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .ok()?;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        // SAFETY: an all-zero flock is a valid value; the fields are set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        loop {
            // SAFETY: fcntl F_SETLKW on a descriptor we own with a valid flock; the lock goes when the File
            // is dropped (closed).
            if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLKW, &fl) } == 0 {
                return Some(f);
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
        }
    }

    /// The container's usage of this GPU (all processes).
    pub fn used(&self) -> u64 {
        self.ledger.used()
    }
}

// Per CUDA ordinal: 0 unknown, 1 no limit, 2 failed (a limit applies but cannot be used), else a pointer to
// a leaked DeviceQuota. Quotas are immortal (never freed), so the hot path is one atomic load: no lock, no
// reference count. Only their slots end: at exit (released) or in a fork child (forgotten).
const UNKNOWN: usize = 0;
const UNLIMITED: usize = 1;
const FAILED: usize = 2;
static DEVICES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(UNKNOWN) }; MAX_DEVICES];
/// Serialises resolution (ledger open and slot attach) so each device gets exactly one slot.
static RESOLVING: Mutex<()> = Mutex::new(());

fn decode(v: usize) -> Result<Option<&'static DeviceQuota>, CUresult> {
    match v {
        UNKNOWN | UNLIMITED => Ok(None),
        FAILED => Err(CUDA_ERROR_NOT_INITIALIZED),
        // SAFETY: every other value is a pointer from Box::leak in `for_device`, never freed.
        p => Ok(Some(unsafe { &*(p as *const DeviceQuota) })),
    }
}

static CONFIG: OnceLock<Result<Config, String>> = OnceLock::new();

/// The configuration, loaded on first use; an error is logged once and makes CUDA refuse to start.
pub fn config() -> Result<&'static Config, ()> {
    let c = CONFIG.get_or_init(|| {
        let c = Config::load();
        match &c {
            Err(e) => log::error(format_args!("{e}; CUDA is refused in this process")),
            Ok(c) if !c.is_unlimited() => {
                crate::lifecycle::register();
                log::info(format_args!("configuration: {c:?}"));
            }
            Ok(_) => {}
        }
        c
    });
    c.as_ref().map_err(|_| ())
}

/// True when no quota applies anywhere (the hooks then only forward).
pub fn unlimited() -> bool {
    matches!(config(), Ok(c) if c.is_unlimited())
}

/// The UUID of a CUDA device in NVML's spelling, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub fn device_uuid(dev: CUdevice) -> Option<String> {
    let mut u = CUuuid::default();
    let f = real!(
        Lib::Cuda,
        "cuDeviceGetUuid_v2",
        unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult
    )
    .or(real!(
        Lib::Cuda,
        "cuDeviceGetUuid",
        unsafe extern "C" fn(*mut CUuuid, CUdevice) -> CUresult
    ))?;
    // SAFETY: u is a valid out-pointer of the driver's CUuuid type.
    (unsafe { f(&mut u, dev) } == CUDA_SUCCESS).then(|| format_uuid(&u.bytes))
}

/// The quota of CUDA device `dev`: Ok(None) without a limit, Err when a limit applies but cannot be used.
pub fn for_device(dev: CUdevice) -> Result<Option<&'static DeviceQuota>, CUresult> {
    if crate::lifecycle::exiting() {
        return Ok(None);
    }
    let Some(cell) = usize::try_from(dev).ok().and_then(|i| DEVICES.get(i)) else {
        return Ok(None);
    };
    let v = cell.load(Ordering::Acquire);
    if v != UNKNOWN {
        return decode(v);
    }
    let Ok(cfg) = config() else {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    };
    if cfg.is_unlimited() {
        return Ok(None);
    }
    // Slow path, once per device: a driver call and file I/O under the resolution lock (not the hot path).
    let _g = RESOLVING.lock();
    let v = cell.load(Ordering::Acquire);
    if v != UNKNOWN {
        return decode(v);
    }
    let v = match resolve(cfg, dev) {
        Resolved::Unlimited => UNLIMITED,
        Resolved::Failed => FAILED,
        Resolved::Quota(q) => Box::leak(Box::new(q)) as *const DeviceQuota as usize,
    };
    cell.store(v, Ordering::Release);
    decode(v)
}

enum Resolved {
    Unlimited,
    Failed,
    Quota(DeviceQuota),
}

fn resolve(cfg: &Config, dev: CUdevice) -> Resolved {
    let Some(uuid) = device_uuid(dev) else {
        log::error(format_args!(
            "cannot read the UUID of CUDA device {dev}; CUDA is refused on it"
        ));
        return Resolved::Failed;
    };
    let Some(spec) = cfg.for_device(dev, &uuid) else {
        log::debug(format_args!("device {dev} ({uuid}): no limit"));
        return Resolved::Unlimited;
    };
    match open_quota(dev, &uuid, &spec) {
        Ok(q) => {
            log::info(format_args!(
                "device {dev} ({uuid}): limit {} bytes, ledger {}",
                spec.limit,
                spec.ledger.display()
            ));
            Resolved::Quota(q)
        }
        Err(e) => {
            log::error(format_args!(
                "device {dev} ({uuid}): ledger {}: {e}; CUDA is refused on it",
                spec.ledger.display()
            ));
            Resolved::Failed
        }
    }
}

fn open_quota(dev: CUdevice, uuid: &str, spec: &DeviceSpec) -> Result<DeviceQuota, String> {
    let ledger =
        Ledger::open_or_create(&spec.ledger, uuid, spec.limit).map_err(|e| e.to_string())?;
    let slot = ledger.attach().map_err(|e| e.to_string())?;
    // Usage left by processes killed earlier goes back to the quota now.
    let _ = ledger.reclaim_dead();
    Ok(DeviceQuota {
        ordinal: dev,
        uuid: uuid.to_string(),
        limit: spec.limit,
        ledger_path: spec.ledger.clone(),
        ledger,
        slot: ManuallyDrop::new(slot),
    })
}

/// Resolves every visible device now (from cuInit), so a limit that cannot be enforced fails CUDA's start.
pub fn resolve_all() -> CUresult {
    let Some(count) = real!(
        Lib::Cuda,
        "cuDeviceGetCount",
        unsafe extern "C" fn(*mut i32) -> CUresult
    ) else {
        return CUDA_SUCCESS;
    };
    let mut n = 0;
    // SAFETY: n is a valid out-pointer.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return CUDA_SUCCESS;
    }
    for d in 0..n.min(MAX_DEVICES as i32) {
        if let Err(e) = for_device(d) {
            return e;
        }
    }
    CUDA_SUCCESS
}

/// A read-only view of the ledger of a GPU known by UUID (NVML), for processes that never used CUDA.
pub struct UuidView {
    pub limit: u64,
    pub used: u64,
}

pub fn view_by_uuid(uuid: &str) -> Result<Option<UuidView>, ()> {
    let cfg = config()?;
    let spec = match cfg.for_uuid(uuid) {
        UuidLookup::NoLimit => return Ok(None),
        UuidLookup::Limit(s) => s,
        UuidLookup::NeedsOrdinal => match ordinal_of_uuid(uuid) {
            Some(d) => match for_device(d) {
                Ok(Some(q)) => {
                    return Ok(Some(UuidView {
                        limit: q.limit,
                        used: q.used(),
                    }))
                }
                Ok(None) => return Ok(None),
                Err(_) => return Err(()),
            },
            None => return Ok(None),
        },
    };
    // If this process already holds the quota, use it; otherwise read the ledger without a slot.
    if let Some(q) = attached_by_uuid(uuid) {
        return Ok(Some(UuidView {
            limit: q.limit,
            used: q.used(),
        }));
    }
    let used = if spec.ledger.exists() {
        match Ledger::open_readonly(&spec.ledger) {
            Ok(l) => l.used(),
            Err(e) => {
                log::error(format_args!("ledger {}: {e}", spec.ledger.display()));
                return Err(());
            }
        }
    } else {
        0
    };
    Ok(Some(UuidView {
        limit: spec.limit,
        used,
    }))
}

fn attached_by_uuid(uuid: &str) -> Option<&'static DeviceQuota> {
    DEVICES
        .iter()
        .find_map(|c| match decode(c.load(Ordering::Acquire)) {
            Ok(Some(q)) if q.uuid == uuid => Some(q),
            _ => None,
        })
}

/// The CUDA ordinal of a GPU by UUID, asking the real driver (only for per-ordinal env limits under NVML).
fn ordinal_of_uuid(uuid: &str) -> Option<i32> {
    let init = real!(Lib::Cuda, "cuInit", unsafe extern "C" fn(u32) -> CUresult)?;
    let count = real!(
        Lib::Cuda,
        "cuDeviceGetCount",
        unsafe extern "C" fn(*mut i32) -> CUresult
    )?;
    let mut n = 0;
    // SAFETY: plain driver calls with valid out-pointers.
    if unsafe { init(0) } != CUDA_SUCCESS || unsafe { count(&mut n) } != CUDA_SUCCESS {
        return None;
    }
    (0..n).find(|&d| device_uuid(d).as_deref() == Some(uuid))
}

// ---- process life -------------------------------------------------------------------------------------

/// fork prepare: no resolution may be half done when the child is made.
pub(crate) fn lock_all() {
    std::mem::forget(RESOLVING.lock());
}

/// fork parent: release what `lock_all` took.
pub(crate) fn unlock_all() {
    // SAFETY: lock_all took exactly this lock in this thread and forgot its guard.
    unsafe { RESOLVING.force_unlock() };
}

/// fork child: the parent's slots are not ours. Forget them (closing the inherited descriptors without
/// refunding) and attach fresh slots on next use.
pub(crate) fn child_after_fork() {
    // SAFETY: as in unlock_all; the child has one thread, which took the lock in lock_all.
    unsafe { RESOLVING.force_unlock() };
    for c in &DEVICES {
        if let Ok(Some(q)) = decode(c.swap(UNKNOWN, Ordering::AcqRel)) {
            // SAFETY: the quota is leaked and never read again in this process (its entry is reset), and
            // the child has a single thread: the slot is moved out exactly once.
            let slot = unsafe { std::ptr::read(&q.slot) };
            ManuallyDrop::into_inner(slot).forget_after_fork();
        }
    }
}

/// exit: detach our slots, refunding what this process still holds. `exiting()` is already set, so no
/// new hooked call reaches a quota; the quotas themselves stay allocated (a thread still inside a call
/// reads valid memory).
pub(crate) fn release_all() {
    for c in &DEVICES {
        if let Ok(Some(q)) = decode(c.swap(UNKNOWN, Ordering::AcqRel)) {
            // SAFETY: the entry was swapped out, so the slot is moved out exactly once.
            let slot = unsafe { std::ptr::read(&q.slot) };
            drop(ManuallyDrop::into_inner(slot));
        }
    }
}
