//! How programs reach the hooks: `dlsym` routing and `cuGetProcAddress[_v2]`, with the name -> hook table
//! built from the one symbol list (`libvgpu/abi/symbols.rs`). The hooks themselves live in `hooks`.
//!
//! `dlsym` itself is exported by the preload front (`libvgpu/preload`), a tail-calling trampoline that
//! keeps RTLD_NEXT meaning "after the caller" for every name we do not hook. For every CUDA or NVML name it
//! asks `vgpu_dlsym_route` here: our hook for a hooked name found in the real libcuda / libnvidia-ml (with
//! RTLD_NEXT: whenever the driver defines it, whoever asks), else glibc's dlsym.
//!
//! `cuGetProcAddress`: the real one answers first, with the caller's CUDA version and flags, so version and
//! per-thread-stream (`_ptds`/`_ptsz`) selection stay the driver's; if the pointer it returns is the real
//! address of a versioned symbol we hook, the caller gets our hook of exactly that symbol. Anything else is
//! returned untouched.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::ffi::*;
use crate::guard::guard;
use crate::real_symbols::{self, real, Lib};

include!("../abi/route.rs");

/// (library, exact versioned name, our hook's address) for one hooked symbol.
type Entry = (Lib, &'static CStr, usize);

/// Builds the table from the one symbol list (`libvgpu/abi/symbols.rs`).
macro_rules! hook_table {
    ($($family:ident: $($name:ident)*;)*) => {
        vec![$($( (
            Lib::$family,
            match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                Ok(c) => c,
                Err(_) => unreachable!(),
            },
            $name as *const () as usize,
        ), )*)*]
    };
}

include!("../abi/symbols.rs");

/// Every hooked symbol, by its exact (versioned) name.
fn entries() -> &'static [Entry] {
    static T: OnceLock<Vec<Entry>> = OnceLock::new();
    T.get_or_init(|| {
        use crate::hooks::*;
        hooked_symbols!(hook_table)
    })
}

/// name -> (library, hook address)
fn by_name() -> &'static HashMap<&'static [u8], (Lib, usize)> {
    static T: OnceLock<HashMap<&'static [u8], (Lib, usize)>> = OnceLock::new();
    T.get_or_init(|| {
        entries()
            .iter()
            .map(|(l, n, h)| (n.to_bytes(), (*l, *h)))
            .collect()
    })
}

/// real driver address -> hook address (built once libcuda is loaded).
///
/// Built with no lock held and then published, like the configuration (`settings`): building asks
/// `dlsym` for every hooked name, which waits for the loader's lock, and a library constructor running
/// inside `dlopen` (holding that lock) may be the next to want the table. A one-time lock held across the
/// build deadlocked the two (`tests/e2e/libvgpu-preload.test.sh`). Racing builders each build; one wins.
fn by_real_addr() -> &'static HashMap<usize, usize> {
    static T: OnceLock<HashMap<usize, usize>> = OnceLock::new();
    if let Some(t) = T.get() {
        return t;
    }
    let built: HashMap<usize, usize> = entries()
        .iter()
        .filter(|(l, ..)| *l == Lib::Cuda)
        .filter_map(|(l, n, h)| {
            let r = real_symbols::lookup(*l, n);
            (r != 0).then_some((r, *h))
        })
        .collect();
    // `set` only moves the value in under the cell's lock; the loser's table is dropped.
    let _ = T.set(built);
    T.get_or_init(HashMap::new)
}

/// Every hooked name (the surface test holds them to the classified driver surface).
#[cfg(test)]
pub(crate) fn hooked_names() -> impl Iterator<Item = &'static str> {
    entries().iter().map(|(_, n, _)| n.to_str().unwrap_or(""))
}

/// Our hook for a driver pointer, or the pointer itself.
pub fn map_proc(p: usize) -> usize {
    by_real_addr().get(&p).copied().unwrap_or(p)
}

