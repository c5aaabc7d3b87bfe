//! NVML: `nvmlDeviceGetMemoryInfo[_v2]` report the quota of the GPU (nvidia-smi resolves them through
//! dlsym); and the device's used memory, with which context creation is measured.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, CStr};
use std::sync::OnceLock;

use crate::ffi::*;
use crate::lifecycle::guard;
use crate::quota;
use crate::real::{real, Lib};
use crate::virt;

fn uuid_of(dev: nvmlDevice_t) -> Option<String> {
    let f = real!(
        Lib::Nvml,
        "nvmlDeviceGetUUID",
        unsafe extern "C" fn(nvmlDevice_t, *mut c_char, c_uint) -> nvmlReturn_t
    )?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: buf is writable for its length, which is passed.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML NUL-terminates within the length given.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// (limit, container usage) of an NVML device under a quota; Ok(None) without one.
fn quota_of(dev: nvmlDevice_t) -> Result<Option<quota::UuidView>, ()> {
    if quota::unlimited() {
        return Ok(None);
    }
    let Some(uuid) = uuid_of(dev) else {
        return Ok(None);
    };
    quota::view_by_uuid(&uuid)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        let Some(f) = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t
        ) else {
            return NVML_ERROR_UNINITIALIZED;
        };
        // SAFETY: arguments passed through unchanged.
        let r = unsafe { f(dev, mem) };
        if r != NVML_SUCCESS || mem.is_null() {
            return r;
        }
        // SAFETY: non-null, just filled by NVML.
        let m = unsafe { &mut *mem };
        virtualise(dev, r, &mut m.total, &mut m.free, &mut m.used)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        let Some(f) = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo_v2",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t
        ) else {
            return NVML_ERROR_UNINITIALIZED;
        };
        // SAFETY: arguments passed through unchanged.
        let r = unsafe { f(dev, mem) };
        if r != NVML_SUCCESS || mem.is_null() {
            return r;
        }
        // SAFETY: non-null, just filled by NVML.
        let m = unsafe { &mut *mem };
        let r = virtualise(dev, r, &mut m.total, &mut m.free, &mut m.used);
        // what is neither free nor used by the container is all the "reserved" the quota leaves room for
        let not_free = m.total.saturating_sub(m.free);
        m.reserved = m.reserved.min(not_free - m.used.min(not_free));
        r
    })
}

/// NVML's answer `r` for `dev`, with total/free/used replaced by the quota's view when the device has one
/// (both nvmlMemory_t versions).
fn virtualise(dev: nvmlDevice_t, r: nvmlReturn_t, total: &mut u64, free: &mut u64, used: &mut u64) -> nvmlReturn_t {
    match quota_of(dev) {
        Ok(Some(v)) => {
            (*total, *free, *used) = virt::nvml_info(v.limit, v.used, *free, *total);
            r
        }
        Ok(None) => r,
        Err(()) => NVML_ERROR_UNKNOWN,
    }
}

/// The whole device's used memory (all processes), for measuring a context; None without NVML.
pub fn device_used(uuid: &str) -> Option<u64> {
    static INIT: OnceLock<bool> = OnceLock::new();
    let ok = *INIT.get_or_init(|| {
        // SAFETY: plain NVML initialisation; reference counted by NVML.
        real!(
            Lib::Nvml,
            "nvmlInit_v2",
            unsafe extern "C" fn() -> nvmlReturn_t
        )
        .map(|f| unsafe { f() } == NVML_SUCCESS)
        .unwrap_or(false)
    });
    if !ok {
        return None;
    }
    let by_uuid = real!(
        Lib::Nvml,
        "nvmlDeviceGetHandleByUUID",
        unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t
    )?;
    let info = real!(
        Lib::Nvml,
        "nvmlDeviceGetMemoryInfo",
        unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t
    )?;
    let c = std::ffi::CString::new(uuid).ok()?;
    let mut dev: nvmlDevice_t = std::ptr::null_mut();
    let mut m = nvmlMemory_t::default();
    // SAFETY: valid C string and out-pointers.
    unsafe {
        if by_uuid(c.as_ptr(), &mut dev) != NVML_SUCCESS || info(dev, &mut m) != NVML_SUCCESS {
            return None;
        }
    }
    Some(m.used)
}
