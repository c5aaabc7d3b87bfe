//! Which devices the compute share throttles in this process: the configuration's shares (`config`, the
//! library's one settings model: the limits file's `compute_limit`, which inside a container is its only
//! source, or HAMi's `CUDA_DEVICE_SM_LIMIT` variables), looked at once on the first launch, and each
//! device's bucket (the container's ledger).

use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::Config;
use crate::error::Error;
use crate::ffi::CUdevice;
use crate::guard::exiting;
use crate::identity;
use crate::log;
use crate::quota::DeviceQuota;
use crate::settings;

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// True when no launch of this process is throttled: the hooks then forward at once.
#[inline]
pub fn off() -> bool {
    match STATE.load(Ordering::Relaxed) {
        OFF => true,
        ON => exiting(),
        _ => init() == OFF,
    }
}

/// Whether the configuration has shares, published once. A broken configuration refuses CUDA already.
#[cold]
fn init() -> u8 {
    let (s, env) = match settings::config() {
        Ok(c) if c.has_shares() => (ON, c),
        _ => return publish(OFF),
    };
    // The environment's shares are said once, by the thread that publishes them.
    if STATE.compare_exchange(UNKNOWN, s, Ordering::Relaxed, Ordering::Relaxed) == Ok(UNKNOWN) {
        if let Config::Env {
            compute: Some(c), ..
        } = env
        {
            log::info(format_args!(
                "compute share: {:?}, window {} ms",
                c.shares, c.window_ms
            ));
        }
    }
    s
}

fn publish(s: u8) -> u8 {
    STATE.store(s, Ordering::Relaxed);
    s
}

/// The UUID of device `dev` when a share applies to it (None without one): asked where no share is made
/// yet (a context's creation learns this process's PID in NVML's lists for the share's floor).
pub fn shared_uuid(dev: CUdevice) -> Option<String> {
    let cfg = settings::config().ok().filter(|c| c.has_shares())?;
    let id = identity::of_cuda_device(dev)?;
    cfg.share(id.gpu())?.share()?;
    Some(id.uuid)
}

/// A device's share: its bucket's quota (the container's ledger), its request and limit (percent) and its
/// window (ms).
pub type Resolved = (DeviceQuota, (u32, u32), u32);

/// The share of device `dev` (`Resolved`); None when
/// the device has no share; Err (logged) when it has one that cannot be enforced.
pub fn resolve(dev: CUdevice) -> Result<Option<Resolved>, Error> {
    let cfg = match settings::config() {
        Ok(c) if c.has_shares() => c,
        _ => return Ok(None),
    };
    let Some(id) = identity::of_cuda_device(dev) else {
        log::error(format_args!(
            "compute share: cannot read the UUID of CUDA device {dev}; launches on it are refused"
        ));
        return Err(Error::NoUuid);
    };
    let Some(spec) = cfg.share(id.gpu()) else {
        return Ok(None);
    };
    let Some(((request, limit), window_ms)) = spec.share() else {
        return Ok(None);
    };
    match DeviceQuota::open_unattached(dev, &id.uuid, 0, &spec.ledger, cfg.ledger_mode()) {
        Ok(q) => {
            // The share's rate and window follow the host's updates of the file (`compute`); the
            // environment mode has no file, which no host updates.
            if let Some(file) = cfg.limits_file() {
                q.follow(file);
            }
            log::info(format_args!(
                "device {dev} ({}): compute share {}, window {window_ms} ms, bucket in {}",
                id.uuid,
                described(request, limit),
                spec.ledger.display()
            ));
            Ok(Some((q, (request, limit), window_ms)))
        }
        Err(e) => {
            log::error(format_args!(
                "device {dev} ({}): compute share {}: {e}; launches on it are refused",
                id.uuid,
                described(request, limit)
            ));
            Err(e)
        }
    }
}

/// A share as the log says it: its limit (`30%`), with its request when it lends (`30% (request 10%)`).
fn described(request: u32, limit: u32) -> String {
    if request < limit {
        format!("{limit}% (request {request}%)")
    } else {
        format!("{limit}%")
    }
}