extern "C" fn no_dlsym(_: *mut c_void, _: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// The routing decision of `dlsym`, exported for the preload front (`libvgpu/preload`), whose own
/// `dlsym` trampoline asks it for every CUDA and NVML name.
#[no_mangle]
pub extern "C" fn vgpu_dlsym_route(handle: *mut c_void, name: *const c_char) -> Route {
    dlsym_route(handle, name)
}

extern "C" fn dlsym_route(handle: *mut c_void, name: *const c_char) -> Route {
    guard(
        Route {
            hook: 0,
            real: no_dlsym as *const () as usize,
        },
        || {
            let real_dlsym = match real_symbols::real_dlsym_addr() {
                0 => no_dlsym as *const () as usize,
                a => a,
            };
            let pass = Route {
                hook: 0,
                real: real_dlsym,
            };
            if name.is_null() {
                return pass;
            }
            // SAFETY: dlsym's name argument is a NUL-terminated string.
            let cname = unsafe { CStr::from_ptr(name) };
            let n = cname.to_bytes();
            if !(n.starts_with(b"cu") || n.starts_with(b"nvml")) {
                return pass;
            }
            let Some(&(lib, hook)) = by_name().get(n) else {
                return pass;
            };
            if handle == libc::RTLD_NEXT {
                // "After the caller" cannot be looked up from here (glibc takes the caller from its return
                // address), and handing a hooked name back to glibc would give the caller — an interposer
                // loaded after us — the driver's own function, past the quota. Whatever follows the caller,
                // the driver's function of that name is reached through the hook. (A driver that is not
                // loaded, or lacks the name, is nobody's next: glibc answers, or fails, as usual.)
                if real_symbols::is_loaded(lib) && real_symbols::lookup(lib, cname) != 0 {
                    return Route { hook, real: 0 };
                }
                return pass;
            }
            let found = real_symbols::real_dlsym(handle, name) as usize;
            if found == 0 {
                return pass; // let glibc fail it, setting dlerror
            }
            if found == hook || found == real_symbols::lookup(lib, cname) {
                return Route { hook, real: 0 };
            }
            Route {
                hook: found,
                real: 0,
            }
        },
    )
}

/// The hooks that only serve the compute share and the turn gate (kernel launches, eager memsets and
/// copies, graph exec updates, the stream and event queries, capture beginnings and stream waits that close
/// the share's open groups; graph
/// launches also keep the memory quota's books, so they are not among them).
fn launch_only(hook: usize) -> bool {
    use crate::hooks::*;
    let transfer = || {
        entries()
            .iter()
            .any(|(_, n, h)| *h == hook && is_transfer(n.to_bytes()))
    };
    transfer()
        || kernel_launch(hook)
        || [
            cuLaunchCooperativeKernelMultiDevice as *const () as usize,
            cuGraphExecUpdate as *const () as usize,
            cuGraphExecUpdate_v2 as *const () as usize,
            cuGraphExecKernelNodeSetParams as *const () as usize,
            cuGraphExecKernelNodeSetParams_v2 as *const () as usize,
            cuGraphExecNodeSetParams as *const () as usize,
            cuGraphExecChildGraphNodeSetParams as *const () as usize,
            cuStreamQuery as *const () as usize,
            cuStreamQuery_ptsz as *const () as usize,
            cuEventQuery as *const () as usize,
            cuStreamBeginCapture as *const () as usize,
            cuStreamBeginCapture_ptsz as *const () as usize,
            cuStreamBeginCapture_v2 as *const () as usize,
            cuStreamBeginCapture_v2_ptsz as *const () as usize,
            cuStreamBeginCaptureToGraph as *const () as usize,
            cuStreamBeginCaptureToGraph_ptsz as *const () as usize,
            cuStreamWaitEvent as *const () as usize,
            cuStreamWaitEvent_ptsz as *const () as usize,
        ]
        .contains(&hook)
}

/// The kernel launches, which also serve the memory quota (the stack growth a launch needs,
/// `hooks/stack`): handed out whenever a memory limit applies, share or not.
fn kernel_launch(hook: usize) -> bool {
    use crate::hooks::*;
    [
        cuLaunchKernel as *const () as usize,
        cuLaunchKernel_ptsz as *const () as usize,
        cuLaunchKernelEx as *const () as usize,
        cuLaunchKernelEx_ptsz as *const () as usize,
        cuLaunchCooperativeKernel as *const () as usize,
        cuLaunchCooperativeKernel_ptsz as *const () as usize,
    ]
    .contains(&hook)
}

/// Whether a process gets the driver's own function instead of hook `hook`: one that serves only the
/// compute share and the turn gate, in a process with neither (no share, no oversubscribed GPU; kernel
/// launches also under no memory limit). Such a process's
/// launches cost exactly what they cost without us.
fn drivers_own(hook: usize) -> bool {
    launch_only(hook)
        && crate::compute::off()
        && crate::turns::off()
        && (!kernel_launch(hook) || crate::settings::unlimited())
}

/// After the real cuGetProcAddress: swap a hooked driver function for our hook, but where `drivers_own`.
fn swap_proc(r: CUresult, pfn: *mut *mut c_void) -> CUresult {
    if r == CUDA_SUCCESS && !pfn.is_null() {
        // SAFETY: non-null out-pointer the driver just wrote.
        unsafe {
            if !(*pfn).is_null() {
                let hook = map_proc(*pfn as usize);
                if !drivers_own(hook) {
                    *pfn = hook as *mut c_void;
                }
            }
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real!(
            Lib::Cuda,
            "cuGetProcAddress_v2",
            unsafe extern "C" fn(
                *const c_char,
                *mut *mut c_void,
                c_int,
                u64,
                *mut c_int,
            ) -> CUresult
        ) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's arguments, unchanged.
        swap_proc(unsafe { f(symbol, pfn, version, flags, status) }, pfn)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real!(
            Lib::Cuda,
            "cuGetProcAddress",
            unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult
        ) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: the caller's arguments, unchanged.
        swap_proc(unsafe { f(symbol, pfn, version, flags) }, pfn)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_name_is_unique_and_named() {
        let n = entries().len();
        assert_eq!(by_name().len(), n);
        assert!(by_name().contains_key(&b"cuMemAlloc_v2"[..]));
        assert!(by_name().contains_key(&b"cuMemAllocAsync_ptsz"[..]));
        assert!(by_name().contains_key(&b"nvmlDeviceGetMemoryInfo_v2"[..]));
    }

    #[test]
    fn ordinary_names_are_left_to_glibc() {
        // A name that is neither CUDA nor NVML: no hook, and the route leads to glibc's own dlsym.
        let r = vgpu_dlsym_route(libc::RTLD_DEFAULT, c"getpid".as_ptr());
        assert_eq!(r.hook, 0);
        assert_eq!(r.real, real_symbols::real_dlsym_addr());
        assert_ne!(r.real, 0);
        // RTLD_NEXT for a name we do not hook keeps glibc's meaning (the front tail-calls it as the caller).
        let r = vgpu_dlsym_route(libc::RTLD_NEXT, c"getpid".as_ptr());
        assert_eq!((r.hook, r.real), (0, real_symbols::real_dlsym_addr()));
        // A CUDA name we do not hook is not ours either, found or not.
        assert_eq!(
            vgpu_dlsym_route(libc::RTLD_DEFAULT, c"cuNoSuchFunction".as_ptr()).hook,
            0
        );
    }

    // The stream and event queries serve only the compute share (they close its open groups): a process
    // without a share or turns gets the driver's own, as it does the launches; the synchronisations keep
    // the memory quota's books and stay hooked.
    #[test]
    fn the_queries_are_the_driver_s_own_without_a_share() {
        use crate::hooks::*;
        for hook in [
            cuStreamQuery as *const () as usize,
            cuStreamQuery_ptsz as *const () as usize,
            cuEventQuery as *const () as usize,
        ] {
            assert!(launch_only(hook));
        }
        assert!(!launch_only(cuStreamSynchronize as *const () as usize));
    }
}
