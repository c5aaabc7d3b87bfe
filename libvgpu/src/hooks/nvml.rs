//! NVML views: `nvmlDeviceGetMemoryInfo[_v2]` report the quota of the GPU (nvidia-smi resolves them
//! through dlsym). Which quota a UUID has is `devices`'; the arithmetic is `virt`'s.
#![allow(clippy::missing_safety_doc)]

use crate::devices::{self, UuidView};
use crate::error::Error;
use crate::ffi::*;
use crate::guard::guard;
use crate::real_symbols::{real, Lib};
use crate::{identity, settings, virt};

/// (limit, container usage) of an NVML device under a quota; Ok(None) without one. From NVML alone: an
/// NVML query never initialises CUDA.
fn quota_of(dev: nvmlDevice_t) -> Result<Option<UuidView>, Error> {
    if settings::unlimited() {
        return Ok(None);
    }
    let Some(id) = identity::of_nvml_handle(dev) else {
        return Ok(None);
    };
    devices::view_of(&id, settings::config)
}

/// NVML's (total, free, used) with the quota's view in place when the device has one.
fn view(v: Option<UuidView>, total: &mut u64, free: &mut u64, used: &mut u64) {
    if let Some(v) = v {
        (*total, *free, *used) = virt::nvml_info(v.limit, v.used, *free, *total);
    }
}

/// What is neither free nor used by the container is all the "reserved" the quota leaves room for.
fn clamp_reserved(total: u64, free: u64, used: u64, reserved: u64) -> u64 {
    let not_free = total.saturating_sub(free);
    reserved.min(not_free - used.min(not_free))
}

/// The memory-info call of both `nvmlMemory_t` versions: NVML answers with `real` (None: no such entry
/// point), then `fields` gives (total, free, used, reserved if the version has it) of the filled struct.
fn memory_info<T>(
    dev: nvmlDevice_t,
    mem: *mut T,
    real: Option<unsafe extern "C" fn(nvmlDevice_t, *mut T) -> nvmlReturn_t>,
    fields: impl FnOnce(&mut T) -> (&mut u64, &mut u64, &mut u64, Option<&mut u64>),
) -> nvmlReturn_t {
    let Some(f) = real else {
        return NVML_ERROR_UNINITIALIZED;
    };
    // SAFETY: arguments passed through unchanged.
    let r = unsafe { f(dev, mem) };
    if r != NVML_SUCCESS || mem.is_null() {
        return r;
    }
    let v = match quota_of(dev) {
        Ok(v) => v,
        Err(e) => return e.nvml(),
    };
    // SAFETY: non-null, just filled by NVML.
    let (total, free, used, reserved) = fields(unsafe { &mut *mem });
    view(v, total, free, used);
    if let Some(reserved) = reserved {
        *reserved = clamp_reserved(*total, *free, *used, *reserved);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        let real = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t
        );
        memory_info(dev, mem, real, |m| {
            (&mut m.total, &mut m.free, &mut m.used, None)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(NVML_ERROR_UNKNOWN, || {
        let real = real!(
            Lib::Nvml,
            "nvmlDeviceGetMemoryInfo_v2",
            unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t
        );
        memory_info(dev, mem, real, |m| {
            (
                &mut m.total,
                &mut m.free,
                &mut m.used,
                Some(&mut m.reserved),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_replaces_the_device_and_no_quota_leaves_it() {
        let (mut t, mut f, mut u) = (80 << 30, 70 << 30, 10 << 30);
        view(None, &mut t, &mut f, &mut u);
        assert_eq!((t, f, u), (80 << 30, 70 << 30, 10 << 30));
        view(
            Some(UuidView {
                limit: 4 << 30,
                used: 1 << 30,
            }),
            &mut t,
            &mut f,
            &mut u,
        );
        assert_eq!((t, f, u), (4 << 30, 3 << 30, 1 << 30));
    }

    #[test]
    fn reserved_fits_in_what_is_neither_free_nor_used() {
        assert_eq!(clamp_reserved(4096, 3000, 1000, 500), 96);
        assert_eq!(clamp_reserved(4096, 4096, 0, 500), 0);
        assert_eq!(
            clamp_reserved(4096, 1000, 5000, 500),
            0,
            "usage past the total never underflows"
        );
        assert_eq!(clamp_reserved(4096, 0, 0, 500), 500);
    }
}
