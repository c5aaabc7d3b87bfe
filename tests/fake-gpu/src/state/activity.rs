//! What the processes' work does on the devices, published in their slots: when each process's queue
//! drains and how much work it did (the fake CUDA's `timeline` writes it; time slicing and the fake NVML's
//! utilisation read it), and the managed memory each holds per device, from which the paging model
//! decides whether a device is oversubscribed by the processes active on it (work queued or finished
//! since a recent instant): their managed bytes together pass the device's size. Not here: the costs
//! themselves (the fake CUDA's `timeline` and `paging`).

use super::{Shared, LIVE, SLOTS};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

impl Shared {
    /// Publishes when this process's kernel queue drains (CLOCK_MONOTONIC ns) and adds `cost` ns of its
    /// own work, just queued, to its total.
    pub fn set_busy_until(&self, ns: u64, cost: u64) {
        if let Some(s) = self.slot {
            let slot = &self.layout().slots[s];
            slot.busy_until.store(ns, Relaxed);
            slot.busy_ns.fetch_add(cost, Relaxed);
        }
    }

    /// Every live process's work done by `now` (CLOCK_MONOTONIC ns): its work queued so far less what is
    /// still ahead of it in its queue. (slot, PID as the process sees it, its PID namespace inode or 0,
    /// ns done, when its queue drains, when it claimed its slot).
    pub fn work_done(&self, now: u64) -> Vec<(usize, u32, u64, u64, u64, u64)> {
        (0..SLOTS)
            .filter(|&i| self.layout().slots[i].state.load(Acquire) == LIVE)
            .map(|i| {
                let s = &self.layout().slots[i];
                let (total, until) = (s.busy_ns.load(Relaxed), s.busy_until.load(Relaxed));
                let done = total.saturating_sub(until.saturating_sub(now));
                let claimed = s.claimed_at.load(Relaxed);
                (
                    i,
                    s.pid.load(Relaxed),
                    s.pid_ns.load(Relaxed),
                    done,
                    until,
                    claimed,
                )
            })
            .collect()
    }

    /// How many other live processes had kernels queued after `since` (CLOCK_MONOTONIC ns).
    pub fn others_busy(&self, since: u64) -> u64 {
        let me = self.slot;
        (0..SLOTS)
            .filter(|&i| Some(i) != me)
            .map(|i| &self.layout().slots[i])
            .filter(|s| s.state.load(Acquire) == LIVE && s.busy_until.load(Relaxed) > since)
            .count() as u64
    }

    /// The live processes that had kernels queued after `since` (CLOCK_MONOTONIC ns), this one
    /// included: (PID as the process sees it, its PID namespace inode or 0). What the fake NVML reports
    /// as busy in its per-process utilisation.
    pub fn busy_processes(&self, since: u64) -> Vec<(u32, u64)> {
        (0..SLOTS)
            .map(|i| &self.layout().slots[i])
            .filter(|s| s.state.load(Acquire) == LIVE && s.busy_until.load(Relaxed) > since)
            .map(|s| (s.pid.load(Relaxed), s.pid_ns.load(Relaxed)))
            .collect()
    }

