//! Plain device memory, pitch, managed, host memory, copies, address queries and arrays.

use crate::api_graph::graph_free;
use crate::api_pool::pool_free;
use crate::driver::*;
use crate::mem::Kind;
use crate::types::*;
use std::ffi::{c_int, c_uint, c_void};

const ARRAY_ALIGN: u64 = 64 << 10;

/// Allocates `size` bytes of kind `kind` on the current context's device, charging `size`.
pub fn alloc_charged(d: &Driver, size: u64, kind: Kind) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let (ctx, _, phys) = current(d)?;
    d.charge(phys, size)?;
    let addr = lock(&d.mem).alloc(phys, d.shared.total(phys), size, kind, ctx, size, 0);
    addr.ok_or_else(|| {
        d.refund(phys, size);
        OUT_OF_MEMORY
    })
}

/// Managed memory: resident on the device while the device has room for it, otherwise on the host (the
/// real driver pages it; here it simply holds no device bytes), so managed allocations may sum past the
/// device's size (one process's addresses still end at twice the device).
pub fn alloc_managed(d: &Driver, size: u64) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(INVALID_VALUE);
    }
    let (ctx, _, phys) = current(d)?;
    let charged = if d.charge(phys, size).is_ok() {
        size
    } else {
        0
    };
    let addr = lock(&d.mem).alloc(
        phys,
        d.shared.total(phys),
        size,
        Kind::Managed,
        ctx,
        charged,
        0,
    );
    match addr {
        Some(p) => {
            crate::paging::note(&d.shared, phys, size, charged, true);
            Ok(p)
        }
        None => {
            d.refund(phys, charged);
            Err(OUT_OF_MEMORY)
        }
    }
}

/// Frees a device pointer of any kind; CUDA_ERROR_INVALID_VALUE when it is not an allocation's start.
pub fn free_ptr(d: &Driver, p: u64) -> R {
    let mut mem = lock(&d.mem);
    let a = mem.release_if(p, |a| {
        matches!(a.kind, Kind::Data | Kind::Pitch | Kind::Managed)
    });
    drop(mem);
    match a {
        Ok(a) => {
            if a.kind == Kind::Managed {
                crate::paging::note(&d.shared, a.phys, a.size, a.charged, false);
                d.refund_away(&a);
            }
            // Shared through legacy IPC: the memory stays the process's until it ends (an H200's). Another
            // process's memory imported here (a pool pointer) is counted here only once its exporter ended.
            if !lock(&d.objs).ipc.remove(&p) && !crate::api_ipc::forget_opened(d, p) {
                d.refund(a.phys, a.charged);
            }
            Ok(())
        }
        Err(Some(kind)) => {
            // Pool and graph memory are accounted by their owner, under the objects lock.
            let mut objs = lock(&d.objs);
            if kind == Kind::Pool {
                pool_free(d, &mut objs, p)
            } else {
                graph_free(d, &mut objs, p)
            }
        }
        Err(None) => Err(INVALID_VALUE),
    }
}

