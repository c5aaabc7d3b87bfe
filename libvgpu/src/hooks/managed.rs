//! Managed memory on every device of the process. A managed allocation's pages go wherever they are
//! used: a kernel on another device faults them in there (they migrate), and read-mostly advice copies
//! them there on read. No hook sees either, so the rule is: a process's managed memory is charged to
//! every device, under a quota, where the process has a context (`docs/libvgpu.md`, "Managed memory on
//! several devices").
//!
//! * `cuMemAllocManaged`: charged to its own device (as every allocation), then to each other device of
//!   the process's contexts; if one does not fit, the allocation is freed and refused.
//! * A context created on a device (or a primary context retained there first): every live managed
//!   allocation not yet charged there is; if that does not fit, the context goes and is refused.
//! * The free (or the end of its context) gives back every device it was charged on. Destroying a
//!   context elsewhere does not: the pages it faulted in may stay there.
//!
//! Managed memory of a device without a quota is charged to the other devices all the same (recorded
//! here only). The memory modes' managed memory (spill, oversubscribe: `Kind::Data` records) is not
//! covered here.

use vgpu_ledger::Kind;

use super::common::{Interposer, Target};
use crate::driver::Driver;
use crate::ffi::*;
use crate::guard::exiting;
use crate::log;
use crate::quota::DeviceQuota;
use crate::records::{Mirror, Rec};

impl<D: Driver> Interposer<'_, D> {
    /// `cuMemAllocManaged` of `bytes` in the current context by `call`; `read` gives the pointer the
    /// driver wrote.
    pub(crate) fn alloc_managed(
        &self,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        read: impl Fn() -> u64,
    ) -> CUresult {
        let tgt = self.target_current();
        let home = match tgt {
            (Target::Charge(_), dev, ctx) => Some((dev, ctx)),
            // A device without a quota: its managed memory may still reach the devices with one.
            (Target::Forward, dev, ctx) if ctx != 0 && !exiting() => Some((dev, ctx)),
            _ => None,
        };
        let r = self.charged_call(&self.rec.allocs, Kind::Managed, bytes, tgt, call, &read);
        let Some((home, ctx)) = home.filter(|_| r == CUDA_SUCCESS) else {
            return r;
        };
        let p = read();
        let mirror = Mirror {
            home,
            ctx,
            bytes,
            devs: Vec::new(),
        };
        self.rec.managed.insert(p, mirror);
        // After the record is in: a context created meanwhile either is seen here or sees the record.
        for (dev, q) in self.context_devices(home) {
            if self.mirror_onto(p, dev, q).is_none() {
                log::warn(format_args!(
                    "quota: refused {bytes} bytes of managed memory: this process has a context on \
                     device {dev}, where its kernels would bring the pages, and they do not fit its quota"
                ));
                self.drv.mem_free(p);
                match self.rec.allocs.remove(p) {
                    Some(rec) => self.release_unless_exported(p, &rec),
                    None => self.managed_freed(p),
                }
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        r
    }

    /// The devices, other than `home` and under a quota, on which this process has a context.
    fn context_devices(&self, home: CUdevice) -> Vec<(CUdevice, &'static DeviceQuota)> {
        let mut devs: Vec<CUdevice> = self.rec.contexts.values().iter().map(|r| r.dev).collect();
        devs.extend(
            self.rec
                .primary
                .keys()
                .into_iter()
                .filter(|&d| self.rec.primary.with(d, |n| n.is_some_and(|n| *n > 0)))
                .map(|d| d as CUdevice),
        );
        devs.sort_unstable();
        devs.dedup();
        devs.into_iter()
            .filter(|&d| d != home)
            .filter_map(|d| self.quota_of(d).map(|q| (d, q)))
            .collect()
    }

    /// Charges managed allocation `p` to `dev` (quota `q`) unless it already is (or lives there): Some(true)
    /// when this call charged it, Some(false) when there was nothing to charge, None when it does not
    /// fit. The charge is made outside the table's lock (admitting may call the driver) and kept only if
    /// the allocation is still there and still not charged on `dev`.
    fn mirror_onto(&self, p: u64, dev: CUdevice, q: &DeviceQuota) -> Option<bool> {
        let bytes = self.rec.managed.with(p, |m| {
            m.filter(|m| m.home != dev && !m.devs.contains(&dev))
                .map(|m| m.bytes)
        });
        let Some(bytes) = bytes else {
            return Some(false);
        };
        if !self.admit(q, Kind::Managed, bytes) {
            return None;
        }
        let kept = self.rec.managed.with(p, |m| match m {
            Some(m) if !m.devs.contains(&dev) => {
                m.devs.push(dev);
                true
            }
            _ => false,
        });
        if !kept {
            q.refund(Kind::Managed, bytes);
        }
        Some(kept)
    }

    /// A context of this process on `dev` (quota `q`) was made: every live managed allocation is
    /// charged there too. False when they do not fit: what this call charged is given back (the caller
    /// then ends the context and refuses it).
    pub(crate) fn managed_onto_context(&self, dev: CUdevice, q: &DeviceQuota) -> bool {
        let mut charged = Vec::new();
        for p in self.rec.managed.keys() {
            match self.mirror_onto(p, dev, q) {
                Some(true) => charged.push(p),
                Some(false) => {}
                None => {
                    for p in charged {
                        self.unmirror(p, dev, q);
                    }
                    log::warn(format_args!(
                        "quota: refused a context on device {dev}: its kernels would bring this \
                         process's managed memory there, which does not fit the device's quota"
                    ));
                    return false;
                }
            }
        }
        true
    }

    /// Takes `dev` off managed allocation `p`'s charges, giving its bytes back to `q`.
    fn unmirror(&self, p: u64, dev: CUdevice, q: &DeviceQuota) {
        let bytes = self.rec.managed.with(p, |m| {
            let m = m?;
            let i = m.devs.iter().position(|&d| d == dev)?;
            m.devs.swap_remove(i);
            Some(m.bytes)
        });
        if let Some(b) = bytes {
            q.refund(Kind::Managed, b);
        }
    }

    /// The managed allocation at `key` (its record `rec`) went: the other devices it was charged on are
    /// given back, unless it was shared (then, as its own device's charge, they stay until the process
    /// ends).
    pub(crate) fn managed_gone(&self, key: u64, rec: &Rec, refund: bool) {
        if rec.kind != Kind::Managed || rec.pool != 0 {
            return;
        }
        if refund {
            self.managed_freed(key);
        } else {
            self.rec.managed.remove(key);
        }
    }

    /// Managed memory at `key` was freed: every device it was charged on besides its own gets it back.
    pub(crate) fn managed_freed(&self, key: u64) {
        if let Some(m) = self.rec.managed.remove(key) {
            self.unmirror_all(&m);
        }
    }

    /// Context `ctx` went, and with it the managed memory allocated in it that no record of `allocs`
    /// gave back (its device has no quota).
    pub(crate) fn managed_context_gone(&self, ctx: usize) {
        for (_, m) in self.rec.managed.drain_where(|m| m.ctx == ctx) {
            self.unmirror_all(&m);
        }
    }

    fn unmirror_all(&self, m: &Mirror) {
        for &dev in &m.devs {
            if let Some(q) = self.quota_of(dev) {
                q.refund(Kind::Managed, m.bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests;
