//! Plain, pitch and managed device memory: `cuMemAlloc*`, `cuMemAllocPitch*`, `cuMemAllocManaged` and
//! `cuMemFree*`. Charged before the driver call; pitch is estimated then trued up. Pools live in `pools`;
//! managed memory's charges on the process's other devices in `managed`.
//!
//! The unified-memory modes (`vgpu_ledger::memmode`) act here, on plain and pitch allocations only:
//! * spill: served by the driver within the quota as in plain mode; one that the quota (or the device)
//!   refuses is served as managed memory preferring the host, charged to the spill budget (`spill`).
//! * oversubscribe: every one is managed memory, charged to the quota as device memory.
//!
//! A pitch allocation served as managed memory gets rows padded to `virt::PITCH_ALIGN_ESTIMATE`.
//! `cuIpcGetMemHandle` of memory served as managed is refused with CUDA_ERROR_NOT_SUPPORTED.
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::c_uint;

use vgpu_ledger::{Kind, MemoryMode};

use super::common::{hook, interposer, Interposer, Target};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::log;
use crate::quota::DeviceQuota;
use crate::real_symbols::forward;
use crate::records::Rec;
use crate::virt;

/// Spill mode's room for lazily loaded code: 1/16 of the quota, at most 256 MiB (PyTorch's and NCCL's
/// kernels took ~260 MiB per process on an H200; an H100 run with the device part full went 81 MiB past
/// its quota without it: docs/gpu-results.md).
pub(crate) fn code_room(limit: u64) -> u64 {
    (limit / 16).min(256 << 20)
}