fn element_size(format: u32) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// Bytes the fake takes for an array of these dimensions (all mip levels when `levels` > 1).
pub fn array_bytes(
    w: u64,
    h: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> Result<u64, CUresult> {
    let elem = element_size(format).ok_or(INVALID_VALUE)?;
    if w == 0 || !matches!(channels, 1 | 2 | 4) || levels == 0 {
        return Err(INVALID_VALUE);
    }
    let mut total = 0u64;
    for l in 0..levels {
        let (lw, lh, ld) = ((w >> l).max(1), (h >> l).max(1), (depth >> l).max(1));
        total = total
            .checked_add(
                lw.checked_mul(lh)
                    .and_then(|x| x.checked_mul(ld))
                    .and_then(|x| x.checked_mul(elem * channels as u64))
                    .ok_or(INVALID_VALUE)?,
            )
            .ok_or(INVALID_VALUE)?;
    }
    Ok(round_up(total, ARRAY_ALIGN))
}

fn create_array(
    d: &Driver,
    desc: [u64; 3],
    format: u32,
    channels: u32,
    flags: u32,
    levels: u32,
) -> Result<Handle, CUresult> {
    let mut bytes = array_bytes(desc[0], desc[1], desc[2], format, channels, levels)?;
    // CUDA_ARRAY3D_SPARSE, CUDA_ARRAY3D_DEFERRED_MAPPING: no memory until tiles are mapped onto VMM memory
    if flags & (0x40 | 0x80) != 0 {
        bytes = 0;
    }
    let (_, _, phys) = current(d)?;
    d.charge(phys, bytes)?;
    let h = new_handle();
    lock(&d.objs).arrays.insert(
        h,
        Array {
            phys,
            bytes,
            desc,
            format,
            channels,
            flags,
            mipmap: levels > 1 || flags & 0x100 != 0,
            tiles: Vec::new(),
        },
    );
    Ok(h)
}

fn destroy_array(d: &Driver, h: Handle, mipmap: bool) -> R {
    let mut objs = lock(&d.objs);
    match objs.arrays.get(&h) {
        Some(a) if a.mipmap == mipmap => {
            let a = objs.arrays.remove(&h).unwrap();
            d.refund(a.phys, a.bytes);
            for (_, t) in a.tiles {
                crate::api_vmm::unref(d, &mut objs, t);
            }
            Ok(())
        }
        _ => Err(INVALID_HANDLE),
    }
}

#[repr(C)]
pub struct ArrayDesc {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

#[repr(C)]
pub struct Array3DDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

#[repr(C)]
pub struct MemReq {
    size: usize,
    alignment: usize,
    reserved: [c_uint; 4],
}

cu_fn! {
fn cuMemAlloc_v2(dptr: *mut u64, size: usize) {
    let d = drv()?;
    crate::api_vmm::sweep_kept(d);
    if dptr.is_null() { return Err(INVALID_VALUE); }
    out(dptr, alloc_charged(d, size as u64, Kind::Data)?)
}

fn cuMemAlloc(_dptr: *mut c_uint, _size: c_uint) {
    // 32-bit device pointers cannot address this process's device ranges.
    drv()?;
    Err(NOT_SUPPORTED)
}

fn cuMemFree_v2(p: u64) {
    let d = drv()?;
    if p == 0 { return Ok(()); }
    free_ptr(d, p)
}

fn cuMemFree(p: c_uint) {
    let d = drv()?;
    if p == 0 { return Ok(()); }
    free_ptr(d, p as u64)
}

// A dma-buf descriptor of device memory (CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 1): one of /dev/null stands for
// it. The allocation it covers is kept past its free until the process ends, as an H200 keeps it.
fn cuMemGetHandleForAddressRange(handle: *mut c_int, p: u64, size: usize, ty: c_int, _flags: u64) {
    let d = drv()?;
    if handle.is_null() || size == 0 || ty != 1 { return Err(INVALID_VALUE); }
    let mut mem = lock(&d.mem);
    let (start, a) = mem.find(p, size as u64).ok_or(INVALID_VALUE)?;
    if !matches!(a.kind, Kind::Data | Kind::Pitch) { return Err(INVALID_VALUE); }
    drop(mem);
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 { return Err(UNKNOWN); }
    lock(&d.objs).ipc.insert(start);
    out(handle, fd)
}

fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
    let d = drv()?;
    if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 || !matches!(elem, 4 | 8 | 16) {
        return Err(INVALID_VALUE);
    }
    let p = round_up(width as u64, 512);
    let bytes = p.checked_mul(height as u64).ok_or(INVALID_VALUE)?;
    let a = alloc_charged(d, bytes, Kind::Pitch)?;
    out(pitch, p as usize)?;
    out(dptr, a)
}

fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) {
    let d = drv()?;
    if dptr.is_null() || !matches!(flags, 1 | 2) { return Err(INVALID_VALUE); }
    out(dptr, alloc_managed(d, size as u64)?)
}

fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
    let d = drv()?;
    crate::api_vmm::sweep_kept(d);
    if free.is_null() || total.is_null() { return Err(INVALID_VALUE); }
    let (_, _, phys) = current(d)?;
    let t = d.shared.total(phys);
    out(free, t.saturating_sub(d.shared.used(phys)) as usize)?;
    out(total, t as usize)
}

fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) {
    let d = drv()?;
    if free.is_null() || total.is_null() { return Err(INVALID_VALUE); }
    let (_, _, phys) = current(d)?;
    let t = d.shared.total(phys);
    out(free, t.saturating_sub(d.shared.used(phys)).min(u32::MAX as u64) as c_uint)?;
    out(total, t.min(u32::MAX as u64) as c_uint)
}

fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
    cuMemHostAlloc_impl(pp, size, 0)
}

fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) {
    cuMemHostAlloc_impl(pp, size, 0)
}

fn cuMemAllocHost(pp: *mut *mut c_void, size: c_uint) {
    cuMemHostAlloc_impl(pp, size as usize, 0)
}

fn cuMemFreeHost(p: *mut c_void) {
    let d = drv()?;
    let len = lock(&d.mem).host.remove(&(p as usize)).ok_or(INVALID_VALUE)?;
    libc::munmap(p, len);
    Ok(())
}

fn cuMemHostGetDevicePointer_v2(dptr: *mut u64, p: *mut c_void, _flags: c_uint) {
    let d = drv()?;
    let mem = lock(&d.mem);
    let ok = mem.host.iter().any(|(&s, &l)| (p as usize) >= s && (p as usize) < s + l);
    if !ok { return Err(INVALID_VALUE); }
    out(dptr, p as u64)
}

fn cuMemHostRegister_v2(p: *mut c_void, size: usize, _flags: c_uint) {
    // Pinning host memory takes no device memory; the range becomes known as host memory.
    let d = drv()?;
    if p.is_null() || size == 0 { return Err(INVALID_VALUE); }
    current(d)?;
    lock(&d.mem).registered.insert(p as usize, size);
    Ok(())
}

fn cuMemHostUnregister(p: *mut c_void) {
    let d = drv()?;
    lock(&d.mem).registered.remove(&(p as usize)).map(|_| ()).ok_or(INVALID_VALUE)
}

fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, dst, n, true)?;
    if n > 0 && src.is_null() { return Err(INVALID_VALUE); }
    std::ptr::copy(src as *const u8, dst as *mut u8, n);
    crate::timeline::transfer(d, n as u64, since);
    Ok(())
}

fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, src, n, false)?;
    if n > 0 && dst.is_null() { return Err(INVALID_VALUE); }
    std::ptr::copy(src as *const u8, dst as *mut u8, n);
    crate::timeline::transfer(d, n as u64, since);
    Ok(())
}

fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, src, n, false)?;
    check_dev(d, dst, n, true)?;
    std::ptr::copy(src as *const u8, dst as *mut u8, n);
    crate::timeline::transfer(d, n as u64, since);
    Ok(())
}

fn cuMemcpy(dst: u64, src: u64, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    if n > 0 && (dst == 0 || src == 0) { return Err(INVALID_VALUE); }
    std::ptr::copy(src as *const u8, dst as *mut u8, n);
    crate::timeline::transfer(d, n as u64, since);
    Ok(())
}

fn cuMemcpyAsync(dst: u64, src: u64, n: usize, _s: Handle) { cuMemcpy_impl(dst, src, n) }
fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, _s: Handle) { res(cuMemcpyHtoD_v2(dst, src, n)) }
fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, _s: Handle) { res(cuMemcpyDtoH_v2(dst, src, n)) }
fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, _s: Handle) { res(cuMemcpyDtoD_v2(dst, src, n)) }

fn cuMemsetD8_v2(dst: u64, v: u8, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, dst, n, true)?;
    std::ptr::write_bytes(dst as *mut u8, v, n);
    crate::timeline::transfer(d, n as u64, since);
    Ok(())
}

fn cuMemsetD16_v2(dst: u64, v: u16, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, dst, n * 2, true)?;
    std::slice::from_raw_parts_mut(dst as *mut u16, n).fill(v);
    crate::timeline::transfer(d, (n * 2) as u64, since);
    Ok(())
}

fn cuMemsetD32_v2(dst: u64, v: u32, n: usize) {
    let d = drv()?;
    let since = crate::timeline::call_start();
    check_dev(d, dst, n * 4, true)?;
    std::slice::from_raw_parts_mut(dst as *mut u32, n).fill(v);
    crate::timeline::transfer(d, (n * 4) as u64, since);
    Ok(())
}

// The unversioned 32-bit-pointer entry points (CUDA 2.x's ABI, still exported): memory placed below 4 GiB
// (`cuMemAddressReserve` at a low address) is within their reach.
fn cuMemsetD8(dst: c_uint, v: u8, n: c_uint) { res(cuMemsetD8_v2(dst as u64, v, n as usize)) }
fn cuMemcpyDtoD(dst: c_uint, src: c_uint, n: c_uint) { res(cuMemcpyDtoD_v2(dst as u64, src as u64, n as usize)) }

