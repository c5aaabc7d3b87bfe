//! Which devices the compute share throttles in this process: the settings (the limits file's
//! `compute_limit`, which inside a container is its only source, or HAMi's `CUDA_DEVICE_SM_LIMIT`
//! variables), read once on the first launch, and each device's bucket (the container's ledger).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use vgpu_ledger::envcompute::EnvCompute;

use crate::config::{env_ledger_path, env_prefix, Config, LedgerMode};
use crate::error::Error;
use crate::ffi::CUdevice;
use crate::guard::exiting;
use crate::identity;
use crate::log;
use crate::quota::DeviceQuota;
use crate::settings;

/// Where the shares come from.
enum Settings {
    /// No share anywhere, or `GPU_CORE_UTILIZATION_POLICY=disable`.
    Off,
    /// The limits file (`compute_limit` per GPU): inside a container its only source, so the tenant's
    /// own variables neither lift nor add a share.
    File(&'static Config),
    /// HAMi's variables; ledgers `<prefix>.<uuid>` like the memory quota's.
    Env {
        env: EnvCompute,
        prefix: String,
        dir: Option<PathBuf>,
        window_ms: u32,
    },
}

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// True when no launch of this process is throttled: the hooks then forward at once.
#[inline]
pub fn off() -> bool {
    match STATE.load(Ordering::Relaxed) {
        OFF => true,
        ON => exiting(),
        _ => init() == OFF,
    }
}

/// Loads the settings once, with no lock held while reading (see `settings::config` for why), and
/// publishes them.
#[cold]
fn init() -> u8 {
    if SETTINGS.get().is_none() {
        let _ = SETTINGS.set(load());
    }
    let s = match SETTINGS.get() {
        Some(Settings::Env { .. } | Settings::File(_)) => ON,
        _ => OFF,
    };
    STATE.store(s, Ordering::Relaxed);
    s
}

fn load() -> Settings {
    // A limits file is the only source where there is one (inside a container the mounted file; the
    // environment's shares are then not read at all); a broken configuration refuses CUDA already.
    match settings::config() {
        Ok(c @ Config::File { .. }) if c.file_has_shares() => return Settings::File(c),
        Ok(Config::File { .. }) | Err(_) => return Settings::Off,
        Ok(_) => {}
    }
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| {
            k.starts_with(vgpu_ledger::envcompute::SM_LIMIT_VAR)
                || k == vgpu_ledger::envcompute::POLICY_VAR
                || k == vgpu_ledger::envcompute::WINDOW_VAR
                || k.starts_with("CUDA_DEVICE_MEMORY_")
                || k == "XDG_RUNTIME_DIR"
        })
        .collect();
    // Malformed values were refused with the configuration (`Config::from_env`).
    let Ok(env) = EnvCompute::parse(&vars) else {
        return Settings::Off;
    };
    if env.is_unlimited() {
        return Settings::Off;
    }
    let Ok(window_ms) = crate::config::env_window_ms(&vars) else {
        return Settings::Off;
    };
    let (prefix, dir) = env_prefix(&vars);
    log::info(format_args!(
        "compute share: {env:?}, window {window_ms} ms"
    ));
    Settings::Env {
        env,
        prefix,
        dir,
        window_ms,
    }
}

/// The share of device `dev`: its bucket's quota (the container's ledger), percent and window; None when
/// the device has no share; Err (logged) when it has one that cannot be enforced.
pub fn resolve(dev: CUdevice) -> Result<Option<(DeviceQuota, u32, u32)>, Error> {
    let settings = match SETTINGS.get() {
        Some(s @ (Settings::Env { .. } | Settings::File(_))) => s,
        _ => return Ok(None),
    };
    let Some(id) = identity::of_cuda_device(dev) else {
        log::error(format_args!(
            "compute share: cannot read the UUID of CUDA device {dev}; launches on it are refused"
        ));
        return Err(Error::NoUuid);
    };
    let (pct, path, mode, window_ms) = match settings {
        Settings::File(cfg) => {
            let Some((pct, path, window_ms)) = cfg.file_share(id.gpu()) else {
                return Ok(None);
            };
            (pct, path, cfg.ledger_mode(), window_ms)
        }
        Settings::Env {
            env,
            prefix,
            dir,
            window_ms,
        } => {
            let Some(pct) = env.share_for(id.index) else {
                return Ok(None);
            };
            let mode = LedgerMode::Env {
                dir: dir.as_deref(),
            };
            (pct, env_ledger_path(prefix, &id.uuid), mode, *window_ms)
        }
        Settings::Off => return Ok(None),
    };
    match DeviceQuota::open_unattached(dev, &id.uuid, 0, &path, mode) {
        Ok(q) => {
            // The share's rate and window follow the host's updates of the file (`compute`).
            if let Some(file) = cfg_file(settings) {
                q.follow(file);
            }
            log::info(format_args!(
                "device {dev} ({}): compute share {pct}%, window {window_ms} ms, bucket in {}",
                id.uuid,
                path.display()
            ));
            Ok(Some((q, pct, window_ms)))
        }
        Err(e) => {
            log::error(format_args!(
                "device {dev} ({}): compute share {pct}%: {e}; launches on it are refused",
                id.uuid
            ));
            Err(e)
        }
    }
}

/// The limits file the shares come from (none in the environment mode, which no host updates).
fn cfg_file(settings: &Settings) -> Option<&'static std::path::Path> {
    match settings {
        Settings::File(cfg) => cfg.limits_file(),
        _ => None,
    }
}