impl<D: Driver> Interposer<'_, D> {
    /// A plain allocation of `bytes` in the current context, served as its device's memory mode says.
    /// `call`: the driver's own allocation (writes the caller's pointer), `read`: that pointer; `write`
    /// stores a pointer served as managed memory into the caller's out-parameter.
    pub(crate) fn alloc_plain(
        &self,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
        write: impl FnOnce(u64),
    ) -> CUresult {
        let tgt = self.target_current();
        let (q, dev, ctx) = match tgt {
            (Target::Charge(q), dev, ctx) => (q, dev, ctx),
            _ => return self.charged_call(&self.rec.allocs, Kind::Data, bytes, tgt, call, read),
        };
        match q.memory {
            MemoryMode::Oversubscribe { .. } => {
                let got = Cell::new(0);
                let managed = || match self.drv.alloc_managed(bytes, dev, false) {
                    Ok(p) => {
                        got.set(p);
                        write(p);
                        CUDA_SUCCESS
                    }
                    Err(e) => e,
                };
                let served = |r| Rec {
                    served_managed: true,
                    ..r
                };
                self.charged(
                    &self.rec.allocs,
                    Kind::Data,
                    bytes,
                    tgt,
                    managed,
                    || got.get(),
                    served,
                )
            }
            MemoryMode::Spill { .. } => {
                let r = if self.device_leaves_code_room(q, dev, bytes) {
                    self.charged_call(&self.rec.allocs, Kind::Data, bytes, tgt, call, read)
                } else {
                    CUDA_ERROR_OUT_OF_MEMORY
                };
                if r != CUDA_ERROR_OUT_OF_MEMORY {
                    return r;
                }
                self.spill(q, dev, ctx, bytes).map_or_else(
                    |e| e,
                    |p| {
                        write(p);
                        CUDA_SUCCESS
                    },
                )
            }
            MemoryMode::Plain => {
                self.charged_call(&self.rec.allocs, Kind::Data, bytes, tgt, call, read)
            }
        }
    }

    /// Spill mode: whether `bytes` more of device memory leave the quota room for the code the driver
    /// loads lazily at kernels' first use. No hook sees that code; the truth-up charges it afterwards
    /// (`hooks/truth`), when the quota may already be full — in spill mode it always is, the device part
    /// being used to the brim before the rest spills — so NVML's figure would pass the quota by the code's
    /// size. The room is [`code_room`] of the quota, less what the truth-up already charged this process
    /// on the device. Checked before the charge (the charge itself still holds the quota).
    fn device_leaves_code_room(&self, q: &DeviceQuota, dev: CUdevice, bytes: u64) -> bool {
        let charged = self
            .rec
            .truth_charged
            .with(dev as u64, |c| c.map_or(0, |c| *c));
        let room = code_room(q.limit()).saturating_sub(charged);
        q.used().saturating_add(bytes).saturating_add(room) <= q.limit()
    }

    /// `alloc_pitch_device` in spill mode: refused (so spilled) when it would take the code's room.
    fn spill_pitch_device(
        &self,
        w: u64,
        h: u64,
        call: impl FnOnce() -> CUresult,
        read: impl Fn() -> (u64, u64),
    ) -> CUresult {
        let (q, dev) = match self.target_current() {
            (Target::Charge(q), dev, _) => (q, dev),
            _ => return self.alloc_pitch_device(w, h, call, read),
        };
        if !self.device_leaves_code_room(q, dev, virt::pitch_estimate(w, h)) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        self.alloc_pitch_device(w, h, call, read)
    }

    /// Spill mode, past the quota (or the device's memory): `bytes` of managed memory preferring the
    /// host, charged to the spill budget and recorded as spilled (its free refunds the budget). Out of
    /// memory past the budget; the driver's error if it refuses.
    fn spill(
        &self,
        q: &DeviceQuota,
        dev: CUdevice,
        ctx: usize,
        bytes: u64,
    ) -> Result<u64, CUresult> {
        if !q.charge_spill(bytes) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        match self.drv.alloc_managed(bytes, dev, true) {
            Ok(p) => {
                let rec = Rec {
                    spilled: true,
                    served_managed: true,
                    ..Rec::new(dev, Kind::Data, bytes, ctx)
                };
                self.rec.allocs.insert(p, rec);
                Ok(p)
            }
            Err(e) => {
                q.refund_spill(bytes);
                Err(e)
            }
        }
    }

    /// A pitch allocation of `w` x `h`, served as the device's memory mode says (`alloc_plain`); in plain
    /// mode (and within the quota in spill mode) charged at an estimate, then trued up to pitch x rows.
    /// `read` returns what the driver wrote to the caller's out-parameters: (pointer, pitch); `write`
    /// stores a managed allocation's (pointer, pitch) there.
    pub(crate) fn alloc_pitch(
        &self,
        w: u64,
        h: u64,
        call: impl FnOnce() -> CUresult,
        read: impl Fn() -> (u64, u64),
        write: impl FnOnce(u64, u64),
    ) -> CUresult {
        let q = match self.target_current().0 {
            Target::Charge(q) => Some(q),
            _ => None,
        };
        let pitch = w.div_ceil(virt::PITCH_ALIGN_ESTIMATE) * virt::PITCH_ALIGN_ESTIMATE;
        let managed_bytes = pitch.saturating_mul(h.max(1));
        match q.map(|q| q.memory) {
            Some(MemoryMode::Oversubscribe { .. }) => self.alloc_plain(
                managed_bytes,
                || CUDA_ERROR_UNKNOWN,
                || 0,
                |p| write(p, pitch),
            ),
            Some(MemoryMode::Spill { .. }) => match self.spill_pitch_device(w, h, call, read) {
                CUDA_ERROR_OUT_OF_MEMORY => {
                    let (q, dev, ctx) = match self.target_current() {
                        (Target::Charge(q), dev, ctx) => (q, dev, ctx),
                        _ => return CUDA_ERROR_OUT_OF_MEMORY,
                    };
                    self.spill(q, dev, ctx, managed_bytes).map_or_else(
                        |e| e,
                        |p| {
                            write(p, pitch);
                            CUDA_SUCCESS
                        },
                    )
                }
                r => r,
            },
            _ => self.alloc_pitch_device(w, h, call, read),
        }
    }

    /// A pitch allocation by the driver: charged at an estimate, then trued up to pitch x rows.
    pub(crate) fn alloc_pitch_device(
        &self,
        w: u64,
        h: u64,
        call: impl FnOnce() -> CUresult,
        read: impl Fn() -> (u64, u64),
    ) -> CUresult {
        let r = self.charged_call(
            &self.rec.allocs,
            Kind::Data,
            virt::pitch_estimate(w, h),
            self.target_current(),
            call,
            || read().0,
        );
        if r != CUDA_SUCCESS {
            return r;
        }
        let (p, pitch) = read();
        if !self.true_up(&self.rec.allocs, p, pitch.saturating_mul(h.max(1))) {
            self.undo(&self.rec.allocs, p, || self.drv.mem_free(p));
            return Error::OutOfMemory.cuda();
        }
        r
    }
}