fn cuMemsetD8Async(dst: u64, v: u8, n: usize, _s: Handle) { res(cuMemsetD8_v2(dst, v, n)) }
fn cuMemsetD32Async(dst: u64, v: u32, n: usize, _s: Handle) { res(cuMemsetD32_v2(dst, v, n)) }

fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, p: u64) {
    let d = drv()?;
    let mut mem = lock(&d.mem);
    let (start, a) = mem.find(p, 0).ok_or(NOT_FOUND)?;
    if !base.is_null() { out(base, start)?; }
    if !size.is_null() { out(size, a.size as usize)?; }
    Ok(())
}

fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, p: u64) {
    let d = drv()?;
    if data.is_null() { return Err(INVALID_VALUE); }
    let mut mem = lock(&d.mem);
    let Some((start, a)) = mem.find(p, 0) else {
        let host = mem.host.iter().find(|(&s, &l)| (p as usize) >= s && (p as usize) < s + l).map(|(&s, &l)| (s, l));
        let (s, l) = host.ok_or(INVALID_VALUE)?;
        return match attr {
            2 => out(data as *mut c_uint, 1),
            3 | 4 => out(data as *mut u64, p),
            8 => out(data as *mut u8, 0),
            11 => out(data as *mut u64, s as u64),
            12 => out(data as *mut usize, l),
            _ => Err(INVALID_VALUE),
        };
    };
    let a = a.clone();
    drop(mem);
    match attr {
        1 => out(data as *mut Handle, a.ctx),
        2 => out(data as *mut c_uint, 2),
        3 => out(data as *mut u64, p),
        4 if a.kind == Kind::Managed => out(data as *mut u64, p),
        8 => out(data as *mut u8, (a.kind == Kind::Managed) as u8),
        9 => out(data as *mut c_int, d.ordinal(a.phys) as c_int),
        11 => out(data as *mut u64, start),
        12 => out(data as *mut usize, a.size as usize),
        17 => out(data as *mut Handle, a.pool),
        _ => Err(INVALID_VALUE),
    }
}

fn cuArrayCreate_v2(arr: *mut Handle, desc: *const ArrayDesc) {
    let d = drv()?;
    if arr.is_null() || desc.is_null() { return Err(INVALID_VALUE); }
    let x = &*desc;
    out(arr, create_array(d, [x.width as u64, x.height as u64, 0], x.format, x.channels, 0, 1)?)
}

fn cuArray3DCreate_v2(arr: *mut Handle, desc: *const Array3DDesc) {
    let d = drv()?;
    if arr.is_null() || desc.is_null() { return Err(INVALID_VALUE); }
    let x = &*desc;
    out(arr, create_array(d, [x.width as u64, x.height as u64, x.depth as u64], x.format, x.channels, x.flags, 1)?)
}

fn cuArrayDestroy(arr: Handle) { destroy_array(drv()?, arr, false) }

fn cuMipmappedArrayCreate(arr: *mut Handle, desc: *const Array3DDesc, levels: c_uint) {
    let d = drv()?;
    if arr.is_null() || desc.is_null() { return Err(INVALID_VALUE); }
    let x = &*desc;
    let h = create_array(d, [x.width as u64, x.height as u64, x.depth as u64], x.format, x.channels, x.flags | 0x100, levels)?;
    out(arr, h)
}

fn cuMipmappedArrayDestroy(arr: Handle) { destroy_array(drv()?, arr, true) }

fn cuArrayGetMemoryRequirements(req: *mut MemReq, arr: Handle, dev: CUdevice) {
    array_requirements(req, arr, dev, false)
}

fn cuMipmappedArrayGetMemoryRequirements(req: *mut MemReq, arr: Handle, dev: CUdevice) {
    array_requirements(req, arr, dev, true)
}

fn cuArrayGetDescriptor_v2(desc: *mut ArrayDesc, arr: Handle) {
    let d = drv()?;
    let objs = lock(&d.objs);
    let a = objs.arrays.get(&arr).filter(|a| !a.mipmap).ok_or(INVALID_HANDLE)?;
    out(desc, ArrayDesc { width: a.desc[0] as usize, height: a.desc[1] as usize, format: a.format, channels: a.channels })
}

