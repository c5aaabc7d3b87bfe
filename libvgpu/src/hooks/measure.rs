//! Measuring what a call took on the device when the call does not say (contexts, modules, libraries):
//! readings around the call and the estimator that keeps other tenants' activity out of the cost.
//!
//! Sources, best first (decided in `estimate`):
//! 1. **This process's own usage** in NVML's process list (`nvmlDeviceGetComputeRunningProcesses`): what
//!    other processes (other tenants, or this container's other processes) do is not in it. Its growth,
//!    less what this process's own ledger slot recorded meanwhile (its other threads), is the cost. NVML
//!    names processes by host PID; in the initial PID namespace that is `getpid()`, in a container the
//!    process finds its own as the one PID that appears in the list with its first context (two appearing
//!    at once: ambiguous, tried again at the next context).
//! 2. **The whole device's used memory** (NVML, or total − free from the driver through a context of the
//!    device), less what the container's ledger recorded meanwhile. Another tenant inside the window skews
//!    it, so for contexts it is bounded by the context size this process learned from its first
//!    measurement: a reading further than `TOLERANCE` from it is charged the known size instead.
//! 3. Nothing before the call (no NVML and no context of the device yet): the known size, else what the
//!    device holds after the call beyond the container's ledger, at most a fallback (contexts:
//!    `DEFAULT_CONTEXT_BYTES`).
//!
//! There is no ceiling: what is measured is charged (or refused).

use std::sync::atomic::Ordering;

use crate::driver::Driver;
use crate::ffi::CUdevice;
use crate::quota::DeviceQuota;
use crate::records::KnownContext;

use super::common::Interposer;

/// Readings around a measured call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// This process's device memory in NVML's process list (None: not known).
    pub process: Option<u64>,
    /// The whole device's used memory (None: cannot be read).
    pub device: Option<u64>,
    /// The container's ledger total, and this process's own slot's.
    pub container: u64,
    pub own: u64,
}

/// Where an estimate came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Process,
    Device,
    /// A device reading disagreed with the known size (noise): the known size.
    Known,
    /// No reading before the call: the known size or the bound.
    Bound,
}

/// How much more than this process's own NVML figure a device-wide reading may add to a cost.
pub(crate) const PROCESS_SLACK: u64 = 16 << 20;

/// How far (either way) a device-wide reading may stray from the known context size and still be taken.
pub(crate) fn tolerance(known: u64) -> u64 {
    (known / 8).max(4 << 20)
}

/// The cost of a call from readings before (None: nothing could be read) and after it; `known`: the
/// size this process learned for such an object; `fallback`: the most charged when nothing measures.
pub(crate) fn estimate(
    before: Option<&Reading>,
    after: &Reading,
    known: Option<u64>,
    fallback: u64,
) -> (u64, Source) {
    let delta = |a: u64, b: u64, la: u64, lb: u64| {
        (a as i128 - b as i128 - (la as i128 - lb as i128)).max(0) as u64
    };
    if let Some(b) = before {
        if let (Some(pb), Some(pa)) = (b.process, after.process) {
            let own = delta(pa, pb, after.own, b.own);
            // NVML's per-process figure leaves out a little of what the driver takes for a context (5.6 MiB
            // on an H100 with driver 580): the device-wide drop counts it, up to PROCESS_SLACK above the
            // process's own figure, so another tenant can make it charge at most that much more.
            let device = match (b.device, after.device) {
                (Some(db), Some(da)) => {
                    delta(da, db, after.container, b.container).min(own + PROCESS_SLACK)
                }
                _ => 0,
            };
            return (own.max(device), Source::Process);
        }
        if let (Some(db), Some(da)) = (b.device, after.device) {
            let raw = delta(da, db, after.container, b.container);
            return match known {
                Some(k) if raw.abs_diff(k) > tolerance(k) => (k, Source::Known),
                _ => (raw, Source::Device),
            };
        }
    }
    if let Some(k) = known {
        return (k, Source::Bound);
    }
    let held = after
        .device
        .map_or(0, |d| d.saturating_sub(after.container));
    (held.min(fallback), Source::Bound)
}

/// Where the device-wide reading comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Probe {
    /// NVML's used memory of the device.
    Nvml,
    /// The driver's free memory in the current context.
    Current,
    /// The driver's free memory with this context pushed current for the query.
    Ctx(usize),
    None,
}

