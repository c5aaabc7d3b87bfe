//! Which quota governs each CUDA device of this process: resolved once per ordinal by UUID, then read
//! with one atomic load. Also the slots' fork and exit handling. Charging itself lives in `quota`.
//!
//! Resolved lazily (first CUDA call touching a device), by UUID as `cuDeviceGetUuid` reports it, so a
//! reordered CUDA_VISIBLE_DEVICES cannot move a quota. After fork the child drops the parent's slots
//! without refunding them (`Slot::forget_after_fork`) and attaches its own on next use.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use vgpu_ledger::Ledger;

use crate::config::{Config, UuidLookup};
use crate::error::Error;
use crate::ffi::*;
use crate::guard::exiting;
use crate::log;
use crate::quota::DeviceQuota;
use crate::real::{real, Lib};

pub const MAX_DEVICES: usize = 64;

/// Where the configuration comes from (`settings::config` in the library; a fixed one in tests).
pub type ConfigFn = fn() -> Result<&'static Config, Error>;

// Per CUDA ordinal: 0 unknown, 1 no limit, 2 failed (a limit applies but cannot be used), else a pointer to
// a leaked DeviceQuota. Quotas are immortal (never freed), so the hot path is one atomic load: no lock, no
// reference count. Only their slots end: at exit (released) or in a fork child (forgotten).
const UNKNOWN: usize = 0;
const UNLIMITED: usize = 1;
const FAILED: usize = 2;
static DEVICES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(UNKNOWN) }; MAX_DEVICES];
/// Serialises resolution (ledger open and slot attach) so each device gets exactly one slot.
static RESOLVING: Mutex<()> = Mutex::new(());

fn decode(v: usize) -> Result<Option<&'static DeviceQuota>, Error> {
    match v {
        UNKNOWN | UNLIMITED => Ok(None),
        FAILED => Err(Error::Unenforceable),
        // SAFETY: every other value is a pointer from Box::leak in `for_device`, never freed.
        p => Ok(Some(unsafe { &*(p as *const DeviceQuota) })),
    }
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
#[inline]
pub fn for_device(dev: CUdevice, config: ConfigFn) -> Result<Option<&'static DeviceQuota>, Error> {
    if exiting() {
        return Ok(None);
    }
    let Some(cell) = usize::try_from(dev).ok().and_then(|i| DEVICES.get(i)) else {
        return Ok(None);
    };
    let v = cell.load(Ordering::Acquire);
    if v != UNKNOWN {
        return decode(v);
    }
    resolve_slow(cell, dev, config)
}

#[cold]
fn resolve_slow(
    cell: &AtomicUsize,
    dev: CUdevice,
    config: ConfigFn,
) -> Result<Option<&'static DeviceQuota>, Error> {
    let cfg = config()?;
    if cfg.is_unlimited() {
        return Ok(None);
    }
    // Once per device: a driver call and file I/O under the resolution lock (not the hot path).
    let _g = RESOLVING.lock();
    let v = cell.load(Ordering::Acquire);
    if v != UNKNOWN {
        return decode(v);
    }
    let v = match resolve(cfg, dev) {
        Ok(None) => UNLIMITED,
        Err(_) => FAILED,
        Ok(Some(q)) => Box::leak(Box::new(q)) as *const DeviceQuota as usize,
    };
    cell.store(v, Ordering::Release);
    decode(v)
}

fn resolve(cfg: &Config, dev: CUdevice) -> Result<Option<DeviceQuota>, Error> {
    let Some(uuid) = device_uuid(dev) else {
        log::error(format_args!(
            "cannot read the UUID of CUDA device {dev}; CUDA is refused on it"
        ));
        return Err(Error::NoUuid);
    };
    let Some(spec) = cfg.for_device(dev, &uuid) else {
        log::debug(format_args!("device {dev} ({uuid}): no limit"));
        return Ok(None);
    };
    match DeviceQuota::open(dev, &uuid, spec.limit, &spec.ledger) {
        Ok(q) => {
            log::info(format_args!(
                "device {dev} ({uuid}): limit {} bytes, ledger {}",
                spec.limit,
                spec.ledger.display()
            ));
            Ok(Some(q))
        }
        Err(e) => {
            log::error(format_args!(
                "device {dev} ({uuid}): ledger {}: {e}; CUDA is refused on it",
                spec.ledger.display()
            ));
            Err(e)
        }
    }
}

/// Resolves every visible device now (from cuInit), so a limit that cannot be enforced fails CUDA's start.
pub fn resolve_all(config: ConfigFn) -> Result<(), Error> {
    let Some(count) = real!(
        Lib::Cuda,
        "cuDeviceGetCount",
        unsafe extern "C" fn(*mut i32) -> CUresult
    ) else {
        return Ok(());
    };
    let mut n = 0;
    // SAFETY: n is a valid out-pointer.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return Ok(());
    }
    for d in 0..n.min(MAX_DEVICES as i32) {
        for_device(d, config)?;
    }
    Ok(())
}

/// A read-only view of the ledger of a GPU known by UUID (NVML), for processes that never used CUDA.
pub struct UuidView {
    pub limit: u64,
    pub used: u64,
}

pub fn view_by_uuid(uuid: &str, config: ConfigFn) -> Result<Option<UuidView>, Error> {
    let cfg = config()?;
    let spec = match cfg.for_uuid(uuid) {
        UuidLookup::NoLimit => return Ok(None),
        UuidLookup::Limit(s) => s,
        UuidLookup::NeedsOrdinal => {
            let Some(d) = ordinal_of_uuid(uuid) else {
                return Ok(None);
            };
            return Ok(for_device(d, config)?.map(|q| UuidView {
                limit: q.limit,
                used: q.used(),
            }));
        }
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
                return Err(Error::Ledger(e.to_string()));
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

/// fork child: the parent's slots are not ours. Forget them (without refunding; the child inherited no
/// descriptor or mapping of theirs, so nothing is closed) and attach fresh slots on next use.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_in_nvml_spelling() {
        let b: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
        assert_eq!(format_uuid(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn failed_devices_refuse_and_unknown_ones_have_no_quota() {
        assert!(matches!(decode(UNKNOWN), Ok(None)));
        assert!(matches!(decode(UNLIMITED), Ok(None)));
        assert_eq!(decode(FAILED).err(), Some(Error::Unenforceable));
    }

    #[test]
    fn out_of_range_ordinals_have_no_quota() {
        let never = || -> Result<&'static Config, Error> { panic!("config must not be read") };
        assert!(matches!(for_device(-1, never), Ok(None)));
        assert!(matches!(for_device(MAX_DEVICES as i32, never), Ok(None)));
    }
}
