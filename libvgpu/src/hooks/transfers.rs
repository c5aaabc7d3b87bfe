//! Eager memsets, copies and decompression (`cuMemset*`, `cuMemcpy*`, `cuMemBatchDecompressAsync`): under
//! a compute share they are work on the GPU like kernels (a loop of large memsets kept an H100's memory
//! system busy at 3,224 GB/s under a 10% share), so each goes through `launch::launch`: held back while the bucket is in debt, timed with
//! events on its stream, charged. The synchronous forms run on the legacy default stream (`_ptds`: the
//! per-thread one). On an oversubscribed GPU they wait for the turn as kernels do (`turns`). Without a
//! share or a turn gate, `cuGetProcAddress` hands out the driver's own functions
//! (`interpose::launch_only`) and these hooks forward at once. The batch copies (`cuMemcpyBatchAsync`,
//! `cuMemcpy3DBatchAsync`: CUDA 12.8's with a `failIdx`, CUDA 13's `_v2` without, each `_ptsz`) are one
//! piece of work each, keyed by the bytes they move. The unversioned 32-bit-pointer entry points (CUDA
//! 2.x's ABI, still exported, and handed out by `cuGetProcAddress` for versions before 3.2) reach memory
//! a program mapped below 4 GiB: they are work like the others (untimed, a loop of them got 99% under a
//! 10% share on the fake driver).
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_ushort, c_void};

use super::common::hook;
use super::launch::launch;
use crate::ffi::*;
use crate::real_symbols::forward;

type CUarrayH = *mut c_void;

/// What a transfer is for the compute share's book: its entry point (the name's address, never a
/// kernel's) and its size.
fn work(name: &'static str, bytes: u64) -> crate::compute::Work {
    (
        name.as_ptr() as usize,
        [1, bytes as u32, (bytes >> 32) as u32],
    )
}

macro_rules! transfers {
    ($( $lit:literal $name:ident($($a:ident: $t:ty),*) on $s:expr, $p:literal, $b:expr; )*) => {$(
        hook!($name($($a: $t),*) {
            // Without a share or a turn gate the work's size is never read (a batch's would be a walk
            // of its array).
            if crate::compute::off() && crate::turns::off() {
                return forward!($lit, fn($($t),*) $(, $a)*);
            }
            launch($s, $p, work($lit, $b as u64), || forward!($lit, fn($($t),*) $(, $a)*))
        });
    )*};
}

const NULL: CUstream = std::ptr::null_mut();

/// The bytes of a batch of `count` copies of `sizes` (the caller's array; null: the driver refuses the
/// call, and it is charged as an empty transfer).
fn batch_bytes(sizes: *const usize, count: usize) -> u64 {
    if sizes.is_null() {
        return 0;
    }
    // SAFETY: the caller's array of `count` sizes, read before the driver reads it.
    unsafe { std::slice::from_raw_parts(sizes, count) }
        .iter()
        .fold(0u64, |a, &n| a.saturating_add(n as u64))
}

/// `CUDA_MEMCPY3D_BATCH_OP`: two `CUmemcpy3DOperand`s (a type, then a 32-byte union), the extent.
#[repr(C)]
pub struct Batch3DOp {
    operands: [[u64; 5]; 2],
    extent: [usize; 3],
    src_access_order: c_uint,
    flags: c_uint,
}

/// What a 3D batch of `n` ops moves: the sum of their extents in elements (bytes for pointer operands;
/// an array's element size is not in the op).
fn batch_3d_bytes(ops: *const Batch3DOp, n: usize) -> u64 {
    if ops.is_null() {
        return 0;
    }
    // SAFETY: the caller's array of `n` ops, read before the driver reads it.
    unsafe { std::slice::from_raw_parts(ops, n) }
        .iter()
        .fold(0u64, |a, op| {
            let [w, h, d] = op.extent.map(|v| v as u64);
            a.saturating_add(w.saturating_mul(h).saturating_mul(d))
        })
}