hook!(cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
    let call = || forward!("cuMemAlloc_v2", fn(*mut CUdeviceptr, usize), dptr, bytes);
    if dptr.is_null() {
        return call();
    }
    // SAFETY: dptr is non-null; read after the driver wrote it, written only with a pointer we got.
    interposer().alloc_plain(bytes as u64, call, || unsafe { *dptr }, |p| unsafe { *dptr = p })
});

hook!(cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytes: c_uint) {
    let call = || forward!("cuMemAlloc", fn(*mut CUdeviceptr_v1, c_uint), dptr, bytes);
    if dptr.is_null() {
        return call();
    }
    // 32-bit pointers cannot hold managed memory's addresses: the memory modes leave this one plain.
    let e = interposer();
    // SAFETY: as above.
    e.charged_call(&e.rec.allocs, Kind::Data, bytes as u64, e.target_current(), call, || unsafe { *dptr } as u64)
});

hook!(cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) {
    let call = || forward!("cuMemAllocManaged", fn(*mut CUdeviceptr, usize, c_uint), dptr, bytes, flags);
    if dptr.is_null() {
        return call();
    }
    // SAFETY: as above (read only after the driver succeeded).
    interposer().alloc_managed(bytes as u64, call, || unsafe { *dptr })
});

hook!(cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, w: usize, h: usize, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch_v2", fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    // SAFETY: both non-null; read only after the driver succeeded and wrote them, written only with an
    // allocation we got.
    interposer().alloc_pitch(w as u64, h as u64, call, || unsafe { (*dptr, *pitch as u64) }, |p, w| unsafe {
        *dptr = p;
        *pitch = w as usize;
    })
});

hook!(cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, w: c_uint, h: c_uint, elem: c_uint) {
    let call = || forward!("cuMemAllocPitch", fn(*mut CUdeviceptr_v1, *mut c_uint, c_uint, c_uint, c_uint), dptr, pitch, w, h, elem);
    if dptr.is_null() || pitch.is_null() {
        return call();
    }
    // Plain whatever the memory mode, as cuMemAlloc above.
    // SAFETY: as above.
    interposer().alloc_pitch_device(w as u64, h as u64, call, || unsafe { (*dptr as u64, *pitch as u64) })
});

