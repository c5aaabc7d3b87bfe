//! What else holds a VMM handle's memory: the tiles of sparse arrays mapped onto it
//! (`cuMemMapArrayAsync`) and multicast objects it is bound to (`cuMulticastBindMem`,
//! `cuMulticastBindAddr`). Each takes a driver reference on the memory, so releasing the handle frees
//! nothing while a tile or a binding lives: each is one more reference on the handle's record
//! (`hooks/vmm`), taken before the driver call and given back when the tile is unmapped (an unmap of the
//! same region) or its array destroyed, and when the binding is unbound or its multicast object gone
//! (released and unmapped, and never exported: an exported object may live on in another process).
//! Memory imported from another process is charged by the union of what is bound of it, as by what is
//! mapped; a sparse-array tile of such memory is refused under a limit (a tile's size is the array's,
//! which the library does not know).
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_uint;

use vgpu_ledger::Kind;

use super::super::common::{hook, interposer, Interposer};
use crate::driver::Driver;
use crate::error::Error;
use crate::ffi::*;
use crate::real_symbols::forward;
use crate::records::{McBind, Rec, TileKey, VmmRec};

/// One entry of a `cuMemMapArrayAsync` list, as the policy reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TileMap {
    /// The sparse array or mipmapped array.
    pub resource: u64,
    pub key: TileKey,
    /// `CU_MEM_OPERATION_TYPE_MAP` or `_UNMAP`.
    pub op: i32,
    /// The VMM handle mapped (a map of a generic handle); 0 otherwise.
    pub handle: u64,
}

impl TileMap {
    pub(crate) fn of(m: &CUarrayMapInfo) -> TileMap {
        let s = m.subresource;
        let fields = if m.subresource_type == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL {
            // layer (the low half of the first word; the high half is padding), offset, size
            [s[0] & 0xffff_ffff, s[1], s[2], 0]
        } else {
            s
        };
        TileMap {
            resource: m.resource,
            key: TileKey {
                subresource: m.subresource_type as u32,
                fields,
            },
            op: m.mem_operation_type,
            handle: if m.mem_handle_type == 0 {
                m.mem_handle
            } else {
                0
            },
        }
    }
}

impl<D: Driver> Interposer<'_, D> {
    /// cuMemMapArrayAsync of `maps`. Each map of a tile onto a handle of ours is one more reference on
    /// it (taken before the call); an unmap of the same region of the same array gives the references of
    /// that region back. The driver's answer for a list of several may hide that some were made: a failed
    /// call of one entry changed nothing; of several, its maps count as made and its unmaps as not.
    pub(crate) fn array_map(&self, maps: &[TileMap], call: impl FnOnce() -> CUresult) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let is_map = |m: &&TileMap| m.op == CU_MEM_OPERATION_TYPE_MAP && m.handle != 0;
        if let Some(m) = maps.iter().filter(is_map).find(|m| self.imported(m.handle)) {
            crate::log::warn(format_args!(
                "quota: refused a sparse-array tile of imported VMM memory ({:#x}): its size is the \
                 array's, which the library cannot tell",
                m.handle
            ));
            return Error::OutOfMemory.cuda();
        }
        let taken: Vec<bool> = maps
            .iter()
            .map(|m| is_map(&m) && self.vmm_ref(m.handle))
            .collect();
        let r = call();
        let made = r == CUDA_SUCCESS || maps.len() > 1;
        for (m, &took) in maps.iter().zip(&taken) {
            if took && !made {
                self.vmm_unref(m.handle);
            } else if took {
                self.rec
                    .array_maps
                    .update(m.resource, Vec::new, |v| v.push((m.key, m.handle)));
            } else if m.op == CU_MEM_OPERATION_TYPE_UNMAP && r == CUDA_SUCCESS {
                let gone = self.rec.array_maps.with(m.resource, |v| {
                    v.map(|v| {
                        let (gone, keep) = v.drain(..).partition(|(k, _)| *k == m.key);
                        *v = keep;
                        gone
                    })
                });
                for (_, h) in gone.unwrap_or_default() {
                    self.vmm_unref(h);
                }
            }
        }
        r
    }

    /// A sparse array (or mipmapped array) `array` was destroyed: its tiles' references go.
    pub(crate) fn array_gone(&self, array: u64) {
        for (_, h) in self.rec.array_maps.remove(array).unwrap_or_default() {
            self.vmm_unref(h);
        }
    }

    /// Whether `handle` is an import of another process's memory.
    fn imported(&self, handle: u64) -> bool {
        self.rec.vmm.with(handle, |v| v.is_some_and(|v| v.imported))
    }

    /// cuMulticastCreate: `read` gives the object's handle. It is recorded like a VMM handle (mapped,
    /// retained, exported and released as one) holding no memory of its own.
    pub(crate) fn mc_create(
        &self,
        call: impl FnOnce() -> CUresult,
        read: impl FnOnce() -> u64,
    ) -> CUresult {
        let r = call();
        if r != CUDA_SUCCESS || self.drv.unlimited() {
            return r;
        }
        let h = read();
        // a handle value reused: what an exported object of that value kept bound stays held
        self.rec.mc_binds.remove(h);
        let mc = VmmRec {
            multicast: true,
            ..VmmRec::new(Rec::new(-1, Kind::Vmm, 0, 0))
        };
        self.rec.vmm.insert(h, mc);
        r
    }

    /// cuMulticastBindMem of `[offset, offset + size)` of `handle` at the object's `mc_offset`.
    pub(crate) fn mc_bind(
        &self,
        mc: u64,
        mc_offset: u64,
        handle: u64,
        offset: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        let (r, held) = self.held_by(handle, offset, size, call);
        if !held {
            return r;
        }
        let dev = self.rec.vmm.with(handle, |v| v.map_or(-1, |v| v.rec.dev));
        let b = McBind {
            mc_offset,
            dev,
            handle,
        };
        self.rec.mc_binds.update(mc, Vec::new, |v| v.push(b));
        r
    }

    /// cuMulticastBindAddr of the memory mapped at `addr`: as `mc_bind` of the handle mapped there (memory
    /// that is no VMM mapping of ours, such as a pool's, is charged where it was allocated).
    pub(crate) fn mc_bind_addr(
        &self,
        mc: u64,
        mc_offset: u64,
        addr: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if self.drv.unlimited() {
            return call();
        }
        match self.vmm_mapping_at(addr) {
            Some(m) => self.mc_bind(
                mc,
                mc_offset,
                m.handle,
                m.offset.saturating_add(addr - m.ptr),
                size,
                call,
            ),
            None => call(),
        }
    }

    /// cuMulticastUnbind of what device `dev`'s memory has bound at `[mc_offset, mc_offset + size)`.
    pub(crate) fn mc_unbind(
        &self,
        mc: u64,
        dev: CUdevice,
        mc_offset: u64,
        size: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r != CUDA_SUCCESS || self.drv.unlimited() {
            return r;
        }
        let end = mc_offset.saturating_add(size);
        let hit = |b: &McBind| b.dev == dev && b.mc_offset >= mc_offset && b.mc_offset < end;
        let gone = self.rec.mc_binds.with(mc, |v| {
            v.map(|v| {
                let (gone, keep): (Vec<McBind>, Vec<McBind>) = v.drain(..).partition(hit);
                *v = keep;
                gone
            })
        });
        for b in gone.unwrap_or_default() {
            self.vmm_unref(b.handle);
        }
        r
    }
}

