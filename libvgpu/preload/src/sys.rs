//! The few libc calls the front needs, declared by hand (no std, no libc crate: the front stays a few
//! pages), and the dl functions, found at first use through `libdl`.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::libdl;

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

extern "C" {
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    #[link_name = "abort"]
    fn libc_abort() -> !;
}

pub fn abort() -> ! {
    // SAFETY: abort takes no arguments and never returns.
    unsafe { libc_abort() }
}

// dlsym and dladdr exist since GLIBC_2.2.5 (x86-64) / GLIBC_2.17 (aarch64) and moved into libc as
// GLIBC_2.34; ask for the new one first.
#[cfg(target_arch = "aarch64")]
const DL_VERSIONS: [&[u8]; 2] = [b"GLIBC_2.34\0", b"GLIBC_2.17\0"];
#[cfg(not(target_arch = "aarch64"))]
const DL_VERSIONS: [&[u8]; 2] = [b"GLIBC_2.34\0", b"GLIBC_2.2.5\0"];

/// A dl function by name, cached in `slot`.
fn dl(slot: &AtomicUsize, name: &[u8]) -> usize {
    let cur = slot.load(Ordering::Acquire);
    if cur != 0 {
        return cur;
    }
    let p = libdl::next_symbol(name, &DL_VERSIONS);
    slot.store(p, Ordering::Release);
    p
}

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static DLOPEN: AtomicUsize = AtomicUsize::new(0);
static DLADDR: AtomicUsize = AtomicUsize::new(0);
static DLERROR: AtomicUsize = AtomicUsize::new(0);

/// glibc's own dlsym, found once; 0 if it cannot be found.
pub fn real_dlsym_addr() -> usize {
    dl(&REAL_DLSYM, b"dlsym\0")
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// `dlsym(handle, name)` through glibc's own dlsym; 0 when absent.
pub fn real_dlsym(handle: usize, name: *const c_char) -> usize {
    match real_dlsym_addr() {
        0 => 0,
        // SAFETY: f is glibc's dlsym; handle came from dlopen and name is NUL-terminated.
        f => unsafe {
            core::mem::transmute::<usize, DlsymFn>(f)(handle as *mut c_void, name) as usize
        },
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
    let dladdr = dl(&DLADDR, b"dladdr\0");
    if dladdr == 0 {
        return None;
    }
    type DladdrFn = unsafe extern "C" fn(*const c_void, *mut DlInfo) -> c_int;
    // SAFETY: glibc's dladdr fills `info` for an address inside this object.
    if unsafe { core::mem::transmute::<usize, DladdrFn>(dladdr)(addr, &mut info) } == 0
        || info.dli_fname.is_null()
    {
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

/// dlopen(path, RTLD_NOW | RTLD_LOCAL); 0 on failure. Local: the core's exports stay out of the global
/// scope, so they never shadow anything for the rest of the process.
pub fn dlopen_local(path: *const c_char) -> usize {
    let dlopen = dl(&DLOPEN, b"dlopen\0");
    if dlopen == 0 {
        return 0;
    }
    type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    // SAFETY: glibc's dlopen; path is NUL-terminated (sibling_path).
    unsafe { core::mem::transmute::<usize, DlopenFn>(dlopen)(path, RTLD_NOW | RTLD_LOCAL) as usize }
}

/// dlopen of an engine held in memory (`image`): written into a memfd and opened as /proc/self/fd/N
/// (the descriptor closed at once; the mapping stays). 0 when the kernel has no memfd_create (before 3.17),
/// a seccomp profile refuses it, /proc is not mounted or the loader refuses the image.
#[cfg(feature = "embedded-engine")]
pub fn dlopen_image(image: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    const SYS_MEMFD_CREATE: core::ffi::c_long = 319;
    #[cfg(target_arch = "aarch64")]
    const SYS_MEMFD_CREATE: core::ffi::c_long = 279;
    const MFD_CLOEXEC: core::ffi::c_uint = 1;
    extern "C" {
        fn syscall(n: core::ffi::c_long, ...) -> core::ffi::c_long;
        fn close(fd: c_int) -> c_int;
    }
    // SAFETY: memfd_create(name, flags) with a NUL-terminated name; glibc's syscall() exists since long
    // before the 2.17 floor, its memfd_create wrapper (2.27) does not.
    let fd = unsafe { syscall(SYS_MEMFD_CREATE, c"libvgpu_core.so".as_ptr(), MFD_CLOEXEC) };
    if fd < 0 || fd > c_int::MAX as core::ffi::c_long {
        return 0;
    }
    let fd = fd as c_int;
    let mut off = 0;
    while off < image.len() {
        let rest = &image[off..];
        // SAFETY: writes the initialised bytes of `rest` to the memfd just created.
        let n = unsafe { write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            // SAFETY: closes the descriptor this function opened.
            unsafe { close(fd) };
            return 0;
        }
        off += n as usize;
    }
    // "/proc/self/fd/<fd>\0"
    let mut path = [0u8; 32];
    let prefix = b"/proc/self/fd/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let (mut v, mut k) = (fd as u32, 0);
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for (i, d) in digits[..k].iter().rev().enumerate() {
        path[prefix.len() + i] = *d;
    }
    let h = dlopen_local(path.as_ptr().cast());
    // SAFETY: closes the descriptor this function opened; the loader keeps its own mapping.
    unsafe { close(fd) };
    h
}

/// One line on stderr: the core is missing, so CUDA and NVML calls will fail.
pub fn report_missing_core(path: &[u8]) {
    let path = &path[..path.iter().position(|&b| b == 0).unwrap_or(path.len())];
    type DlerrorFn = unsafe extern "C" fn() -> *const c_char;
    let err = match dl(&DLERROR, b"dlerror\0") {
        0 => &b"glibc's dl functions not found"[..],
        // SAFETY: glibc's dlerror returns NULL or a NUL-terminated message it owns.
        f => unsafe {
            let e = core::mem::transmute::<usize, DlerrorFn>(f)();
            if e.is_null() {
                &b"not found"[..]
            } else {
                cstr_bytes(e)
            }
        },
    };
    // One write(2): in parts, another thread's or the program's own output came between them.
    let mut line = [0u8; 1024];
    let mut n = 0;
    for part in [
        &b"vgpu: cannot load the quota engine "[..],
        path,
        b": ",
        err,
    ] {
        let take = part.len().min(line.len() - TAIL.len() - n);
        line[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    line[n..n + TAIL.len()].copy_from_slice(TAIL);
    n += TAIL.len();
    // SAFETY: writing `n` initialised bytes of a local buffer to stderr.
    unsafe { write(2, line.as_ptr().cast(), n) };
}

const TAIL: &[u8] = b"; CUDA and NVML calls will fail\n";
