//! The real driver and NVML, reached without ever going through our own exported symbols: symbol
//! lookup (`real!`) and plain forwarding (`forward!`). What is charged for a call lives in `hooks`.
//!
//! `dlsym` is exported by the preload front, so every lookup made here goes through the real one found
//! with `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`. The fake driver and the real libcuda bind their own
//! symbols locally, so a real pointer obtained here never leads back into us.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const libc::c_char) -> *mut c_void;

/// Where the real `dlsym` lives; read by the `dlsym` trampoline as a plain word.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// The real `dlsym`, found once. glibc ≥ 2.34 versions it GLIBC_2.34, older ones GLIBC_2.2.5 (x86-64) or
/// GLIBC_2.17 (aarch64); in glibc < 2.34 it lives in libdl, which this library links.
pub fn real_dlsym_addr() -> usize {
    let cur = REAL_DLSYM.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    let versions: &[&CStr] = if cfg!(target_arch = "aarch64") {
        &[c"GLIBC_2.34", c"GLIBC_2.17"]
    } else {
        &[c"GLIBC_2.34", c"GLIBC_2.2.5"]
    };
    for v in versions {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; it is not interposed by us.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// Calls the real `dlsym` (lookups relative to this library for RTLD_NEXT).
pub fn real_dlsym(handle: *mut c_void, name: *const libc::c_char) -> *mut c_void {
    let f = real_dlsym_addr();
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: f is glibc's dlsym; name is NUL-terminated by every caller.
    unsafe { std::mem::transmute::<usize, DlsymFn>(f)(handle, name) }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Cuda,
    Nvml,
}

static HANDLES: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
const MISSING: usize = usize::MAX;

fn soname(lib: Lib) -> &'static CStr {
    match lib {
        Lib::Cuda => c"libcuda.so.1",
        Lib::Nvml => c"libnvidia-ml.so.1",
    }
}

/// Is the real library in the process already (without loading it)?
pub fn is_loaded(lib: Lib) -> bool {
    if !matches!(HANDLES[lib as usize].load(Ordering::Acquire), 0 | MISSING) {
        return true;
    }
    // SAFETY: RTLD_NOLOAD only looks the soname up; the reference it may take is dropped at once.
    unsafe {
        let h = libc::dlopen(soname(lib).as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// The handle of the real library, loaded on first use (an already loaded copy is shared).
pub fn handle(lib: Lib) -> Option<*mut c_void> {
    let slot = &HANDLES[lib as usize];
    match slot.load(Ordering::Acquire) {
        0 => {}
        MISSING => return None,
        h => return Some(h as *mut c_void),
    }
    let name = soname(lib);
    // SAFETY: dlopen of a soname; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        slot.store(MISSING, Ordering::Release);
        crate::log::debug(format_args!("cannot load {}", name.to_string_lossy()));
        return None;
    }
    slot.store(h as usize, Ordering::Release);
    Some(h)
}

/// The address of `name` in the real library, cached in `cache` (0 unknown, MISSING absent).
#[inline]
pub fn resolve_cached(cache: &AtomicUsize, lib: Lib, name: &CStr) -> usize {
    match cache.load(Ordering::Relaxed) {
        0 => {}
        MISSING => return 0,
        p => return p,
    }
    let p = match handle(lib) {
        Some(h) => real_dlsym(h, name.as_ptr()) as usize,
        None => 0,
    };
    cache.store(if p == 0 { MISSING } else { p }, Ordering::Relaxed);
    p
}

/// The address of `name` in the real library, without caching (used to build the hook tables).
pub fn lookup(lib: Lib, name: &CStr) -> usize {
    match handle(lib) {
        Some(h) => real_dlsym(h, name.as_ptr()) as usize,
        None => 0,
    }
}

/// `real!(Lib::Cuda, "cuMemAlloc_v2", unsafe extern "C" fn(...) -> CUresult)`: the real function or None.
macro_rules! real {
    ($lib:expr, $name:literal, $ty:ty) => {{
        static CACHE: ::std::sync::atomic::AtomicUsize = ::std::sync::atomic::AtomicUsize::new(0);
        const NAME: &::std::ffi::CStr = match ::std::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
            Ok(c) => c,
            Err(_) => panic!("symbol name"),
        };
        let p = $crate::real_symbols::resolve_cached(&CACHE, $lib, NAME);
        if p == 0 {
            None
        } else {
            // SAFETY: p is the driver's own symbol of this name, whose C signature is $ty (cuda.h / nvml.h).
            Some(unsafe { ::std::mem::transmute::<usize, $ty>(p) })
        }
    }};
}
pub(crate) use real;

/// Calls the real driver function `$name` with the given arguments:
/// `forward!("cuMemFree_v2", fn(CUdeviceptr), p)`. CUDA_ERROR_NOT_FOUND when the driver lacks it.
macro_rules! forward {
    ($name:literal, fn($($t:ty),*) $(, $a:expr)*) => {
        match $crate::real_symbols::real!(
            $crate::real_symbols::Lib::Cuda,
            $name,
            unsafe extern "C" fn($($t),*) -> $crate::ffi::CUresult
        ) {
            // SAFETY: the arguments go unchanged to the driver's own function of the same C type.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::ffi::CUDA_ERROR_NOT_FOUND,
        }
    };
}
pub(crate) use forward;
