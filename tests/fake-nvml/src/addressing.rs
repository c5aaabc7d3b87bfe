//! `nvmlDeviceGetAddressingMode` (nvml.h, r575+): whether HMM or ATS lets a GPU's kernels reach pageable
//! host memory, as `FAKE_NVML_ADDRESSING_MODE` says — `none` (the default, what the H100 this project
//! runs on reports), `hmm`, `ats` or `unsupported` (`NVML_ERROR_NOT_SUPPORTED`), or a comma-separated list
//! of those, one per physical GPU (the last repeated for the rest).

use super::{guard, index, out, Device, Ret, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT, R};
use std::ffi::c_uint;

const NOT_SUPPORTED: Ret = 3;

/// `nvmlDeviceAddressingMode_v1_t`.
#[repr(C)]
pub struct AddressingMode {
    version: c_uint,
    value: c_uint,
}

/// `nvmlDeviceAddressingMode_v1`: the struct's size, the version in the high byte.
const ADDRESSING_MODE_V1: c_uint = std::mem::size_of::<AddressingMode>() as c_uint | (1 << 24);

/// GPU `i`'s mode (0 none, 1 HMM, 2 ATS) from `FAKE_NVML_ADDRESSING_MODE`.
fn mode(i: usize) -> Result<c_uint, Ret> {
    let v = std::env::var("FAKE_NVML_ADDRESSING_MODE").unwrap_or_default();
    let list: Vec<&str> = v.split(',').map(str::trim).collect();
    match list.get(i).or(list.last()).copied().unwrap_or("") {
        "" | "none" => Ok(0),
        "hmm" => Ok(1),
        "ats" => Ok(2),
        "unsupported" => Err(NOT_SUPPORTED),
        other => {
            eprintln!("fake-nvml: FAKE_NVML_ADDRESSING_MODE: unknown mode {other:?}");
            Err(INVALID_ARGUMENT)
        }
    }
}

nvml_fn! {
fn nvmlDeviceGetAddressingMode(dev: Device, m: *mut AddressingMode) {
    let i = index(dev)?;
    if m.is_null() { return Err(INVALID_ARGUMENT); }
    if (*m).version != ADDRESSING_MODE_V1 { return Err(ARGUMENT_VERSION_MISMATCH); }
    out(&mut (*m).value, mode(i)?)
}
}
