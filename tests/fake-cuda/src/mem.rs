//! Device addresses: per device, one large address range reserved with
//! `mmap(MAP_NORESERVE)` (untouched pages cost nothing) from which allocations are carved, so
//! device pointers can be read and written by cuMemcpy/cuMemset in this process; and the map
//! pointer -> allocation that cuMemFree, cuMemGetAddressRange and cuPointerGetAttribute use.

use crate::types::*;
use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;

const ALIGN: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Data,
    Pitch,
    Managed,
    /// From a stream-ordered pool (charged through the pool's reservation).
    Pool,
    /// Address of a graph memory node (charged through the device's graph reservation).
    Graph,
}

#[derive(Clone, Debug)]
pub struct Alloc {
    pub size: u64,
    pub block: u64,
    pub phys: usize,
    pub kind: Kind,
    pub ctx: Handle,
    /// Device bytes this allocation itself holds (0 for pool and graph memory).
    pub charged: u64,
    pub pool: Handle,
    pub touched: bool,
    /// Graph memory: allocated by a launch and not yet freed.
    pub live: bool,
    /// Managed memory: the other physical devices (a bit each) its pages were faulted onto by kernels
    /// there (`FAKE_CUDA_MANAGED_FAULTS`), each holding `size` bytes (`api_managed::fault_in`).
    pub away: u64,
    /// Managed memory advised read-mostly: a kernel elsewhere copies its pages, not moves them.
    pub read_mostly: bool,
}

struct Arena {
    base: u64,
    len: u64,
    bump: u64,
    free: HashMap<u64, Vec<u64>>,
}

pub struct Mem {
    arenas: Vec<Option<Arena>>,
    /// Allocation start -> allocation. A hash map: alloc and free are the hot path; lookups of
    /// interior pointers (copies, address ranges) fall back to a scan.
    pub allocs: HashMap<u64, Alloc>,
    /// cuMemAllocHost/cuMemHostAlloc memory: start -> length.
    pub host: HashMap<usize, usize>,
    /// cuMemHostRegister ranges: start -> length.
    pub registered: HashMap<usize, usize>,
}

impl Mem {
    pub fn new(ndev: usize) -> Mem {
        Mem {
            arenas: (0..ndev).map(|_| None).collect(),
            allocs: HashMap::default(),
            host: HashMap::default(),
            registered: HashMap::default(),
        }
    }

    /// Carves `size` bytes from device `phys`'s range (whose device has `total` bytes).
    fn carve(&mut self, phys: usize, total: u64, size: u64) -> Option<(u64, u64)> {
        let arena = match &mut self.arenas[phys] {
            Some(a) => a,
            slot => {
                // Twice the device plus slack: enough for any mix of sizes that fits the device.
                let len = round_up(total * 2 + (1 << 30), 2 << 20);
                let p = map_noreserve(len)?;
                slot.insert(Arena {
                    base: p,
                    len,
                    bump: 0,
                    free: HashMap::default(),
                })
            }
        };
        let block = round_up(size.max(1), ALIGN);
        if let Some(a) = arena.free.get_mut(&block).and_then(|v| v.pop()) {
            return Some((a, block));
        }
        if arena.bump + block <= arena.len {
            let a = arena.base + arena.bump;
            arena.bump += block;
            return Some((a, block));
        }
        // Out of fresh range: reuse any larger free block.
        let (&bsize, _) = arena
            .free
            .iter()
            .find(|(&s, v)| s >= block && !v.is_empty())?;
        let a = arena.free.get_mut(&bsize)?.pop()?;
        Some((a, bsize))
    }

    /// Allocates an address range and records it.
    pub fn alloc(
        &mut self,
        phys: usize,
        total: u64,
        size: u64,
        kind: Kind,
        ctx: Handle,
        charged: u64,
        pool: Handle,
    ) -> Option<u64> {
        let (addr, block) = self.carve(phys, total, size)?;
        self.allocs.insert(
            addr,
            Alloc {
                size,
                block,
                phys,
                kind,
                ctx,
                charged,
                pool,
                touched: false,
                live: kind != Kind::Graph,
                away: 0,
                read_mostly: false,
            },
        );
        Some(addr)
    }

