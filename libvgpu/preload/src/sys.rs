//! The few libc/libdl calls the front needs, declared by hand: the front has no std and no libc crate, so
//! that it stays a few pages (and on glibc < 2.34 dlopen, dladdr and dlvsym live in libdl).

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

#[link(name = "dl")]
extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlvsym(handle: *mut c_void, name: *const c_char, version: *const c_char) -> *mut c_void;
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    fn dlerror() -> *const c_char;
}

extern "C" {
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    #[link_name = "abort"]
    fn libc_abort() -> !;
}

pub fn abort() -> ! {
    // SAFETY: abort takes no arguments and never returns.
    unsafe { libc_abort() }
}

/// glibc's own dlsym (GLIBC_2.34 in libc, or the older libdl one), found once.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

pub fn real_dlsym_addr() -> usize {
    let cur = REAL_DLSYM.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    let old: &[u8] = if cfg!(target_arch = "aarch64") { b"GLIBC_2.17\0" } else { b"GLIBC_2.2.5\0" };
    for v in [&b"GLIBC_2.34\0"[..], old] {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated strings; dlvsym is not interposed by us.
        let p = unsafe { dlvsym(RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr().cast()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// `dlsym(handle, name)` through glibc's own dlsym; 0 when absent.
pub fn real_dlsym(handle: usize, name: *const c_char) -> usize {
    match real_dlsym_addr() {
        0 => 0,
        // SAFETY: f is glibc's dlsym; handle came from dlopen and name is NUL-terminated.
        f => unsafe { core::mem::transmute::<usize, DlsymFn>(f)(handle as *mut c_void, name) as usize },
    }
}

/// Writes into `buf` the path of the file `file` (NUL-terminated) in the folder of the object that
/// contains `addr`, returning it as a C string pointer; None if it does not fit.
pub fn sibling_path(addr: *const c_void, file: &[u8], buf: &mut [u8]) -> Option<*const c_char> {
    let mut info = DlInfo {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    // SAFETY: dladdr fills `info` for an address inside this object.
    if unsafe { dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the NUL-terminated path the loader opened this object by.
    let own = unsafe { cstr_bytes(info.dli_fname) };
    let dir_len = own.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let total = dir_len + file.len();
    if total > buf.len() {
        return None;
    }
    buf.get_mut(..dir_len)?.copy_from_slice(own.get(..dir_len)?);
    buf.get_mut(dir_len..total)?.copy_from_slice(file);
    Some(buf.as_ptr().cast())
}

/// The bytes of a NUL-terminated string, without the NUL.
///
/// # Safety
/// `s` is a valid NUL-terminated string that outlives the result.
unsafe fn cstr_bytes<'a>(s: *const c_char) -> &'a [u8] {
    let mut n = 0;
    // SAFETY: reads up to the terminating NUL.
    while unsafe { *s.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the n bytes before the NUL.
    unsafe { core::slice::from_raw_parts(s.cast(), n) }
}

/// dlopen(path, RTLD_NOW | RTLD_LOCAL); 0 on failure. Local: the engine's exports stay out of the global
/// scope, so they never shadow anything for the rest of the process.
pub fn dlopen_local(path: *const c_char) -> usize {
    // SAFETY: path is NUL-terminated (sibling_path).
    unsafe { dlopen(path, RTLD_NOW | RTLD_LOCAL) as usize }
}

/// One line on stderr: the engine is missing, so CUDA and NVML calls will fail.
pub fn report_missing_core(path: &[u8]) {
    let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
    // SAFETY: dlerror returns NULL or a NUL-terminated message owned by libdl.
    let err = unsafe {
        let e = dlerror();
        if e.is_null() { &b"not found"[..] } else { cstr_bytes(e) }
    };
    for part in [&b"vgpu: cannot load the quota engine "[..], path, b": ", err, b"; CUDA and NVML calls will fail\n"] {
        // SAFETY: writing a byte slice to stderr.
        unsafe { write(2, part.as_ptr().cast(), part.len()) };
    }
}
