//! libvgpu.so, the preload front.
//!
//! `/etc/ld.so.preload` loads this object into every process of a container, `ls` and `bash` included, so
//! it must cost next to nothing at load: no std, no constructor, a few relocations. It exports the same
//! entry points as the core (`libvgpu_core.so`, the `libvgpu` crate beside this folder) and forwards
//! each of them there; the core is loaded from the folder this object was loaded from, on the first
//! CUDA or NVML call, never before. A process that never touches CUDA never loads it.
//!
//! - Driver and NVML entry points (`cuMemAlloc_v2`, ...) are trampolines: a jump through a per-symbol slot,
//!   filled on the first call with the core's function of the same name.
//! - `dlsym` is a tail-calling trampoline: names that are not CUDA or NVML go straight to glibc's dlsym
//!   with the caller's return address intact (so RTLD_NEXT keeps meaning "after the caller"); CUDA and NVML
//!   names are routed by the core's `vgpu_dlsym_route`.
//! - If the core cannot be loaded, one line goes to stderr and every hooked entry point fails
//!   (CUDA_ERROR_NOT_INITIALIZED, NVML_ERROR_UNINITIALIZED): a quota that cannot be enforced must not
//!   silently become no quota.
#![no_std]
#![allow(non_snake_case)]

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

mod libdl;
mod sys;

/// The core's file name; it lives in the same folder as this object.
const CORE_FILE: &[u8] = b"libvgpu_core.so\0";

/// libvgpu-single.so's engine: the bytes of libvgpu_core.so, built with it (build.rs), loaded through a
/// memfd when the folder holds none. File-backed and never touched otherwise, it costs a process that
/// does not need it no memory; one that loads it keeps a private copy (the engine's size) in its memfd.
#[cfg(feature = "embedded-engine")]
static EMBEDDED_ENGINE: &[u8] = include_bytes!(env!("VGPU_EMBEDDED_ENGINE"));

#[derive(Clone, Copy)]
enum Family {
    Cuda,
    Nvml,
}

/// Declares the forwarded entry points: one trampoline each, their names and families.
macro_rules! entry_points {
    ($($family:ident: $($name:ident)*;)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(usize)]
        enum Ix { $($($name,)*)* COUNT }
        const N: usize = Ix::COUNT as usize;
        const LIST: [&str; N] = [$($(stringify!($name),)*)*];
        // (`$name` only drives the repetition: one family entry per name)
        static FAMILIES: [Family; N] = [$($({ let _ = stringify!($name); Family::$family },)*)*];
        $($(trampoline!($name, Ix::$name as usize);)*)*
    };
}

// The names, NUL-terminated, in one byte string indexed by offset: a table of string pointers would cost a
// load-time relocation per entry in every process.
const NAMES_LEN: usize = {
    let mut total = 0;
    let mut i = 0;
    while i < N {
        total += LIST[i].len() + 1;
        i += 1;
    }
    total
};
static NAME_BYTES: [u8; NAMES_LEN] = {
    let mut out = [0u8; NAMES_LEN];
    let (mut i, mut at) = (0, 0);
    while i < N {
        let b = LIST[i].as_bytes();
        let mut j = 0;
        while j < b.len() {
            out[at] = b[j];
            at += 1;
            j += 1;
        }
        at += 1; // the NUL
        i += 1;
    }
    out
};
static NAME_OFFSETS: [u16; N] = {
    let mut out = [0u16; N];
    let (mut i, mut at) = (0, 0);
    while i < N {
        out[i] = at as u16;
        at += LIST[i].len() + 1;
        i += 1;
    }
    out
};

/// The NUL-terminated name of entry point `ix`.
fn name(ix: usize) -> Option<*const c_char> {
    let off = *NAME_OFFSETS.get(ix)? as usize;
    NAME_BYTES.get(off..).map(|s| s.as_ptr().cast())
}

/// The core's function for each entry point (0 = not resolved yet).
static SLOTS: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];