impl<D: Driver> Interposer<'_, D> {
    /// This process's PID in NVML's lists, if known (learned per process: `Records`).
    pub(crate) fn nvml_pid(&self) -> Option<u32> {
        if let Some(p) = self.drv.nvml_pid_hint() {
            return Some(p);
        }
        match self.rec.nvml_pid.load(Ordering::Relaxed) {
            0 => None,
            p => Some(p),
        }
    }

    /// Forgets a learned PID that turned out not to be this process's.
    pub(crate) fn forget_nvml_pid(&self) {
        self.rec.nvml_pid.store(0, Ordering::Relaxed);
    }

    fn learn_nvml_pid(&self, pid: u32) {
        self.rec.nvml_pid.store(pid, Ordering::Relaxed);
    }

    /// The context size learned for device `dev` in this process.
    pub(crate) fn known_context(&self, dev: CUdevice) -> Option<u64> {
        self.rec.known_ctx.with(dev as u64, |k| k.map(|k| k.bytes))
    }

    /// Remembers a context measurement: the first, or the first from this process's own usage.
    pub(crate) fn learn_context(&self, dev: CUdevice, bytes: u64, source: Source) {
        let trusted = source == Source::Process;
        if !(trusted || source == Source::Device) {
            return;
        }
        let learned = KnownContext { bytes, trusted };
        self.rec.known_ctx.update(
            dev as u64,
            || learned,
            |k| {
                if trusted && !k.trusted {
                    *k = learned;
                }
            },
        );
    }

    /// One reading: NVML's process list (kept for discovery), the device through `probe`, the ledger.
    /// Repeated (at most 4 times) until two in a row agree, so that an allocation in flight settles.
    pub(crate) fn read(
        &self,
        q: &DeviceQuota,
        probe: Probe,
        pid: Option<u32>,
    ) -> (Reading, Option<Vec<(u32, u64)>>) {
        let once = || {
            let procs = self.drv.device_processes(&q.uuid);
            let device = match probe {
                Probe::Nvml => self.drv.device_used(&q.uuid),
                Probe::Current => self.drv.mem_info().map(|(f, t)| t.saturating_sub(f)),
                Probe::Ctx(c) => self.drv.ctx_mem_info(c).map(|(f, t)| t.saturating_sub(f)),
                Probe::None => None,
            };
            let process = match (&procs, pid) {
                (Some(list), Some(p)) => Some(list.iter().find(|e| e.0 == p).map_or(0, |e| e.1)),
                _ => None,
            };
            let own = if procs.is_some() { q.own_used() } else { 0 };
            let r = Reading {
                process,
                device,
                container: q.used(),
                own,
            };
            (r, procs)
        };
        let mut last = once();
        for _ in 0..3 {
            let next = once();
            if next.0 == last.0 {
                return next;
            }
            last = next;
        }
        last
    }

    /// Finds this process in NVML's lists around its first context: the one PID that appeared (and did not
    /// grow by more than the whole device did). Fills the readings' process usage when found.
    pub(crate) fn discover(
        &self,
        before: (&mut Reading, &Option<Vec<(u32, u64)>>),
        after: (&mut Reading, &Option<Vec<(u32, u64)>>),
    ) {
        let (Some(lb), Some(la)) = (before.1, after.1) else {
            return;
        };
        let new: Vec<(u32, u64)> = la
            .iter()
            .filter(|a| a.1 > 0 && !lb.iter().any(|b| b.0 == a.0 && b.1 > 0))
            .copied()
            .collect();
        let [(pid, used)] = new[..] else {
            return;
        };
        if let (Some(db), Some(da)) = (before.0.device, after.0.device) {
            if used > da.saturating_sub(db) + tolerance(used) {
                return;
            }
        }
        self.learn_nvml_pid(pid);
        before.0.process = Some(0);
        after.0.process = Some(used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(process: Option<u64>, device: Option<u64>, container: u64, own: u64) -> Reading {
        Reading {
            process,
            device,
            container,
            own,
        }
    }

    #[test]
    fn this_process_usage_wins_net_of_its_own_slot() {
        let b = r(Some(100), Some(1000), 0, 0);
        let a = r(Some(500), Some(1400), 50, 40);
        assert_eq!(estimate(Some(&b), &a, Some(7), 0), (360, Source::Process));
    }

    #[test]
    fn what_nvml_leaves_out_of_the_process_figure_is_counted_within_a_slack() {
        // H100, driver 580: a second context took 548995072 bytes of free memory; NVML's per-process
        // figure grew by 543162368 (the GPU suite's measure/context case, 2026-11-23).
        let b = r(Some(1 << 30), Some(2 << 30), 0, 0);
        let a = r(
            Some((1 << 30) + 543162368),
            Some((2 << 30) + 548995072),
            0,
            0,
        );
        assert_eq!(
            estimate(Some(&b), &a, None, 0),
            (548995072, Source::Process)
        );
        // another tenant allocating 3 GiB in the window adds at most the slack
        let noisy = r(
            Some((1 << 30) + 543162368),
            Some((5 << 30) + 548995072),
            0,
            0,
        );
        assert_eq!(
            estimate(Some(&b), &noisy, None, 0),
            (543162368 + PROCESS_SLACK, Source::Process)
        );
    }

    #[test]
    fn a_device_reading_far_from_the_known_size_is_noise() {
        let b = r(None, Some(1000), 0, 0);
        let near = r(None, Some(1000 + (300 << 20)), 0, 0);
        let far = r(None, Some(1000 + (3 << 30)), 0, 0);
        let k = 310 << 20;
        assert_eq!(
            estimate(Some(&b), &near, Some(k), 0),
            (300 << 20, Source::Device)
        );
        assert_eq!(estimate(Some(&b), &far, Some(k), 0), (k, Source::Known));
        assert_eq!(
            estimate(Some(&b), &far, None, 0),
            (3 << 30, Source::Device),
            "no ceiling without a known size"
        );
        let freed = r(None, Some(0), 0, 0);
        assert_eq!(estimate(Some(&b), &freed, Some(k), 0), (k, Source::Known));
    }

    #[test]
    fn nothing_before_the_call_is_the_known_size_or_the_bound() {
        let a = r(None, Some(5 << 30), 1 << 30, 0);
        assert_eq!(estimate(None, &a, Some(9), 1 << 20), (9, Source::Bound));
        assert_eq!(estimate(None, &a, None, 1 << 20), (1 << 20, Source::Bound));
        assert_eq!(estimate(None, &a, None, 8 << 30), (4 << 30, Source::Bound));
        assert_eq!(
            estimate(None, &r(None, None, 0, 0), None, 9),
            (0, Source::Bound)
        );
    }
}
