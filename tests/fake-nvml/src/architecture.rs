//! `nvmlDeviceGetArchitecture`: every fake GPU is a Hopper (`NVML_DEVICE_ARCH_HOPPER`, 9), as its name
//! ("NVIDIA H100 (fake, …)") and its compute capability (9.0) say.

use super::{guard, index, out, Device, Ret, R};
use std::ffi::c_uint;

/// nvml.h's `NVML_DEVICE_ARCH_HOPPER`.
const ARCH_HOPPER: c_uint = 9;

nvml_fn! {
fn nvmlDeviceGetArchitecture(dev: Device, arch: *mut c_uint) {
    index(dev)?;
    out(arch, ARCH_HOPPER)
}
}