#[cfg(target_arch = "x86_64")]
macro_rules! trampoline {
    ($name:ident, $ix:expr) => {
        /// # Safety
        /// Called from C with the contract of the CUDA or NVML function of the same name.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // SAFETY: a jump through this entry point's slot once it is filled. The first call saves the six
            // integer argument registers (no hooked CUDA/NVML function takes floating-point or stack-passed
            // arguments that `resolve` could disturb: stack arguments stay where the caller put them),
            // keeps the stack 16-byte aligned for the call, then jumps to the resolved function with the
            // caller's arguments and return address.
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + {slots} + {off}]",
                "test rax, rax",
                "jz 2f",
                "jmp rax",
                "2:",
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "push r8",
                "push r9",
                "sub rsp, 8",
                "mov edi, {ix}",
                "call {resolve}",
                "add rsp, 8",
                "pop r9",
                "pop r8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                slots = sym SLOTS,
                off = const $ix * 8,
                ix = const $ix,
                resolve = sym resolve,
            )
        }
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! trampoline {
    ($name:ident, $ix:expr) => {
        /// # Safety
        /// Called from C with the contract of the CUDA or NVML function of the same name.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // SAFETY: as on x86-64: load-acquire of the slot and a branch; the first call saves x0-x8, fp
            // and lr around `resolve` and branches to its result with the caller's registers restored.
            core::arch::naked_asm!(
                "adrp x16, {slots}",
                "add x16, x16, :lo12:{slots}",
                "add x16, x16, #{off}",
                "ldar x16, [x16]",
                "cbz x16, 2f",
                "br x16",
                "2:",
                "stp x29, x30, [sp, #-96]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "stp x2, x3, [sp, #32]",
                "stp x4, x5, [sp, #48]",
                "stp x6, x7, [sp, #64]",
                "str x8, [sp, #80]",
                "mov x0, #{ix}",
                "bl {resolve}",
                "mov x16, x0",
                "ldr x8, [sp, #80]",
                "ldp x6, x7, [sp, #64]",
                "ldp x4, x5, [sp, #48]",
                "ldp x2, x3, [sp, #32]",
                "ldp x0, x1, [sp, #16]",
                "ldp x29, x30, [sp], #96",
                "br x16",
                slots = sym SLOTS,
                off = const $ix * 8,
                ix = const $ix,
                resolve = sym resolve,
            )
        }
    };
}

// Every entry point the core hooks, `dlsym` aside: the one list shared with the core.
include!("../../abi/symbols.rs");
hooked_symbols!(entry_points);

/// First call of entry point `ix`: its core function, or the failing stand-in.
extern "C" fn resolve(ix: usize) -> usize {
    let (Some(name), Some(family)) = (name(ix), FAMILIES.get(ix)) else {
        return cuda_unavailable as *const () as usize;
    };
    let f = match core_handle() {
        0 => 0,
        h => sys::real_dlsym(h, name),
    };
    let f = if f != 0 { f } else { unavailable(*family) };
    if let Some(slot) = SLOTS.get(ix) {
        slot.store(f, Ordering::Release);
    }
    f
}

extern "C" fn cuda_unavailable() -> c_int {
    3 // CUDA_ERROR_NOT_INITIALIZED
}

extern "C" fn nvml_unavailable() -> c_int {
    1 // NVML_ERROR_UNINITIALIZED
}

fn unavailable(family: Family) -> usize {
    match family {
        Family::Cuda => cuda_unavailable as *const () as usize,
        Family::Nvml => nvml_unavailable as *const () as usize,
    }
}

const CORE_UNKNOWN: usize = 0;
const CORE_MISSING: usize = 1;
/// The core's dlopen handle, CORE_UNKNOWN before the first attempt, CORE_MISSING if it failed.
static CORE: AtomicUsize = AtomicUsize::new(CORE_UNKNOWN);

/// The core, loaded on first use from this object's own folder. Racing first calls each dlopen it;
/// dlopen is thread-safe and hands every one the same handle.
fn core_handle() -> usize {
    match CORE.load(Ordering::Acquire) {
        CORE_UNKNOWN => {}
        CORE_MISSING => return 0,
        h => return h,
    }
    let mut path = [0u8; 4096];
    let h = match sys::sibling_path(resolve as *const c_void, CORE_FILE, &mut path) {
        Some(p) => sys::dlopen_local(p),
        None => 0,
    };
    // libvgpu-single.so: no engine beside the front, the one it carries.
    #[cfg(feature = "embedded-engine")]
    let h = match h {
        0 => sys::dlopen_image(EMBEDDED_ENGINE),
        h => h,
    };
    if h == 0 {
        if CORE.swap(CORE_MISSING, Ordering::AcqRel) != CORE_MISSING {
            sys::report_missing_core(&path);
        }
        return 0;
    }
    CORE.store(h, Ordering::Release);
    h
}

