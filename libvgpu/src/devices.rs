//! Which quota governs each CUDA device of this process: resolved once per ordinal by UUID, then read
//! with one atomic load. Also the slots' fork and exit handling. Charging itself lives in `quota`.
//!
//! Resolved lazily (first CUDA call touching a device), by UUID as `cuDeviceGetUuid` reports it, so a
//! reordered CUDA_VISIBLE_DEVICES cannot move a quota. Resolution takes no lock: the driver, NVML and the
//! ledger are asked first, and the result is published with one compare-and-swap (a thread that loses the
//! race drops its copy). A device the configuration cannot place (not in the limits file, ordinal past
//! MAX_DEVICES) is refused for good; a failure that may pass (the ledger cannot be opened now) is retried
//! on a later call, at most every RETRY_AFTER.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use vgpu_ledger::Ledger;

use crate::config::{Config, Lookup};
use crate::error::Error;
use crate::ffi::*;
use crate::guard::exiting;
use crate::identity::{self, Identity};
use crate::log;
use crate::quota::{self, DeviceQuota};
use crate::real_symbols::{real, Lib};

pub const MAX_DEVICES: usize = 64;
/// After a failure that may pass, the device is resolved again on the first call this long after.
const RETRY_AFTER_MS: u64 = 100;

/// Where the configuration comes from (`settings::config` in the library; a fixed one in tests).
pub type ConfigFn = fn() -> Result<&'static Config, Error>;

// Per CUDA ordinal: 0 unknown, 1 no limit, 2 refused for good, 3 failed (retried), else a pointer to a
// leaked DeviceQuota. Quotas are immortal (never freed), so the hot path is one atomic load: no lock, no
// reference count. Only their slots end: at exit (released) or in a fork child (forgotten).
const UNKNOWN: usize = 0;
const UNLIMITED: usize = 1;
const REFUSED: usize = 2;
const FAILED: usize = 3;
static DEVICES: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(UNKNOWN) }; MAX_DEVICES];
/// For a FAILED device: `quota::millis()` before which it is not tried again.
static RETRY_AT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Set once the refusal of ordinals past MAX_DEVICES was logged.
static LOGGED_BEYOND: AtomicUsize = AtomicUsize::new(0);

fn decode(v: usize) -> Result<Option<&'static DeviceQuota>, Error> {
    match v {
        UNKNOWN | UNLIMITED => Ok(None),
        REFUSED | FAILED => Err(Error::Unenforceable),
        // SAFETY: every other value is a pointer from Box::leak in `resolve_slow`, never freed.
        p => Ok(Some(unsafe { &*(p as *const DeviceQuota) })),
    }
}

/// The quota of CUDA device `dev`: Ok(None) without a limit, Err when a limit applies but cannot be used.
#[inline]
pub fn for_device(dev: CUdevice, config: ConfigFn) -> Result<Option<&'static DeviceQuota>, Error> {
    if exiting() {
        return Ok(None);
    }
    let Ok(i) = usize::try_from(dev) else {
        // A negative ordinal names no device: the driver refuses the call itself.
        return Ok(None);
    };
    let Some(cell) = DEVICES.get(i) else {
        return beyond(dev, config);
    };
    let v = cell.load(Ordering::Acquire);
    match v {
        UNKNOWN => resolve_slow(i, dev, config),
        FAILED if quota::millis() >= RETRY_AT[i].load(Ordering::Relaxed) => {
            resolve_slow(i, dev, config)
        }
        _ => decode(v),
    }
}

/// An ordinal past MAX_DEVICES: never unlimited while a limit applies.
#[cold]
fn beyond(dev: CUdevice, config: ConfigFn) -> Result<Option<&'static DeviceQuota>, Error> {
    if config()?.is_unlimited() {
        return Ok(None);
    }
    if LOGGED_BEYOND.swap(1, Ordering::Relaxed) == 0 {
        log::error(format_args!(
            "CUDA device {dev}: past the {MAX_DEVICES} devices a quota can be kept for; CUDA is refused on it"
        ));
    }
    Err(Error::Unenforceable)
}