fn cuArray3DGetDescriptor_v2(desc: *mut Array3DDesc, arr: Handle) {
    let d = drv()?;
    let objs = lock(&d.objs);
    let a = objs.arrays.get(&arr).filter(|a| !a.mipmap).ok_or(INVALID_HANDLE)?;
    out(desc, Array3DDesc { width: a.desc[0] as usize, height: a.desc[1] as usize, depth: a.desc[2] as usize, format: a.format, channels: a.channels, flags: a.flags })
}
}

unsafe fn array_requirements(req: *mut MemReq, arr: Handle, dev: CUdevice, mipmap: bool) -> R {
    let d = drv()?;
    d.phys(dev)?;
    let objs = lock(&d.objs);
    let a = objs
        .arrays
        .get(&arr)
        .filter(|a| a.mipmap == mipmap)
        .ok_or(INVALID_HANDLE)?;
    out(
        req,
        MemReq {
            size: a.bytes as usize,
            alignment: ARRAY_ALIGN as usize,
            reserved: [0; 4],
        },
    )
}

unsafe fn cuMemHostAlloc_impl(pp: *mut *mut c_void, size: usize, _flags: c_uint) -> R {
    let d = drv()?;
    if pp.is_null() || size == 0 {
        return Err(INVALID_VALUE);
    }
    current(d)?;
    let p = crate::mem::map_noreserve(size as u64).ok_or(OUT_OF_MEMORY)?;
    lock(&d.mem).host.insert(p as usize, size);
    out(pp, p as *mut c_void)
}

unsafe fn cuMemcpy_impl(dst: u64, src: u64, n: usize) -> R {
    res(cuMemcpy(dst, src, n))
}

/// A CUresult as an `R`.
pub fn res(r: CUresult) -> R {
    if r == SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

cu_alias! {
    cuMemcpyHtoD_v2_ptds => cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2_ptds => cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize);
    cuMemcpyDtoD_v2_ptds => cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize);
    cuMemcpy_ptds => cuMemcpy(dst: u64, src: u64, n: usize);
    cuMemcpyAsync_ptsz => cuMemcpyAsync(dst: u64, src: u64, n: usize, s: Handle);
    cuMemcpyHtoDAsync_v2_ptsz => cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: Handle);
    cuMemcpyDtoHAsync_v2_ptsz => cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: Handle);
    cuMemcpyDtoDAsync_v2_ptsz => cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, s: Handle);
    cuMemsetD8_v2_ptds => cuMemsetD8_v2(dst: u64, v: u8, n: usize);
    cuMemsetD16_v2_ptds => cuMemsetD16_v2(dst: u64, v: u16, n: usize);
    cuMemsetD32_v2_ptds => cuMemsetD32_v2(dst: u64, v: u32, n: usize);
    cuMemsetD8Async_ptsz => cuMemsetD8Async(dst: u64, v: u8, n: usize, s: Handle);
    cuMemsetD32Async_ptsz => cuMemsetD32Async(dst: u64, v: u32, n: usize, s: Handle);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        // 1024 x 1024 floats, one channel: exactly 4 MiB.
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 1, 1), Ok(4 << 20));
        // Rounded up to 64 KiB.
        assert_eq!(array_bytes(10, 0, 0, 0x01, 1, 1), Ok(64 << 10));
        // Mip levels: 256^2 + 128^2 + 64^2 + 32^2 floats = 349520 bytes -> 384 KiB.
        assert_eq!(array_bytes(256, 256, 0, 0x20, 1, 4), Ok(384 << 10));
        assert_eq!(array_bytes(0, 1, 1, 0x20, 1, 1), Err(INVALID_VALUE));
        assert_eq!(array_bytes(1, 1, 1, 0x20, 3, 1), Err(INVALID_VALUE));
        assert_eq!(array_bytes(1, 1, 1, 0x77, 1, 1), Err(INVALID_VALUE));
        assert_eq!(array_bytes(u64::MAX, 2, 1, 0x20, 4, 1), Err(INVALID_VALUE));
    }
}

// A stream-ordered free is a free at the stream's turn: here, at once (pool memory back to its pool,
// graph memory to its graph, plain memory freed).
cu_fn! {
fn cuMemFreeAsync(p: u64, stream: Handle) {
    let d = drv()?;
    stream_phys(d, &lock(&d.objs), stream)?;
    free_ptr(d, p)
}
}

cu_alias! {
    cuMemFreeAsync_ptsz => cuMemFreeAsync(p: u64, stream: Handle);
}