    /// Adds `size` bytes of managed memory of this process on `dev`, `resident` of them charged to the
    /// device (negative: given back, migrated to the host).
    pub fn add_managed(&self, dev: usize, size: i64, resident: i64) {
        let Some(s) = self.slot else { return };
        let slot = &self.layout().slots[s];
        for (word, delta) in [
            (&slot.managed[dev], size),
            (&slot.managed_resident[dev], resident),
        ] {
            let _ = word.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add_signed(delta)));
        }
    }

    /// This process's managed bytes on `dev` (total, resident).
    pub fn my_managed(&self, dev: usize) -> (u64, u64) {
        self.slot.map_or((0, 0), |s| {
            let slot = &self.layout().slots[s];
            (
                slot.managed[dev].load(Relaxed),
                slot.managed_resident[dev].load(Relaxed),
            )
        })
    }

    /// The live processes active on the device since `since` (CLOCK_MONOTONIC ns: work queued or
    /// finished after it), this one always: their (managed, resident managed) bytes on `dev`.
    fn active_managed(&self, dev: usize, since: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let me = self.slot;
        (0..SLOTS)
            .filter(move |&i| {
                let s = &self.layout().slots[i];
                s.state.load(Acquire) == LIVE
                    && (Some(i) == me || s.busy_until.load(Relaxed) > since)
            })
            .map(move |i| {
                let s = &self.layout().slots[i];
                (
                    s.managed[dev].load(Relaxed),
                    s.managed_resident[dev].load(Relaxed),
                )
            })
    }

    /// Whether this process's work on `dev` pages: it holds managed memory there, and the managed bytes
    /// of the processes active on `dev` since `since` (itself included) together pass the device.
    pub fn paging(&self, dev: usize, since: u64) -> bool {
        if self.my_managed(dev).0 == 0 {
            return false;
        }
        let sum = self
            .active_managed(dev, since)
            .fold(0u64, |a, (m, _)| a.saturating_add(m));
        sum > self.total(dev)
    }

    /// Whether this process's next work on `dev` first moves its managed pages back in: it holds managed
    /// memory there, has had no work since `since`, and another live process whose managed memory on `dev`
    /// and this one's together pass the device used it after this one's last work (evicting its pages).
    pub fn migrates(&self, dev: usize, since: u64) -> bool {
        let Some(me) = self.slot else { return false };
        let l = self.layout();
        let (mine, last) = (
            l.slots[me].managed[dev].load(Relaxed),
            l.slots[me].busy_until.load(Relaxed),
        );
        if mine == 0 || last > since {
            return false;
        }
        (0..SLOTS).filter(|&i| i != me).any(|i| {
            let s = &l.slots[i];
            let theirs = s.managed[dev].load(Relaxed);
            s.state.load(Acquire) == LIVE
                && theirs > 0
                && s.busy_until.load(Relaxed) > last
                && mine.saturating_add(theirs) > self.total(dev)
        })
    }

    /// The memory of `dev` in use as NVML sees it: the bytes charged to it, plus the managed pages the
    /// processes active since `since` pulled in from the host (their managed bytes not charged), at most
    /// the device. (Pulled-in pages are not charged to anyone: a tenant's quota is the library's.)
    pub fn resident_used(&self, dev: usize, since: u64) -> u64 {
        let paged_in = (0..SLOTS)
            .map(|i| &self.layout().slots[i])
            .filter(|s| s.state.load(Acquire) == LIVE && s.busy_until.load(Relaxed) > since)
            .map(|s| {
                s.managed[dev]
                    .load(Relaxed)
                    .saturating_sub(s.managed_resident[dev].load(Relaxed))
            })
            .fold(0u64, u64::saturating_add);
        self.used(dev).saturating_add(paged_in).min(self.total(dev))
    }

    /// Each live process's managed pages on `dev` that its work pulled in from the host (its managed bytes
    /// not charged at allocation) when it was active since `since` (work queued or finished after it),
    /// else 0, at most the device: (PID as the process sees it, its PID namespace inode or 0, bytes). What
    /// the fake NVML adds to a process's memory in its process list, as `resident_used` adds them to the
    /// device's.
    pub fn paged_in(&self, dev: usize, since: u64) -> Vec<(u32, u64, u64)> {
        (0..SLOTS)
            .map(|i| &self.layout().slots[i])
            .filter(|s| s.state.load(Acquire) == LIVE && s.busy_until.load(Relaxed) > since)
            .map(|s| {
                let bytes = s.managed[dev]
                    .load(Relaxed)
                    .saturating_sub(s.managed_resident[dev].load(Relaxed))
                    .min(self.total(dev));
                (s.pid.load(Relaxed), s.pid_ns.load(Relaxed), bytes)
            })
            .filter(|p| p.2 > 0)
            .collect()
    }

    /// Each live process's managed bytes charged to `dev` (resident there): (PID as the process sees it,
    /// its PID namespace inode or 0, bytes). What the fake NVML leaves out of a process's figure with
    /// `FAKE_NVML_PROCESS_OMITS_MANAGED=1`, as a real GPU's per-process figure leaves out managed memory.
    pub fn resident_managed(&self, dev: usize) -> Vec<(u32, u64, u64)> {
        (0..SLOTS)
            .map(|i| &self.layout().slots[i])
            .filter(|s| s.state.load(Acquire) == LIVE)
            .map(|s| {
                (
                    s.pid.load(Relaxed),
                    s.pid_ns.load(Relaxed),
                    s.managed_resident[dev].load(Relaxed),
                )
            })
            .filter(|p| p.2 > 0)
            .collect()
    }

    /// The live processes holding memory on `dev` (after reclaiming dead ones): (PID as the process sees
    /// it, its PID namespace inode or 0, bytes), the bytes charged to the device for it, plus, with
    /// `pages_since`, the managed pages its work pulled in when it was active since then (`paged_in`).
    pub fn processes_on(&self, dev: usize, pages_since: Option<u64>) -> Vec<(u32, u64, u64)> {
        let paged = pages_since.map_or(vec![], |since| self.paged_in(dev, since));
        self.snapshot()
            .processes
            .into_iter()
            .map(|p| {
                let extra: u64 = paged
                    .iter()
                    .filter(|q| (q.0, q.1) == (p.0, p.1))
                    .map(|q| q.2)
                    .sum();
                (p.0, p.1, p.2[dev].saturating_add(extra))
            })
            .filter(|p| p.2 > 0)
            .collect()
    }
}
