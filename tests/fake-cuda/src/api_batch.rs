//! Batch copies (CUDA 12.8+): `cuMemcpyBatchAsync` and `cuMemcpy3DBatchAsync`, each in its 12.8 form (with
//! a `failIdx` out-argument) and CUDA 13's `_v2` (without), and their `_ptsz` variants. Pointer operands
//! only (unified addressing, as `cuMemcpy`): every copy is made at once and the batch takes its bytes'
//! time on the process's queue (`FAKE_CUDA_BYTES_PER_US`), as one transfer. Array operands of a 3D batch
//! are not modelled: `CUDA_ERROR_NOT_SUPPORTED`.

use crate::driver::*;
use crate::types::*;
use std::ffi::c_void;

/// `CUmemcpy3DOperand`: its type, then a union of a pointer operand (`ptr`, row length, layer height, a
/// location hint) and an array operand.
#[repr(C)]
pub struct Operand {
    kind: u32,
    ptr: u64,
    row_length: usize,
    layer_height: usize,
    hint: [i32; 2],
}

/// `CUDA_MEMCPY3D_BATCH_OP`.
#[repr(C)]
pub struct Batch3DOp {
    src: Operand,
    dst: Operand,
    extent: [usize; 3],
    src_access_order: u32,
    flags: u32,
}

const CU_MEMCPY_OPERAND_TYPE_POINTER: u32 = 1;

/// `count` copies of `sizes[i]` bytes from `srcs[i]` to `dsts[i]`; on an error its index in `fail`.
unsafe fn batch(
    dsts: *const u64,
    srcs: *const u64,
    sizes: *const usize,
    count: usize,
    fail: *mut usize,
) -> R {
    let d = drv()?;
    let since = crate::timeline::call_start();
    if count == 0 || dsts.is_null() || srcs.is_null() || sizes.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut total = 0u64;
    for i in 0..count {
        let (dst, src, n) = (*dsts.add(i), *srcs.add(i), *sizes.add(i));
        if n == 0 || dst == 0 || src == 0 {
            if !fail.is_null() {
                *fail = i;
            }
            return Err(INVALID_VALUE);
        }
        std::ptr::copy(src as *const u8, dst as *mut u8, n);
        total += n as u64;
    }
    crate::timeline::transfer(d, total, since);
    Ok(())
}

/// `n` 3D copies between pointer operands (the extent's width in bytes).
unsafe fn batch_3d(n: usize, ops: *const Batch3DOp, fail: *mut usize) -> R {
    let d = drv()?;
    let since = crate::timeline::call_start();
    if n == 0 || ops.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut total = 0u64;
    for i in 0..n {
        let op = &*ops.add(i);
        if op.src.kind != CU_MEMCPY_OPERAND_TYPE_POINTER
            || op.dst.kind != CU_MEMCPY_OPERAND_TYPE_POINTER
        {
            if !fail.is_null() {
                *fail = i;
            }
            return Err(NOT_SUPPORTED);
        }
        let [w, h, depth] = op.extent;
        if w == 0 || h == 0 || depth == 0 || op.src.ptr == 0 || op.dst.ptr == 0 {
            if !fail.is_null() {
                *fail = i;
            }
            return Err(INVALID_VALUE);
        }
        let pitch = |o: &Operand| o.row_length.max(w);
        let layer = |o: &Operand| pitch(o) * o.layer_height.max(h);
        for z in 0..depth {
            for y in 0..h {
                let at = |o: &Operand| o.ptr as usize + z * layer(o) + y * pitch(o);
                std::ptr::copy(at(&op.src) as *const u8, at(&op.dst) as *mut u8, w);
            }
        }
        total += (w * h * depth) as u64;
    }
    crate::timeline::transfer(d, total, since);
    Ok(())
}

cu_fn! {
fn cuMemcpyBatchAsync(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, _attrs: *const c_void,
                      _attr_idxs: *const usize, _num_attrs: usize, fail: *mut usize, _s: Handle) {
    batch(dsts, srcs, sizes, count, fail)
}
fn cuMemcpyBatchAsync_v2(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize, _attrs: *const c_void,
                         _attr_idxs: *const usize, _num_attrs: usize, _s: Handle) {
    batch(dsts, srcs, sizes, count, std::ptr::null_mut())
}
fn cuMemcpy3DBatchAsync(n: usize, ops: *const Batch3DOp, fail: *mut usize, _flags: u64, _s: Handle) {
    batch_3d(n, ops, fail)
}
fn cuMemcpy3DBatchAsync_v2(n: usize, ops: *const Batch3DOp, _flags: u64, _s: Handle) {
    batch_3d(n, ops, std::ptr::null_mut())
}
}

cu_alias! {
    cuMemcpyBatchAsync_ptsz => cuMemcpyBatchAsync(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize,
        attrs: *const c_void, attr_idxs: *const usize, num_attrs: usize, fail: *mut usize, s: Handle);
    cuMemcpyBatchAsync_v2_ptsz => cuMemcpyBatchAsync_v2(dsts: *const u64, srcs: *const u64, sizes: *const usize, count: usize,
        attrs: *const c_void, attr_idxs: *const usize, num_attrs: usize, s: Handle);
    cuMemcpy3DBatchAsync_ptsz => cuMemcpy3DBatchAsync(n: usize, ops: *const Batch3DOp, fail: *mut usize, flags: u64, s: Handle);
    cuMemcpy3DBatchAsync_v2_ptsz => cuMemcpy3DBatchAsync_v2(n: usize, ops: *const Batch3DOp, flags: u64, s: Handle);
}