include!("../../abi/route.rs");

type RouteFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> Route;

static ENGINE_ROUTE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn dlsym_route(handle: *mut c_void, name: *const c_char) -> Route {
    let real = match sys::real_dlsym_addr() {
        0 => no_symbol as *const () as usize,
        f => f,
    };
    let pass = Route { hook: 0, real };
    if name.is_null() {
        return pass;
    }
    // SAFETY: dlsym's name is a NUL-terminated string; we read at most its first four bytes, stopping at
    // the NUL.
    let ours = unsafe { starts_with(name, b"cu") || starts_with(name, b"nvml") };
    if !ours {
        return pass;
    }
    let h = core_handle();
    if h == 0 {
        // No core: hooked names fail closed, other CUDA/NVML names resolve as usual.
        return match index_of(name) {
            Some(ix) => Route {
                hook: FAMILIES
                    .get(ix)
                    .map_or(cuda_unavailable as *const () as usize, |f| unavailable(*f)),
                real: 0,
            },
            None => pass,
        };
    }
    let mut f = ENGINE_ROUTE.load(Ordering::Acquire);
    if f == 0 {
        f = sys::real_dlsym(h, c"vgpu_dlsym_route".as_ptr());
        ENGINE_ROUTE.store(f, Ordering::Release);
    }
    if f == 0 {
        return pass;
    }
    // SAFETY: f is the core's `vgpu_dlsym_route`, whose signature is RouteFn.
    unsafe { core::mem::transmute::<usize, RouteFn>(f)(handle, name) }
}

extern "C" fn no_symbol(_: *mut c_void, _: *const c_char) -> *mut c_void {
    core::ptr::null_mut()
}

/// Does the C string `s` start with `prefix`?
///
/// # Safety
/// `s` is a NUL-terminated string.
unsafe fn starts_with(s: *const c_char, prefix: &[u8]) -> bool {
    for (i, &b) in prefix.iter().enumerate() {
        // SAFETY: every byte read precedes or is the terminating NUL (a mismatch at the NUL stops us).
        if unsafe { *s.add(i) } as u8 != b {
            return false;
        }
    }
    true
}

/// The entry point named by the C string `name`, if it is one of ours.
fn index_of(wanted: *const c_char) -> Option<usize> {
    (0..N).find(|&ix| {
        let Some(n) = NAME_OFFSETS
            .get(ix)
            .and_then(|&off| NAME_BYTES.get(off as usize..))
        else {
            return false;
        };
        let len = n.iter().position(|&b| b == 0).map_or(n.len(), |l| l + 1);
        // SAFETY: n[..len] ends with its NUL and `wanted` is NUL-terminated; the comparison stops at the
        // first difference.
        n.get(..len)
            .is_some_and(|n| unsafe { starts_with(wanted, n) })
    })
}

/// # Safety
/// Called from C with glibc's `dlsym` contract: `handle` from `dlopen` or a pseudo-handle, `name` a
/// NUL-terminated string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: saves the two arguments around the router with the stack kept 16-byte aligned, then either
    // returns the hook (rax) or jumps to glibc's dlsym (rdx) with the original arguments and return address.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp rdx",
        "2:",
        "ret",
        route = sym dlsym_route,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: saves fp/lr and the arguments, calls the router (result in x0:x1), then returns the hook or
    // branches to glibc's dlsym with the original arguments and link register.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {route}",
        "cbnz x0, 2f",
        "mov x16, x1",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16",
        "2:",
        "ldp x29, x30, [sp], #32",
        "ret",
        route = sym dlsym_route,
    )
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here can panic (no indexing without `get`, no arithmetic that overflows); should that ever
    // change, stopping the process is the only thing a no_std object can do.
    sys::abort()
}