impl<D: Driver> Interposer<'_, D> {
    /// `cuIpcGetMemHandle`: memory a memory mode served as managed (the application asked for device
    /// memory) cannot be shared through CUDA IPC, which is defined for device memory only. Refused here
    /// with one documented error, whatever the driver would answer: CUDA_ERROR_NOT_SUPPORTED.
    /// `read` gives the handle the driver wrote: its mark is held for the rest of the process (`hooks/ipc`).
    pub(crate) fn ipc_handle(
        &self,
        p: CUdeviceptr,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> CUipcMemHandle,
    ) -> CUresult {
        if self
            .rec
            .allocs
            .with(p, |r| r.is_some_and(|r| r.served_managed))
        {
            log::warn(format_args!(
                "cuIpcGetMemHandle: 0x{p:x} was served as managed memory (memory mode spill or \
                 oversubscribe); CUDA IPC shares device memory only: CUDA_ERROR_NOT_SUPPORTED"
            ));
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        let r = call();
        if r == CUDA_SUCCESS && !self.drv.unlimited() {
            // Only memory this process holds charged is marked (on its own device): a mark on memory it
            // never charged would let an open of it in this container go charged to nobody.
            if let Some(dev) = self.exported(p) {
                self.ipc_mark(dev, &read());
            }
        }
        r
    }

    /// `cuMemGetHandleForAddressRange`: a dma-buf descriptor of `[p, p + size)` keeps the memory it covers
    /// past its free (as a legacy IPC export does): every allocation and VMM handle mapped there that it
    /// covers stays charged until the process ends (`Rec::exported`, `VmmRec::exported`).
    pub(crate) fn range_exported(
        &self,
        p: CUdeviceptr,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r != CUDA_SUCCESS || self.drv.unlimited() {
            return r;
        }
        let end = p.saturating_add(size.max(1));
        for k in self.rec.allocs.keys() {
            self.rec.allocs.with(k, |r| {
                if let Some(r) = r.filter(|r| k < end && p < k.saturating_add(r.bytes.max(1))) {
                    r.exported = true;
                }
            });
        }
        for k in self.rec.vmm_maps.keys() {
            let Some(m) = self.rec.vmm_maps.with(k, |m| m.copied()) else {
                continue;
            };
            if m.ptr < end && p < m.ptr.saturating_add(m.size) {
                self.rec.vmm.with(m.handle, |v| {
                    if let Some(v) = v {
                        v.exported = true;
                    }
                });
            }
        }
        r
    }

    /// The allocation holding `p` was shared (legacy IPC, a pool's exported pointer): its free will not refund it
    /// (`Rec::exported`).
    /// The driver exports from the base; an interior pointer it accepted marks its allocation all the same.
    /// Returns the allocation's device, when it is one of ours.
    pub(crate) fn exported(&self, p: CUdeviceptr) -> Option<CUdevice> {
        let mark = |k: u64| {
            self.rec.allocs.with(k, |r| match r {
                Some(r) if p >= k && p - k < r.bytes.max(1) => {
                    r.exported = true;
                    Some(r.dev)
                }
                _ => None,
            })
        };
        mark(p).or_else(|| {
            self.rec
                .allocs
                .keys()
                .into_iter()
                .filter(|&k| k <= p)
                .find_map(mark)
        })
    }
}

hook!(cuMemGetHandleForAddressRange(handle: *mut std::ffi::c_void, p: CUdeviceptr, size: usize, ty: std::ffi::c_int, flags: std::ffi::c_ulonglong) {
    interposer().range_exported(p, size as u64, || forward!("cuMemGetHandleForAddressRange", fn(*mut std::ffi::c_void, CUdeviceptr, usize, std::ffi::c_int, std::ffi::c_ulonglong), handle, p, size, ty, flags))
});

hook!(cuIpcGetMemHandle(handle: *mut CUipcMemHandle, p: CUdeviceptr) {
    let call = || forward!("cuIpcGetMemHandle", fn(*mut CUipcMemHandle, CUdeviceptr), handle, p);
    if handle.is_null() {
        return call();
    }
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    interposer().ipc_handle(p, call, || unsafe { *handle })
});

hook!(cuMemFree_v2(p: CUdeviceptr) {
    let e = interposer();
    e.tracked_free(&e.rec.allocs, p, || forward!("cuMemFree_v2", fn(CUdeviceptr), p))
});

hook!(cuMemFree(p: CUdeviceptr_v1) {
    let e = interposer();
    e.tracked_free(&e.rec.allocs, p as u64, || forward!("cuMemFree", fn(CUdeviceptr_v1), p))
});

#[cfg(test)]
mod tests;
