//! CUresult codes and the C types of the driver API, as cuda.h declares them.

pub type CUresult = u32;
/// Handles (CUcontext, CUstream, ...) are pointers in C; we hand out opaque numbers.
pub type Handle = usize;
pub type CUdevice = i32;
pub type R = Result<(), CUresult>;

pub const SUCCESS: CUresult = 0;
pub const INVALID_VALUE: CUresult = 1;
pub const OUT_OF_MEMORY: CUresult = 2;
pub const NOT_INITIALIZED: CUresult = 3;
pub const NO_DEVICE: CUresult = 100;
pub const INVALID_DEVICE: CUresult = 101;
pub const INVALID_IMAGE: CUresult = 200;
pub const INVALID_CONTEXT: CUresult = 201;
pub const FILE_NOT_FOUND: CUresult = 301;
pub const INVALID_HANDLE: CUresult = 400;
pub const NOT_FOUND: CUresult = 500;
pub const NOT_READY: CUresult = 600;
pub const NOT_SUPPORTED: CUresult = 801;
pub const UNKNOWN: CUresult = 999;

/// Runs an API body: `Ok` is CUDA_SUCCESS, a panic becomes CUDA_ERROR_UNKNOWN instead of
/// unwinding into C.
pub fn guard(f: impl FnOnce() -> R) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => UNKNOWN,
    }
}

/// Defines an exported driver function whose body returns [`R`].
/// SAFETY (for every use): the C caller passes pointers as the driver API documents; bodies check
/// them for NULL before writing through them.
macro_rules! cu_fn {
    ($(fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::types::CUresult {
            $crate::types::guard(|| -> $crate::types::R { $body })
        }
    )*};
}

/// Defines exported aliases (`_ptds`/`_ptsz`, legacy names) that behave like another function.
macro_rules! cu_alias {
    ($($alias:ident => $target:ident($($a:ident: $t:ty),* $(,)?);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $alias($($a: $t),*) -> $crate::types::CUresult {
            $target($($a),*)
        }
    )*};
}

/// Writes `v` through an out-pointer, refusing NULL.
pub unsafe fn out<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null; the caller's contract says it points at a T.
    unsafe { p.write(v) };
    Ok(())
}

pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}
