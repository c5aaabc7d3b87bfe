//! Devices: enumeration (after CUDA_VISIBLE_DEVICES), names, UUIDs, memory size, attributes.

use crate::driver::*;
use crate::types::*;
use fake_gpu::config::{mig_devices, mig_uuid_bytes, pci_bus_id, uuid_bytes};
use std::ffi::{c_char, c_int, c_uint, CStr};

/// Name of a fake device, e.g. "NVIDIA H100 (fake, 16 GiB)".
pub fn device_name(total: u64) -> String {
    if total.is_multiple_of(1 << 30) {
        format!("NVIDIA H100 (fake, {} GiB)", total >> 30)
    } else {
        format!("NVIDIA H100 (fake, {} MiB)", total >> 20)
    }
}

/// Copies `s` into a C buffer of `len` bytes, truncating and NUL-terminating.
unsafe fn copy_cstr(buf: *mut c_char, len: c_int, s: &str) -> R {
    if buf.is_null() || len <= 0 {
        return Err(INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller gave a buffer of len bytes; we write n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// Values of the attributes a CUDA runtime or framework asks for; others read 0.
fn attribute(attr: c_int, phys: usize) -> Option<c_int> {
    Some(match attr {
        1..=3 => 1024,                                // max threads per block, block dim x/y
        4 => 64,                                      // block dim z
        5 => i32::MAX,                                // grid dim x
        6 | 7 => 65535,                               // grid dim y/z
        8 => 49152,                                   // shared memory per block
        9 => 65536,                                   // constant memory
        10 => 32,                                     // warp size
        11 => i32::MAX,                               // max pitch
        12 => 65536,                                  // registers per block
        13 => 1_980_000,                              // clock rate (kHz)
        14 => 512,                                    // texture alignment
        15 | 31 | 19 | 41 | 83 | 89 | 102 | 115 => 1, // gpu overlap, concurrent kernels, map host, UVA, managed, concurrent managed, VMM, pools
        16 => 132,                                    // multiprocessors
        33 => 0x18 + phys as c_int * 0x10,            // PCI bus id
        34 | 50 => 0,                                 // PCI device / domain id
        36 => 2_619_000,                              // memory clock (kHz)
        37 => 5120,                                   // memory bus width
        38 => 50 << 20,                               // L2 cache
        39 => 2048,                                   // threads per multiprocessor
        75 => 9,                                      // compute capability major
        76 => 0,                                      // compute capability minor
        81 => 233472,                                 // shared memory per multiprocessor
        82 => 65536,                                  // registers per multiprocessor
        97 => 232448,                                 // shared memory per block (opt-in)
        a if (0..200).contains(&a) => 0,
        _ => return None,
    })
}

/// The UUID CUDA reports: a MIG-enabled GPU (`FAKE_CUDA_MIG`) shows its MIG instance's.
fn cuda_uuid(phys: usize) -> [u8; 16] {
    if mig_devices().contains(&phys) {
        mig_uuid_bytes(phys)
    } else {
        uuid_bytes(phys)
    }
}

static UUID_V1_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

cu_fn! {
fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
    let d = drv()?;
    d.phys(ordinal)?;
    out(dev, ordinal)
}

fn cuDeviceGetCount(n: *mut c_int) {
    let d = drv()?;
    out(n, d.visible.len() as c_int)
}

fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    copy_cstr(name, len, &device_name(d.shared.total(phys)))
}

fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    out(bytes, d.shared.total(phys) as usize)
}

fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    out(bytes, d.shared.total(phys).min(u32::MAX as u64) as c_uint)
}

fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) {
    // The pre-11.4 entry point; counted so that it stays a function of its own (not folded into _v2).
    UUID_V1_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = drv()?;
    let phys = d.phys(dev)?;
    out(uuid, cuda_uuid(phys))
}

fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    out(uuid, cuda_uuid(phys))
}

fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    out(v, attribute(attr, phys).ok_or(INVALID_VALUE)?)
}

fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) {
    let d = drv()?;
    d.phys(dev)?;
    out(major, 9)?;
    out(minor, 0)
}

fn cuDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: CUdevice) {
    let d = drv()?;
    let phys = d.phys(dev)?;
    // CUDA prints a 4-digit domain: "0000:18:00.0".
    copy_cstr(buf, len, &pci_bus_id(phys)[4..])
}

fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, id: *const c_char) {
    let d = drv()?;
    if id.is_null() { return Err(INVALID_VALUE); }
    let want = CStr::from_ptr(id).to_string_lossy().to_ascii_uppercase();
    let want = want.trim_start_matches('0').to_string();
    let ord = d.visible.iter().position(|&p| pci_bus_id(p).trim_start_matches('0') == want).ok_or(INVALID_DEVICE)?;
    out(dev, ord as CUdevice)
}
}