    /// Releases the allocation at `addr` if `pred` holds for it; otherwise tells its kind
    /// (None: no allocation starts there).
    pub fn release_if(
        &mut self,
        addr: u64,
        pred: impl Fn(&Alloc) -> bool,
    ) -> Result<Alloc, Option<Kind>> {
        match self.allocs.entry(addr) {
            Entry::Occupied(e) if pred(e.get()) => {
                let a = e.remove();
                self.give_back(addr, &a);
                Ok(a)
            }
            Entry::Occupied(e) => Err(Some(e.get().kind)),
            Entry::Vacant(_) => Err(None),
        }
    }

    /// Forgets an allocation and gives its range back (its pages too, if they were written).
    pub fn release(&mut self, addr: u64) -> Option<Alloc> {
        let a = self.allocs.remove(&addr)?;
        self.give_back(addr, &a);
        Some(a)
    }

    fn give_back(&mut self, addr: u64, a: &Alloc) {
        if a.touched {
            // SAFETY: the range is inside our own arena mapping.
            unsafe {
                libc::madvise(
                    addr as *mut libc::c_void,
                    a.block as usize,
                    libc::MADV_DONTNEED,
                )
            };
        }
        if let Some(arena) = &mut self.arenas[a.phys] {
            arena.free.entry(a.block).or_default().push(addr);
        }
    }

    /// The allocation containing `[p, p+len)`, as (start, allocation).
    pub fn find(&mut self, p: u64, len: u64) -> Option<(u64, &mut Alloc)> {
        let end = p.checked_add(len)?;
        let start = if self.allocs.contains_key(&p) {
            p
        } else {
            *self
                .allocs
                .iter()
                .find(|(&s, a)| s <= p && p < s + a.size.max(1))?
                .0
        };
        let a = self.allocs.get_mut(&start)?;
        (end <= start + a.size.max(1)).then_some((start, a))
    }

    /// Frees every allocation of context `ctx`; returns what they were (the device bytes to refund, and
    /// the managed ones for the paging model).
    pub fn free_ctx(&mut self, ctx: Handle) -> Vec<Alloc> {
        let addrs: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| {
                a.ctx == ctx && matches!(a.kind, Kind::Data | Kind::Pitch | Kind::Managed)
            })
            .map(|(&k, _)| k)
            .collect();
        addrs.into_iter().filter_map(|k| self.release(k)).collect()
    }
}

/// Reserves `len` bytes of readable, writable address space that costs nothing until touched.
pub fn map_noreserve(len: u64) -> Option<u64> {
    // SAFETY: anonymous private mapping; result checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// `map_noreserve` at exactly `addr`, or None when that range is taken.
pub fn map_noreserve_at(addr: u64, len: u64) -> Option<u64> {
    // SAFETY: anonymous private mapping that never replaces one (MAP_FIXED_NOREPLACE); result checked.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    if p as u64 != addr {
        // An old kernel without MAP_FIXED_NOREPLACE took it as a hint and put it elsewhere.
        // SAFETY: the mapping made just above.
        unsafe { libc::munmap(p, len as usize) };
        return None;
    }
    Some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_find_release_reuse() {
        let mut m = Mem::new(1);
        let a = m.alloc(0, 1 << 20, 1000, Kind::Data, 1, 1000, 0).unwrap();
        let b = m.alloc(0, 1 << 20, 4096, Kind::Data, 1, 4096, 0).unwrap();
        assert_eq!(a % 512, 0);
        assert_ne!(a, b);
        assert_eq!(m.find(a + 999, 1).unwrap().0, a);
        assert!(m.find(a + 1000, 1).is_none() || m.find(a + 1000, 1).unwrap().0 != a);
        assert!(m.release(a).is_some());
        assert!(m.release(a).is_none());
        assert_eq!(
            m.alloc(0, 1 << 20, 1000, Kind::Data, 1, 1000, 0).unwrap(),
            a,
            "same-size block reused"
        );
        assert_eq!(m.free_ctx(1).len(), 2);
        assert!(m.allocs.is_empty());
    }
}