#[cold]
fn resolve_slow(
    i: usize,
    dev: CUdevice,
    config: ConfigFn,
) -> Result<Option<&'static DeviceQuota>, Error> {
    let cfg = config()?;
    if cfg.is_unlimited() {
        return Ok(None);
    }
    let cell = &DEVICES[i];
    let seen = cell.load(Ordering::Acquire);
    // No lock is held here: driver and NVML calls, dlsym and file I/O may all happen.
    let v = match resolve(cfg, dev) {
        Ok(None) => UNLIMITED,
        Ok(Some(q)) => Box::leak(Box::new(q)) as *const DeviceQuota as usize,
        Err(Error::Unenforceable) => REFUSED,
        Err(_) => {
            RETRY_AT[i].store(quota::millis() + RETRY_AFTER_MS, Ordering::Relaxed);
            FAILED
        }
    };
    if v == FAILED && seen == FAILED {
        return decode(v);
    }
    match cell.compare_exchange(seen, v, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => decode(v),
        Err(won) => {
            if v > FAILED {
                // Another thread published first. Ours was never seen by anyone and holds no slot (slots
                // are attached on the first charge), so it is simply dropped.
                // SAFETY: `v` is the Box leaked just above, unpublished.
                drop(unsafe { Box::from_raw(v as *mut DeviceQuota) });
            }
            decode(won)
        }
    }
}

/// Err(Unenforceable): refused for good (logged); another Err: may pass (logged).
fn resolve(cfg: &Config, dev: CUdevice) -> Result<Option<DeviceQuota>, Error> {
    let Some(id) = identity::of_cuda_device(dev) else {
        log::error(format_args!(
            "cannot read the UUID of CUDA device {dev}; CUDA is refused on it"
        ));
        return Err(Error::NoUuid);
    };
    let uuid = &id.uuid;
    let spec = match cfg.lookup(id.gpu()) {
        Lookup::NoLimit => {
            log::debug(format_args!("device {dev} ({uuid}): no limit"));
            return Ok(None);
        }
        Lookup::Refuse(why) => {
            log::error(format_args!(
                "CUDA device {dev}: {why}; CUDA is refused on it"
            ));
            return Err(Error::Unenforceable);
        }
        Lookup::Limit(s) => s,
    };
    match DeviceQuota::open_unattached(dev, uuid, spec.limit(), &spec.ledger, cfg.ledger_mode()) {
        Ok(mut q) => {
            q.memory = spec.settings.memory;
            if let Some(file) = cfg.limits_file() {
                q.follow(file);
            }
            log::info(format_args!(
                "device {dev} ({uuid}): limit {} bytes, ledger {}, memory mode {}",
                spec.limit(),
                spec.ledger.display(),
                spec.settings.memory
            ));
            Ok(Some(q))
        }
        Err(e) => {
            log::error(format_args!(
                "device {dev} ({uuid}): {e}; CUDA is refused on it for now"
            ));
            Err(e)
        }
    }
}

