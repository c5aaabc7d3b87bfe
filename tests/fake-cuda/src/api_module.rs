//! Modules (each takes FAKE_CUDA_MODULE_BYTES of device memory) and their functions. Libraries, loaded
//! into contexts as modules, live in `api_library`; launches in `api_launch`.

use crate::driver::*;
use crate::types::*;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// Reads a module image: PTX text (must look like PTX) or a binary (ELF cubin or fatbin).
pub unsafe fn image(p: *const c_void) -> Result<Option<String>, CUresult> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: the caller passes an image; the first 4 bytes of any image are readable.
    let head = unsafe { std::slice::from_raw_parts(p as *const u8, 4) };
    if head == b"\x7fELF" || head == [0x50, 0xed, 0x55, 0xba] || head == [0x46, 0x62, 0x43, 0x46] {
        return Ok(None);
    }
    // SAFETY: not a binary image, so it is NUL-terminated PTX text.
    let text = unsafe { CStr::from_ptr(p as *const c_char) }
        .to_string_lossy()
        .into_owned();
    if !text.contains(".version") || !text.contains(".target") {
        return Err(INVALID_IMAGE);
    }
    Ok(Some(text))
}

/// Does the PTX declare kernel `name` (`.entry name`)?
pub fn has_entry(ptx: &str, name: &str) -> bool {
    ptx.match_indices(".entry").any(|(i, _)| {
        let rest = ptx[i + 6..].trim_start();
        rest.strip_prefix(name)
            .is_some_and(|r| r.starts_with(|c: char| c == '(' || c.is_whitespace()))
    })
}

pub fn load(d: &Driver, m: *mut Handle, ptx: Option<String>) -> R {
    if m.is_null() {
        return Err(INVALID_VALUE);
    }
    let (ctx, _, phys) = current(d)?;
    d.charge(phys, d.module_bytes)?;
    let h = new_handle();
    lock(&d.objs).modules.insert(
        h,
        Module {
            phys,
            ctx,
            ptx,
            charged: d.module_bytes,
        },
    );
    // SAFETY: checked non-null above.
    unsafe { out(m, h) }
}

pub fn unload(d: &Driver, h: Handle) -> R {
    let mut objs = lock(&d.objs);
    let m = objs.modules.remove(&h).ok_or(INVALID_HANDLE)?;
    objs.functions.retain(|_, owner| *owner != h);
    d.refund(m.phys, m.charged);
    Ok(())
}

pub fn get_function(d: &Driver, f: *mut Handle, m: Handle, name: *const c_char) -> R {
    if f.is_null() || name.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null C string from the caller.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let mut objs = lock(&d.objs);
    let module = objs.modules.get(&m).ok_or(INVALID_HANDLE)?;
    if let Some(ptx) = &module.ptx {
        if !has_entry(ptx, &name) {
            return Err(NOT_FOUND);
        }
    }
    let h = new_handle();
    objs.functions.insert(h, m);
    // SAFETY: checked non-null above.
    unsafe { out(f, h) }
}

/// A function's (or a library kernel's) attribute `attr`; 3, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, is the
/// local memory per thread every kernel needs (FAKE_CUDA_KERNEL_STACK).
pub fn func_attribute(d: &Driver, attr: c_int) -> c_int {
    match attr {
        0 => 1024,
        3 => d.kernel_stack as c_int,
        4 => 32,
        5 | 6 => 90,
        _ => 0,
    }
}

cu_fn! {
fn cuModuleLoadData(m: *mut Handle, img: *const c_void) {
    let d = drv()?;
    load(d, m, image(img)?)
}

fn cuModuleLoadDataEx(m: *mut Handle, img: *const c_void, _n: c_uint, _opts: *mut c_int, _vals: *mut *mut c_void) {
    let d = drv()?;
    load(d, m, image(img)?)
}

fn cuModuleLoadFatBinary(m: *mut Handle, img: *const c_void) {
    let d = drv()?;
    load(d, m, image(img)?)
}

fn cuModuleLoad(m: *mut Handle, path: *const c_char) {
    let d = drv()?;
    if path.is_null() { return Err(INVALID_VALUE); }
    let path = CStr::from_ptr(path).to_string_lossy().into_owned();
    let mut bytes = std::fs::read(&path).map_err(|_| FILE_NOT_FOUND)?;
    bytes.extend_from_slice(&[0, 0, 0, 0]);
    load(d, m, image(bytes.as_ptr() as *const c_void)?)
}

fn cuModuleUnload(m: Handle) { unload(drv()?, m) }

fn cuModuleGetFunction(f: *mut Handle, m: Handle, name: *const c_char) { get_function(drv()?, f, m, name) }

fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: Handle) {
    let d = drv()?;
    if !lock(&d.objs).functions.contains_key(&f) { return Err(INVALID_HANDLE); }
    out(v, func_attribute(d, attr))
}

fn cuFuncSetAttribute(f: Handle, _attr: c_int, _v: c_int) {
    let d = drv()?;
    if lock(&d.objs).functions.contains_key(&f) { Ok(()) } else { Err(INVALID_HANDLE) }
}

fn cuModuleGetGlobal_v2(_dptr: *mut u64, _bytes: *mut usize, m: Handle, _name: *const c_char) {
    // Globals are not modelled: a module has none.
    let d = drv()?;
    if lock(&d.objs).modules.contains_key(&m) { Err(NOT_FOUND) } else { Err(INVALID_HANDLE) }
}

fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: Handle, block: c_int, _shmem: usize) {
    let d = drv()?;
    if !lock(&d.objs).functions.contains_key(&f) { return Err(INVALID_HANDLE); }
    if block <= 0 || block > 1024 { return Err(INVALID_VALUE); }
    out(n, 2048 / block)
}

}

#[cfg(test)]
mod tests {
    #[test]
    fn entries() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry fill(\n.param .u64 p)\n{ ret; }";
        assert!(super::has_entry(ptx, "fill"));
        assert!(!super::has_entry(ptx, "fil"));
        assert!(!super::has_entry(ptx, "other"));
    }
}
