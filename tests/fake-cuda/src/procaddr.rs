//! `cuGetProcAddress`: resolves a driver function name, for a CUDA version and stream mode, to
//! the entry point that version of the API means (`cuMemAlloc` -> `cuMemAlloc_v2` from 3.2,
//! `_ptds`/`_ptsz` variants with the per-thread default stream flag), from our own table only.

use crate::types::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// (name, [(first CUDA version, entry point)], [(first CUDA version, per-thread-stream entry point)])
type Rule = (
    &'static str,
    &'static [(c_int, &'static str)],
    &'static [(c_int, &'static str)],
);

include!("procaddr_table.rs");

const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
const SUCCESS_FOUND: c_int = 0;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

fn symbols() -> &'static HashMap<&'static str, usize> {
    static S: OnceLock<HashMap<&'static str, usize>> = OnceLock::new();
    S.get_or_init(|| symbol_table().into_iter().collect())
}

/// The entry point for `name` at `version` with `flags`, or the query status on failure.
pub fn resolve(name: &str, version: c_int, flags: u64) -> Result<usize, c_int> {
    let (_, versions, ptds) = RULES.iter().find(|r| r.0 == name).ok_or(SYMBOL_NOT_FOUND)?;
    let mut sym = versions
        .iter()
        .rev()
        .find(|(v, _)| *v <= version)
        .ok_or(VERSION_NOT_SUFFICIENT)?
        .1;
    if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some((_, s)) = ptds.iter().rev().find(|(v, _)| *v <= version) {
            sym = s;
        }
    }
    symbols().get(sym).copied().ok_or(SYMBOL_NOT_FOUND)
}

/// `FAKE_CUDA_DLOPEN_RACE=<library>`: the first `cuGetProcAddress` starts a thread that `dlopen`s the
/// library and returns 200 ms later, while that thread is still inside `dlopen` (holding the loader's
/// lock) if the library's constructor takes longer. So a test can line up, every time, a constructor
/// that calls CUDA against a thread that is between the driver's answer and whatever the interposer does
/// with it (where a one-time lock held across `dlsym` deadlocks).
fn dlopen_race() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(lib) = std::env::var_os("FAKE_CUDA_DLOPEN_RACE") else {
            return;
        };
        let Ok(lib) =
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(lib.as_os_str()))
        else {
            return;
        };
        std::thread::spawn(move || {
            // SAFETY: a NUL-terminated path; the handle is kept for the life of the process.
            unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
    });
}

unsafe fn get(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> R {
    dlopen_race();
    if symbol.is_null() || pfn.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null C string from the caller.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let r = resolve(&name, version, flags);
    if !status.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *status = r.err().unwrap_or(SUCCESS_FOUND) };
    }
    match r {
        // SAFETY: pfn checked non-null above.
        Ok(p) => unsafe { out(pfn, p as *mut c_void) },
        Err(_) => {
            // SAFETY: checked non-null above.
            unsafe { *pfn = std::ptr::null_mut() };
            Err(NOT_FOUND)
        }
    }
}

cu_fn! {
fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    get(symbol, pfn, version, flags, std::ptr::null_mut())
}

fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
    get(symbol, pfn, version, flags, status)
}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(p: usize) -> &'static str {
        symbols()
            .iter()
            .find(|(_, &v)| v == p)
            .map(|(k, _)| *k)
            .unwrap()
    }

    #[test]
    fn every_rule_names_an_exported_symbol() {
        for (name, versions, ptds) in RULES {
            for (_, sym) in versions.iter().chain(ptds.iter()) {
                assert!(symbols().contains_key(sym), "{name}: {sym} is not exported");
            }
            assert!(
                versions.windows(2).all(|w| w[0].0 < w[1].0),
                "{name}: versions not ascending"
            );
        }
    }

    #[test]
    fn versions_and_ptds() {
        assert_eq!(
            name_of(resolve("cuMemAlloc", 13000, 0).unwrap()),
            "cuMemAlloc_v2"
        );
        assert_eq!(
            name_of(resolve("cuMemAlloc", 3010, 0).unwrap()),
            "cuMemAlloc"
        );
        assert_eq!(
            name_of(resolve("cuCtxCreate", 12000, 0).unwrap()),
            "cuCtxCreate_v3"
        );
        assert_eq!(
            name_of(resolve("cuCtxCreate", 13000, 0).unwrap()),
            "cuCtxCreate_v4"
        );
        assert_eq!(
            name_of(resolve("cuMemAllocAsync", 13000, 2).unwrap()),
            "cuMemAllocAsync_ptsz"
        );
        assert_eq!(
            name_of(resolve("cuMemcpyHtoD", 13000, 2).unwrap()),
            "cuMemcpyHtoD_v2_ptds"
        );
        assert_eq!(
            name_of(resolve("cuLaunchKernel", 13000, 1).unwrap()),
            "cuLaunchKernel"
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11000, 0),
            Err(VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(resolve("cuNoSuchThing", 13000, 0), Err(SYMBOL_NOT_FOUND));
        assert_eq!(resolve("cuMemAlloc_v2", 13000, 0), Err(SYMBOL_NOT_FOUND));
    }
}