/// The most entries of one `cuMemMapArrayAsync` list read under a limit (a program maps a handful; a
/// larger count is refused rather than read into memory: the driver would read it all too).
const MAX_TILES: c_uint = 1 << 16;

/// cuMemMapArrayAsync (`name`: which entry point) of the caller's list of `count` entries.
///
/// # Safety
/// `list` is null or points at `count` entries, as the driver API requires of the caller.
unsafe fn map_array(
    list: *mut CUarrayMapInfo,
    count: c_uint,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let e = interposer();
    if e.drv.unlimited() || list.is_null() {
        return call();
    }
    if count > MAX_TILES {
        crate::log::warn(format_args!(
            "quota: refused cuMemMapArrayAsync of {count} entries (at most {MAX_TILES} are followed)"
        ));
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null, `count` entries owned by the caller for the call (the function's contract).
    let maps: Vec<TileMap> = unsafe { std::slice::from_raw_parts(list, count as usize) }
        .iter()
        .map(TileMap::of)
        .collect();
    e.array_map(&maps, call)
}

hook!(cuMemMapArrayAsync(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) {
    let call = || forward!("cuMemMapArrayAsync", fn(*mut CUarrayMapInfo, c_uint, CUstream), list, count, stream);
    // SAFETY: the caller's list of `count` entries (or null, which the driver answers).
    unsafe { map_array(list, count, call) }
});

hook!(cuMemMapArrayAsync_ptsz(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) {
    let call = || forward!("cuMemMapArrayAsync_ptsz", fn(*mut CUarrayMapInfo, c_uint, CUstream), list, count, stream);
    // SAFETY: as above.
    unsafe { map_array(list, count, call) }
});

hook!(cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle, prop: *const std::ffi::c_void) {
    let call = || forward!("cuMulticastCreate", fn(*mut CUmemGenericAllocationHandle, *const std::ffi::c_void), handle, prop);
    if handle.is_null() {
        return call();
    }
    // SAFETY: non-null, written by the driver when it succeeded (read only then).
    interposer().mc_create(call, || unsafe { *handle })
});

hook!(cuMulticastBindMem(mc: CUmemGenericAllocationHandle, mc_offset: usize, mem: CUmemGenericAllocationHandle, mem_offset: usize, size: usize, flags: u64) {
    interposer().mc_bind(mc, mc_offset as u64, mem, mem_offset as u64, size as u64, || forward!("cuMulticastBindMem", fn(CUmemGenericAllocationHandle, usize, CUmemGenericAllocationHandle, usize, usize, u64), mc, mc_offset, mem, mem_offset, size, flags))
});

hook!(cuMulticastBindAddr(mc: CUmemGenericAllocationHandle, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: u64) {
    interposer().mc_bind_addr(mc, mc_offset as u64, ptr, size as u64, || forward!("cuMulticastBindAddr", fn(CUmemGenericAllocationHandle, usize, CUdeviceptr, usize, u64), mc, mc_offset, ptr, size, flags))
});

hook!(cuMulticastUnbind(mc: CUmemGenericAllocationHandle, dev: CUdevice, mc_offset: usize, size: usize) {
    interposer().mc_unbind(mc, dev, mc_offset as u64, size as u64, || forward!("cuMulticastUnbind", fn(CUmemGenericAllocationHandle, CUdevice, usize, usize), mc, dev, mc_offset, size))
});

#[cfg(test)]
mod tests;
