//! Who a GPU is: a CUDA device's UUID, and through NVML (never through CUDA) a MIG instance's parent GPU
//! and a GPU's NVML index. Which quota that identity gets is `config`'s; caching it per ordinal is `devices`'.
//!
//! Every call here is a driver or NVML call made with no lock of ours held, and NVML is initialised
//! without a one-time lock (two threads may both call `nvmlInit_v2`; NVML counts references).

use std::ffi::{c_char, c_uint, CStr, CString};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::Gpu;
use crate::ffi::*;
use crate::real_symbols::{real, Lib};

/// A GPU as the configuration looks it up: its own UUID (`GPU-…`, or `MIG-…` for a MIG instance), the
/// parent GPU's UUID for a MIG instance, and the NVML index of the GPU (of the parent for MIG).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub uuid: String,
    pub parent: Option<String>,
    pub index: Option<u32>,
}

impl Identity {
    pub fn gpu(&self) -> Gpu<'_> {
        Gpu {
            uuid: &self.uuid,
            parent: self.parent.as_deref(),
            index: self.index,
        }
    }
}

/// 16 UUID bytes in NVML's spelling with the given prefix: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
pub fn format_uuid(prefix: &str, b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 16 UUID bytes CUDA reports for device `dev` (a MIG instance's own UUID on a MIG-enabled GPU).
pub fn cuda_uuid_bytes(dev: CUdevice) -> Option<[u8; 16]> {
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
    (unsafe { f(&mut u, dev) } == CUDA_SUCCESS).then_some(u.bytes)
}

/// The identity of CUDA device `dev`: None when the driver gives no UUID. NVML tells a MIG instance
/// (whose `MIG-` UUID NVML knows) from a GPU; without NVML the device is taken for a GPU without index.
pub fn of_cuda_device(dev: CUdevice) -> Option<Identity> {
    let bytes = cuda_uuid_bytes(dev)?;
    let gpu = format_uuid("GPU", &bytes);
    if let Some(h) = handle_by_uuid(&gpu) {
        return Some(of_nvml_handle(h).unwrap_or(Identity {
            uuid: gpu,
            ..Identity::default()
        }));
    }
    let mig = format_uuid("MIG", &bytes);
    if let Some(id) = handle_by_uuid(&mig).and_then(of_nvml_handle) {
        return Some(id);
    }
    Some(Identity {
        uuid: gpu,
        ..Identity::default()
    })
}

/// The identity of an NVML device handle (GPU or MIG instance), from NVML alone.
pub fn of_nvml_handle(h: nvmlDevice_t) -> Option<Identity> {
    let uuid = uuid_of(h)?;
    match mig_parent(h) {
        Some(p) => Some(Identity {
            uuid,
            parent: uuid_of(p),
            index: index_of(p),
        }),
        None => Some(Identity {
            index: index_of(h),
            uuid,
            parent: None,
        }),
    }
}

// ---- NVML --------------------------------------------------------------------------------------------

const NVML_UNKNOWN: u8 = 0;
const NVML_READY: u8 = 1;
const NVML_MISSING: u8 = 2;
static NVML_STATE: AtomicU8 = AtomicU8::new(NVML_UNKNOWN);

/// NVML initialised for the library's own queries (once it worked; retried while it fails for lack of
/// the library only once). No lock: concurrent first callers each call `nvmlInit_v2`, which NVML counts.
pub fn nvml_ready() -> bool {
    match NVML_STATE.load(Ordering::Acquire) {
        NVML_READY => return true,
        NVML_MISSING => return false,
        _ => {}
    }
    let Some(init) = real!(
        Lib::Nvml,
        "nvmlInit_v2",
        unsafe extern "C" fn() -> nvmlReturn_t
    ) else {
        NVML_STATE.store(NVML_MISSING, Ordering::Release);
        return false;
    };
    // SAFETY: plain NVML initialisation; reference counted by NVML, never shut down by us.
    let ok = unsafe { init() } == NVML_SUCCESS;
    if ok
        && NVML_STATE
            .compare_exchange(
                NVML_UNKNOWN,
                NVML_READY,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
    {
        // Another thread initialised too: give our reference back, keep one.
        if let Some(shutdown) = real!(
            Lib::Nvml,
            "nvmlShutdown",
            unsafe extern "C" fn() -> nvmlReturn_t
        ) {
            // SAFETY: balances the nvmlInit_v2 above.
            unsafe { shutdown() };
        }
    }
    ok
}

/// The NVML handle of the GPU or MIG instance with this UUID.
pub fn handle_by_uuid(uuid: &str) -> Option<nvmlDevice_t> {
    if !nvml_ready() {
        return None;
    }
    let f = real!(
        Lib::Nvml,
        "nvmlDeviceGetHandleByUUID",
        unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t
    )?;
    let c = CString::new(uuid).ok()?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: a valid C string and out-pointer.
    (unsafe { f(c.as_ptr(), &mut h) } == NVML_SUCCESS).then_some(h)
}

/// The UUID NVML prints for a handle.
pub fn uuid_of(h: nvmlDevice_t) -> Option<String> {
    let f = real!(
        Lib::Nvml,
        "nvmlDeviceGetUUID",
        unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t
    )?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: buf is writable for its length, which is passed.
    if unsafe { f(h, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the length given (the last byte stays 0 in any case).
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn index_of(h: nvmlDevice_t) -> Option<u32> {
    let f = real!(
        Lib::Nvml,
        "nvmlDeviceGetIndex",
        unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t
    )?;
    let mut i: c_uint = 0;
    // SAFETY: a valid out-pointer.
    (unsafe { f(h, &mut i) } == NVML_SUCCESS).then_some(i)
}

/// The parent GPU of a MIG instance handle; None for a GPU (or when NVML cannot tell).
fn mig_parent(h: nvmlDevice_t) -> Option<nvmlDevice_t> {
    let is_mig = real!(
        Lib::Nvml,
        "nvmlDeviceIsMigDeviceHandle",
        unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t
    )?;
    let parent = real!(
        Lib::Nvml,
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        unsafe extern "C" fn(nvmlDevice_t, *mut nvmlDevice_t) -> nvmlReturn_t
    )?;
    let mut m: c_uint = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { is_mig(h, &mut m) } != NVML_SUCCESS || m == 0 {
        return None;
    }
    let mut p: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; h is a MIG handle.
    (unsafe { parent(h, &mut p) } == NVML_SUCCESS).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_in_nvml_spelling() {
        let b: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
        assert_eq!(
            format_uuid("GPU", &b),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
        assert_eq!(
            format_uuid("MIG", &b),
            "MIG-00112233-4455-6677-8899-aabbccddeeff"
        );
    }
}