/// Resolves every visible device now (from cuInit), so a limit that cannot be enforced fails CUDA's
/// start. Ledgers are opened (created in the environment mode) but no slot is taken: a process that only
/// asks whether CUDA works holds none. A device refused for good fails only the calls made on it.
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
        match for_device(d, config) {
            Err(Error::Unenforceable) if DEVICES[d as usize].load(Ordering::Acquire) == REFUSED => {
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// A read-only view of the quota of a GPU known to NVML, for processes that may never use CUDA. Found
/// from NVML alone: an NVML query never initialises CUDA.
pub struct UuidView {
    pub limit: u64,
    pub used: u64,
}

pub fn view_of(id: &Identity, config: ConfigFn) -> Result<Option<UuidView>, Error> {
    let cfg = config()?;
    let spec = match cfg.lookup(id.gpu()) {
        Lookup::Limit(s) => s,
        // A GPU the configuration cannot place has no quota to show; CUDA is refused on it anyway.
        Lookup::NoLimit | Lookup::Refuse(_) => return Ok(None),
    };
    // If this process already holds the quota, use it; otherwise read the ledger without a slot.
    if let Some(q) = attached_with_ledger(&spec.ledger) {
        return Ok(Some(UuidView {
            limit: q.limit(),
            used: q.used(),
        }));
    }
    let (limit, used) = if spec.ledger.exists() {
        match Ledger::open_readonly(&spec.ledger) {
            // Updated by the host since the file was loaded: its entry as it is now.
            Ok(l) => match cfg.limits_file().filter(|_| l.limits_generation() != 0) {
                Some(file) => (
                    crate::live::entry(file, &l, &spec.ledger)
                        .and_then(|(_, d)| d.settings.memory_limit)
                        .unwrap_or(spec.limit()),
                    l.used(),
                ),
                None => (spec.limit(), l.used()),
            },
            Err(e) => {
                log::error(format_args!("ledger {}: {e}", spec.ledger.display()));
                return Err(Error::Ledger(e.to_string()));
            }
        }
    } else {
        (spec.limit(), 0)
    };
    Ok(Some(UuidView { limit, used }))
}

fn attached_with_ledger(path: &std::path::Path) -> Option<&'static DeviceQuota> {
    quotas().find(|q| q.ledger_path() == path)
}

/// Every quota published in this process.
fn quotas() -> impl Iterator<Item = &'static DeviceQuota> {
    DEVICES
        .iter()
        .filter_map(|c| decode(c.load(Ordering::Acquire)).ok().flatten())
}

// ---- process life -------------------------------------------------------------------------------------

/// fork prepare: no slot may be half attached when the child is made.
pub(crate) fn lock_all() {
    quota::fork_prepare();
}

/// fork parent: attaches may go on.
pub(crate) fn unlock_all() {
    quota::fork_done();
}

/// fork child: the parent's slots are not ours. Forget them (without refunding; the child inherited no
/// descriptor or mapping of theirs, so nothing is closed); each quota attaches a fresh slot on its next
/// charge. Devices that failed are retried.
pub(crate) fn child_after_fork() {
    quota::fork_done();
    for q in quotas() {
        q.forget_slot_after_fork();
    }
    for c in &DEVICES {
        let _ = c.compare_exchange(FAILED, UNKNOWN, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// exit: detach our slots, refunding what this process still holds. `exiting()` is already set, so no
/// new hooked call reaches a quota; the quotas themselves stay allocated (a thread still inside a call
/// reads valid memory).
pub(crate) fn release_all() {
    for q in quotas() {
        q.release_slot();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    #[test]
    fn refused_and_failed_devices_refuse_and_unknown_ones_have_no_quota() {
        assert!(matches!(decode(UNKNOWN), Ok(None)));
        assert!(matches!(decode(UNLIMITED), Ok(None)));
        assert_eq!(decode(REFUSED).err(), Some(Error::Unenforceable));
        assert_eq!(decode(FAILED).err(), Some(Error::Unenforceable));
    }

    #[test]
    fn negative_ordinals_have_no_quota_and_ordinals_past_the_table_are_refused_under_a_limit() {
        let never = || -> Result<&'static Config, Error> { panic!("config must not be read") };
        assert!(matches!(for_device(-1, never), Ok(None)));
        fn limited() -> Result<&'static Config, Error> {
            static C: OnceLock<Config> = OnceLock::new();
            Ok(C.get_or_init(|| {
                let env = [("CUDA_DEVICE_MEMORY_LIMIT".to_string(), "1g".to_string())];
                Config::from_env(&env, std::path::Path::new("/nonexistent")).unwrap()
            }))
        }
        fn unlimited() -> Result<&'static Config, Error> {
            static C: Config = Config::Unlimited;
            Ok(&C)
        }
        assert_eq!(
            for_device(MAX_DEVICES as i32, limited).err(),
            Some(Error::Unenforceable),
            "never unlimited"
        );
        assert_eq!(for_device(1000, limited).err(), Some(Error::Unenforceable));
        assert!(matches!(
            for_device(MAX_DEVICES as i32, unlimited),
            Ok(None)
        ));
    }
}