transfers! {
    "cuMemsetD8_v2" cuMemsetD8_v2(d: CUdeviceptr, v: u8, n: usize) on NULL, false, n;
    "cuMemsetD8_v2_ptds" cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize) on NULL, true, n;
    "cuMemsetD16_v2" cuMemsetD16_v2(d: CUdeviceptr, v: c_ushort, n: usize) on NULL, false, n * 2;
    "cuMemsetD16_v2_ptds" cuMemsetD16_v2_ptds(d: CUdeviceptr, v: c_ushort, n: usize) on NULL, true, n * 2;
    "cuMemsetD32_v2" cuMemsetD32_v2(d: CUdeviceptr, v: c_uint, n: usize) on NULL, false, n * 4;
    "cuMemsetD32_v2_ptds" cuMemsetD32_v2_ptds(d: CUdeviceptr, v: c_uint, n: usize) on NULL, true, n * 4;
    "cuMemsetD8Async" cuMemsetD8Async(d: CUdeviceptr, v: u8, n: usize, s: CUstream) on s, false, n;
    "cuMemsetD8Async_ptsz" cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: CUstream) on s, true, n;
    "cuMemsetD16Async" cuMemsetD16Async(d: CUdeviceptr, v: c_ushort, n: usize, s: CUstream) on s, false, n * 2;
    "cuMemsetD16Async_ptsz" cuMemsetD16Async_ptsz(d: CUdeviceptr, v: c_ushort, n: usize, s: CUstream) on s, true, n * 2;
    "cuMemsetD32Async" cuMemsetD32Async(d: CUdeviceptr, v: c_uint, n: usize, s: CUstream) on s, false, n * 4;
    "cuMemsetD32Async_ptsz" cuMemsetD32Async_ptsz(d: CUdeviceptr, v: c_uint, n: usize, s: CUstream) on s, true, n * 4;
    "cuMemsetD2D8_v2" cuMemsetD2D8_v2(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize) on NULL, false, w * h;
    "cuMemsetD2D8_v2_ptds" cuMemsetD2D8_v2_ptds(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize) on NULL, true, w * h;
    "cuMemsetD2D16_v2" cuMemsetD2D16_v2(d: CUdeviceptr, p: usize, v: c_ushort, w: usize, h: usize) on NULL, false, w * h * 2;
    "cuMemsetD2D16_v2_ptds" cuMemsetD2D16_v2_ptds(d: CUdeviceptr, p: usize, v: c_ushort, w: usize, h: usize) on NULL, true, w * h * 2;
    "cuMemsetD2D32_v2" cuMemsetD2D32_v2(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize) on NULL, false, w * h * 4;
    "cuMemsetD2D32_v2_ptds" cuMemsetD2D32_v2_ptds(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize) on NULL, true, w * h * 4;
    "cuMemsetD2D8Async" cuMemsetD2D8Async(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize, s: CUstream) on s, false, w * h;
    "cuMemsetD2D8Async_ptsz" cuMemsetD2D8Async_ptsz(d: CUdeviceptr, p: usize, v: u8, w: usize, h: usize, s: CUstream) on s, true, w * h;
    "cuMemsetD2D16Async" cuMemsetD2D16Async(d: CUdeviceptr, p: usize, v: c_ushort, w: usize, h: usize, s: CUstream) on s, false, w * h * 2;
    "cuMemsetD2D16Async_ptsz" cuMemsetD2D16Async_ptsz(d: CUdeviceptr, p: usize, v: c_ushort, w: usize, h: usize, s: CUstream) on s, true, w * h * 2;
    "cuMemsetD2D32Async" cuMemsetD2D32Async(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize, s: CUstream) on s, false, w * h * 4;
    "cuMemsetD2D32Async_ptsz" cuMemsetD2D32Async_ptsz(d: CUdeviceptr, p: usize, v: c_uint, w: usize, h: usize, s: CUstream) on s, true, w * h * 4;

    "cuMemcpy" cuMemcpy(d: CUdeviceptr, src: CUdeviceptr, n: usize) on NULL, false, n;
    "cuMemcpy_ptds" cuMemcpy_ptds(d: CUdeviceptr, src: CUdeviceptr, n: usize) on NULL, true, n;
    "cuMemcpyAsync" cuMemcpyAsync(d: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyAsync_ptsz" cuMemcpyAsync_ptsz(d: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyHtoD_v2" cuMemcpyHtoD_v2(d: CUdeviceptr, src: *const c_void, n: usize) on NULL, false, n;
    "cuMemcpyHtoD_v2_ptds" cuMemcpyHtoD_v2_ptds(d: CUdeviceptr, src: *const c_void, n: usize) on NULL, true, n;
    "cuMemcpyDtoH_v2" cuMemcpyDtoH_v2(d: *mut c_void, src: CUdeviceptr, n: usize) on NULL, false, n;
    "cuMemcpyDtoH_v2_ptds" cuMemcpyDtoH_v2_ptds(d: *mut c_void, src: CUdeviceptr, n: usize) on NULL, true, n;
    "cuMemcpyDtoD_v2" cuMemcpyDtoD_v2(d: CUdeviceptr, src: CUdeviceptr, n: usize) on NULL, false, n;
    "cuMemcpyDtoD_v2_ptds" cuMemcpyDtoD_v2_ptds(d: CUdeviceptr, src: CUdeviceptr, n: usize) on NULL, true, n;
    "cuMemcpyHtoDAsync_v2" cuMemcpyHtoDAsync_v2(d: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyHtoDAsync_v2_ptsz" cuMemcpyHtoDAsync_v2_ptsz(d: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyDtoHAsync_v2" cuMemcpyDtoHAsync_v2(d: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyDtoHAsync_v2_ptsz" cuMemcpyDtoHAsync_v2_ptsz(d: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyDtoDAsync_v2" cuMemcpyDtoDAsync_v2(d: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyDtoDAsync_v2_ptsz" cuMemcpyDtoDAsync_v2_ptsz(d: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyPeer" cuMemcpyPeer(d: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize) on NULL, false, n;
    "cuMemcpyPeer_ptds" cuMemcpyPeer_ptds(d: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize) on NULL, true, n;
    "cuMemcpyPeerAsync" cuMemcpyPeerAsync(d: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyPeerAsync_ptsz" cuMemcpyPeerAsync_ptsz(d: CUdeviceptr, dc: CUcontext, src: CUdeviceptr, sc: CUcontext, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyAtoD_v2" cuMemcpyAtoD_v2(d: CUdeviceptr, a: CUarrayH, off: usize, n: usize) on NULL, false, n;
    "cuMemcpyAtoD_v2_ptds" cuMemcpyAtoD_v2_ptds(d: CUdeviceptr, a: CUarrayH, off: usize, n: usize) on NULL, true, n;
    "cuMemcpyDtoA_v2" cuMemcpyDtoA_v2(a: CUarrayH, off: usize, src: CUdeviceptr, n: usize) on NULL, false, n;
    "cuMemcpyDtoA_v2_ptds" cuMemcpyDtoA_v2_ptds(a: CUarrayH, off: usize, src: CUdeviceptr, n: usize) on NULL, true, n;
    "cuMemcpyHtoA_v2" cuMemcpyHtoA_v2(a: CUarrayH, off: usize, src: *const c_void, n: usize) on NULL, false, n;
    "cuMemcpyHtoA_v2_ptds" cuMemcpyHtoA_v2_ptds(a: CUarrayH, off: usize, src: *const c_void, n: usize) on NULL, true, n;
    "cuMemcpyAtoH_v2" cuMemcpyAtoH_v2(d: *mut c_void, a: CUarrayH, off: usize, n: usize) on NULL, false, n;
    "cuMemcpyAtoH_v2_ptds" cuMemcpyAtoH_v2_ptds(d: *mut c_void, a: CUarrayH, off: usize, n: usize) on NULL, true, n;
    "cuMemcpyHtoAAsync_v2" cuMemcpyHtoAAsync_v2(a: CUarrayH, off: usize, src: *const c_void, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyHtoAAsync_v2_ptsz" cuMemcpyHtoAAsync_v2_ptsz(a: CUarrayH, off: usize, src: *const c_void, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyAtoHAsync_v2" cuMemcpyAtoHAsync_v2(d: *mut c_void, a: CUarrayH, off: usize, n: usize, s: CUstream) on s, false, n;
    "cuMemcpyAtoHAsync_v2_ptsz" cuMemcpyAtoHAsync_v2_ptsz(d: *mut c_void, a: CUarrayH, off: usize, n: usize, s: CUstream) on s, true, n;
    "cuMemcpyAtoA_v2" cuMemcpyAtoA_v2(d: CUarrayH, doff: usize, a: CUarrayH, off: usize, n: usize) on NULL, false, n;
    "cuMemcpyAtoA_v2_ptds" cuMemcpyAtoA_v2_ptds(d: CUarrayH, doff: usize, a: CUarrayH, off: usize, n: usize) on NULL, true, n;
    // 2D and 3D copies: their size stays in the descriptor; the key is the entry point alone.
    "cuMemcpy2D_v2" cuMemcpy2D_v2(p: *const c_void) on NULL, false, 0;
    "cuMemcpy2D_v2_ptds" cuMemcpy2D_v2_ptds(p: *const c_void) on NULL, true, 0;
    "cuMemcpy2DUnaligned_v2" cuMemcpy2DUnaligned_v2(p: *const c_void) on NULL, false, 0;
    "cuMemcpy2DUnaligned_v2_ptds" cuMemcpy2DUnaligned_v2_ptds(p: *const c_void) on NULL, true, 0;
    "cuMemcpy2DAsync_v2" cuMemcpy2DAsync_v2(p: *const c_void, s: CUstream) on s, false, 0;
    "cuMemcpy2DAsync_v2_ptsz" cuMemcpy2DAsync_v2_ptsz(p: *const c_void, s: CUstream) on s, true, 0;
    "cuMemcpy3D_v2" cuMemcpy3D_v2(p: *const c_void) on NULL, false, 0;
    "cuMemcpy3D_v2_ptds" cuMemcpy3D_v2_ptds(p: *const c_void) on NULL, true, 0;
    "cuMemcpy3DAsync_v2" cuMemcpy3DAsync_v2(p: *const c_void, s: CUstream) on s, false, 0;
    "cuMemcpy3DAsync_v2_ptsz" cuMemcpy3DAsync_v2_ptsz(p: *const c_void, s: CUstream) on s, true, 0;
    "cuMemcpy3DPeer" cuMemcpy3DPeer(p: *const c_void) on NULL, false, 0;
    "cuMemcpy3DPeer_ptds" cuMemcpy3DPeer_ptds(p: *const c_void) on NULL, true, 0;
    "cuMemcpy3DPeerAsync" cuMemcpy3DPeerAsync(p: *const c_void, s: CUstream) on s, false, 0;
    "cuMemcpy3DPeerAsync_ptsz" cuMemcpy3DPeerAsync_ptsz(p: *const c_void, s: CUstream) on s, true, 0;

    // The unversioned 32-bit-pointer entry points: synchronous on the legacy default stream, or on `s`.
    "cuMemsetD8" cuMemsetD8(d: CUdeviceptr_v1, v: u8, n: c_uint) on NULL, false, n;
    "cuMemsetD16" cuMemsetD16(d: CUdeviceptr_v1, v: c_ushort, n: c_uint) on NULL, false, n as u64 * 2;
    "cuMemsetD32" cuMemsetD32(d: CUdeviceptr_v1, v: c_uint, n: c_uint) on NULL, false, n as u64 * 4;
    "cuMemsetD2D8" cuMemsetD2D8(d: CUdeviceptr_v1, p: c_uint, v: u8, w: c_uint, h: c_uint) on NULL, false, w as u64 * h as u64;
    "cuMemsetD2D16" cuMemsetD2D16(d: CUdeviceptr_v1, p: c_uint, v: c_ushort, w: c_uint, h: c_uint) on NULL, false, w as u64 * h as u64 * 2;
    "cuMemsetD2D32" cuMemsetD2D32(d: CUdeviceptr_v1, p: c_uint, v: c_uint, w: c_uint, h: c_uint) on NULL, false, w as u64 * h as u64 * 4;
    "cuMemcpyHtoD" cuMemcpyHtoD(d: CUdeviceptr_v1, src: *const c_void, n: c_uint) on NULL, false, n;
    "cuMemcpyDtoH" cuMemcpyDtoH(d: *mut c_void, src: CUdeviceptr_v1, n: c_uint) on NULL, false, n;
    "cuMemcpyDtoD" cuMemcpyDtoD(d: CUdeviceptr_v1, src: CUdeviceptr_v1, n: c_uint) on NULL, false, n;
    "cuMemcpyHtoDAsync" cuMemcpyHtoDAsync(d: CUdeviceptr_v1, src: *const c_void, n: c_uint, s: CUstream) on s, false, n;
    "cuMemcpyDtoHAsync" cuMemcpyDtoHAsync(d: *mut c_void, src: CUdeviceptr_v1, n: c_uint, s: CUstream) on s, false, n;
    "cuMemcpyDtoDAsync" cuMemcpyDtoDAsync(d: CUdeviceptr_v1, src: CUdeviceptr_v1, n: c_uint, s: CUstream) on s, false, n;
    "cuMemcpyAtoD" cuMemcpyAtoD(d: CUdeviceptr_v1, a: CUarrayH, off: c_uint, n: c_uint) on NULL, false, n;
    "cuMemcpyDtoA" cuMemcpyDtoA(a: CUarrayH, off: c_uint, src: CUdeviceptr_v1, n: c_uint) on NULL, false, n;
    "cuMemcpyHtoA" cuMemcpyHtoA(a: CUarrayH, off: c_uint, src: *const c_void, n: c_uint) on NULL, false, n;
    "cuMemcpyAtoH" cuMemcpyAtoH(d: *mut c_void, a: CUarrayH, off: c_uint, n: c_uint) on NULL, false, n;
    "cuMemcpyHtoAAsync" cuMemcpyHtoAAsync(a: CUarrayH, off: c_uint, src: *const c_void, n: c_uint, s: CUstream) on s, false, n;
    "cuMemcpyAtoHAsync" cuMemcpyAtoHAsync(d: *mut c_void, a: CUarrayH, off: c_uint, n: c_uint, s: CUstream) on s, false, n;
    "cuMemcpyAtoA" cuMemcpyAtoA(d: CUarrayH, doff: c_uint, a: CUarrayH, off: c_uint, n: c_uint) on NULL, false, n;
    "cuMemcpy2D" cuMemcpy2D(p: *const c_void) on NULL, false, 0;
    "cuMemcpy2DUnaligned" cuMemcpy2DUnaligned(p: *const c_void) on NULL, false, 0;
    "cuMemcpy2DAsync" cuMemcpy2DAsync(p: *const c_void, s: CUstream) on s, false, 0;
    "cuMemcpy3D" cuMemcpy3D(p: *const c_void) on NULL, false, 0;
    "cuMemcpy3DAsync" cuMemcpy3DAsync(p: *const c_void, s: CUstream) on s, false, 0;

    // Hardware decompression (CUDA 12.8+): work on the GPU's copy and decompression engines, one piece
    // of work per batch, keyed by the entry point alone.
    "cuMemBatchDecompressAsync" cuMemBatchDecompressAsync(p: *mut c_void, n: usize, f: c_uint, e: *mut usize, s: CUstream)
        on s, false, 0;
    "cuMemBatchDecompressAsync_ptsz" cuMemBatchDecompressAsync_ptsz(p: *mut c_void, n: usize, f: c_uint, e: *mut usize,
        s: CUstream) on s, true, 0;

    "cuMemcpyBatchAsync" cuMemcpyBatchAsync(d: *mut CUdeviceptr, src: *mut CUdeviceptr, sz: *mut usize, n: usize,
        at: *mut c_void, ai: *mut usize, na: usize, fail: *mut usize, s: CUstream) on s, false, batch_bytes(sz, n);
    "cuMemcpyBatchAsync_ptsz" cuMemcpyBatchAsync_ptsz(d: *mut CUdeviceptr, src: *mut CUdeviceptr, sz: *mut usize, n: usize,
        at: *mut c_void, ai: *mut usize, na: usize, fail: *mut usize, s: CUstream) on s, true, batch_bytes(sz, n);
    "cuMemcpyBatchAsync_v2" cuMemcpyBatchAsync_v2(d: *mut CUdeviceptr, src: *mut CUdeviceptr, sz: *mut usize, n: usize,
        at: *mut c_void, ai: *mut usize, na: usize, s: CUstream) on s, false, batch_bytes(sz, n);
    "cuMemcpyBatchAsync_v2_ptsz" cuMemcpyBatchAsync_v2_ptsz(d: *mut CUdeviceptr, src: *mut CUdeviceptr, sz: *mut usize, n: usize,
        at: *mut c_void, ai: *mut usize, na: usize, s: CUstream) on s, true, batch_bytes(sz, n);
    "cuMemcpy3DBatchAsync" cuMemcpy3DBatchAsync(n: usize, ops: *mut Batch3DOp, fail: *mut usize, f: u64, s: CUstream)
        on s, false, batch_3d_bytes(ops, n);
    "cuMemcpy3DBatchAsync_ptsz" cuMemcpy3DBatchAsync_ptsz(n: usize, ops: *mut Batch3DOp, fail: *mut usize, f: u64, s: CUstream)
        on s, true, batch_3d_bytes(ops, n);
    "cuMemcpy3DBatchAsync_v2" cuMemcpy3DBatchAsync_v2(n: usize, ops: *mut Batch3DOp, f: u64, s: CUstream)
        on s, false, batch_3d_bytes(ops, n);
    "cuMemcpy3DBatchAsync_v2_ptsz" cuMemcpy3DBatchAsync_v2_ptsz(n: usize, ops: *mut Batch3DOp, f: u64, s: CUstream)
        on s, true, batch_3d_bytes(ops, n);
}

/// Every transfer hook's name, for `interpose::launch_only` (a process without a share gets the
/// driver's own functions).
pub(crate) fn is_transfer(name: &[u8]) -> bool {
    name.starts_with(b"cuMemset")
        || name.starts_with(b"cuMemcpy")
        || name.starts_with(b"cuMemBatchDecompress")
}
