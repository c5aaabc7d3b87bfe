//! How many contexts the GPU's time is shared among, from something the tenant does not control: the
//! driver's own per-process utilisation samples (NVML `nvmlDeviceGetProcessUtilization`) of the last
//! second. This process counts one; every other process with SM activity counts one once it kept the
//! GPU `WHOLE_AT` (5%) busy, and in proportion below (one at 1% counts a fifth); at most
//! `launch_charge::MAX_SHARERS` in all, in thousandths (`launch_charge::CONTEXT`). Read at most every `REFRESH_NS`. Without NVML, or when it has no samples,
//! the GPU counts as this process's alone (no discount: the charge is what the work took).
//!
//! The share's charge uses it as a bound (`solo`): a launch beside `n` busy contexts is charged at least
//! `elapsed / n`. A tenant's own short launches cannot lower it; only other processes' GPU work can, and
//! that work is charged to whoever runs it (another process of the container to the same bucket).
//! Weighted, not counted: three processes of the tenant's own that each launched one short kernel a
//! second were three busy neighbours, and with one cheap launch first the bound let a 10% share run at
//! 35% (fake driver). Now each counts a fifth, and a neighbour counts whole only when it keeps the GPU
//! 5% busy: time its own bucket pays for when it is the container's (three such helpers are 15% of the
//! GPU, more than a 10% share holds).
//!
//! The NVML call takes ~1.4 ms on an H100 (driver 580), about 350 launches' worth of a launch-bound loop.
//! So it is made where the thread waits anyway: in the share's naps (`refresh`, when the reading is
//! `REFRESH_NS` old); a launching thread makes it only when the reading is `STALE_NS` old (a tenant that
//! never waits for its bucket: 0.14% of its time, where every 100 ms on the launching thread cost 1.4%).
//! It is kept to the one call: the device's handle is looked up once, the samples land on the stack, and
//! the time it took is summed for the debug trace (`spent`).

use std::ffi::{c_char, c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::truth::Truth;
use crate::ffi::*;
use crate::launch_charge::{CONTEXT, MAX_SHARERS};
use crate::real_symbols::{real, Lib};
use crate::records::RECORDS;

/// How old a reading may be before a napping thread asks NVML again.
const REFRESH_NS: u64 = 100_000_000;
/// How old a reading may be before a launching thread asks NVML again.
const STALE_NS: u64 = 1_000_000_000;
/// How old a reading may be before a launching thread asks NVML again when its own work reads as more
/// stretched than the reading says (`sharers_beside`): at first; doubled while asking changes nothing.
const CONTRADICTED_NS: u64 = 100_000_000;
/// How far back a sample counts.
const WINDOW_US: u64 = 1_000_000;

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Sample {
    pid: c_uint,
    time_stamp: u64,
    sm: c_uint,
    mem: c_uint,
    enc: c_uint,
    dec: c_uint,
}

/// One device's reading, refreshed lazily by whoever charges a launch.
pub struct Busy {
    uuid: String,
    /// When NVML was last asked (CLOCK_MONOTONIC ns; 0: never).
    read_at: AtomicU64,
    sharers: AtomicU64,
    /// NVML's handle of the device (0: not looked up yet).
    handle: AtomicUsize,
    /// Time spent in refreshes since the trace last read it (ns).
    spent: AtomicU64,
    /// How old a reading the stretch contradicts may be (`CONTRADICTED_NS` to `STALE_NS`).
    contradicted_age: AtomicU64,
    /// This process's own samples, integrated into the floor under its charge (`truth`).
    pub truth: Truth,
    /// The last reading's SM utilisation of the other processes together and of this one, percent
    /// (`lend`'s inputs), and how many readings so far (0: none yet).
    others: AtomicU32,
    own: AtomicU32,
    readings: AtomicU64,
}

impl Busy {
    pub fn new(uuid: &str) -> Busy {
        Busy {
            uuid: uuid.to_string(),
            read_at: AtomicU64::new(0),
            sharers: AtomicU64::new(CONTEXT),
            handle: AtomicUsize::new(0),
            spent: AtomicU64::new(0),
            contradicted_age: AtomicU64::new(CONTRADICTED_NS),
            truth: Truth::default(),
            others: AtomicU32::new(0),
            own: AtomicU32::new(0),
            readings: AtomicU64::new(0),
        }
    }

    /// The time refreshes took since the last call (for the debug trace).
    pub fn spent(&self) -> u64 {
        self.spent.swap(0, Ordering::Relaxed)
    }

    /// NVML's handle of the device, looked up once.
    fn handle(&self) -> Option<*mut c_void> {
        match self.handle.load(Ordering::Relaxed) {
            0 => {
                let h = handle_of(&self.uuid)?;
                self.handle.store(h as usize, Ordering::Relaxed);
                Some(h)
            }
            h => Some(h as *mut c_void),
        }
    }

    /// Busy contexts on the device in thousandths, this process counted as one (one to `MAX_SHARERS`),
    /// for a charge on a launching thread whose own recent work reads as stretched by `stretch` contexts
    /// (`launch_charge::SoloBook::stretch`). NVML is asked when the reading is `STALE_NS` old (or there
    /// is none); when the stretch is half a context or more above the reading, the
    /// reading may be stale (a neighbour that waited for its bucket when NVML was asked runs again: a
    /// tenant that never waits itself kept "alone" for up to a second and paid all of its time-sliced
    /// work), and NVML is asked once it is `CONTRADICTED_NS` old, twice as long after each ask that
    /// changed nothing (a tenant whose own streams stretch each other, alone on the GPU, comes back to
    /// one ask a second). The reading stays the bound: the stretch only makes it fresher.
    pub fn sharers_beside(&self, now_ns: u64, stretch: u64) -> u64 {
        let last = self.sharers.load(Ordering::Relaxed);
        if stretch >= last + CONTEXT / 2 {
            let age = self.contradicted_age.load(Ordering::Relaxed);
            return self.reading(now_ns, age, true);
        }
        // A process whose charge fell short of the driver's figure is read as often as a napping one.
        let age = if self.truth.suspect() {
            REFRESH_NS
        } else {
            STALE_NS
        };
        self.reading(now_ns, age, false)
    }

    /// A thread about to sleep for the bucket asks NVML when the reading is `REFRESH_NS` old.
    pub fn refresh(&self, now_ns: u64) {
        self.reading(now_ns, REFRESH_NS, false);
    }

    /// Asks NVML when the reading is `max_age` old (a launching thread whose launches go unmeasured: the
    /// driver's figure is then their charge, `Share::meter`).
    pub fn refresh_every(&self, now_ns: u64, max_age: u64) {
        self.reading(now_ns, max_age, false);
    }

    /// The reading, refreshed first when it is older than `max_age` ns (one thread refreshes; the
    /// others keep the last reading meanwhile). `contradicted`: asked because the stretch contradicts
    /// the reading (`sharers_beside`).
    fn reading(&self, now_ns: u64, max_age: u64, contradicted: bool) -> u64 {
        let at = self.read_at.load(Ordering::Relaxed);
        if (at != 0 && now_ns.saturating_sub(at) < max_age)
            || self
                .read_at
                .compare_exchange(at, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return self.sharers.load(Ordering::Relaxed);
        }
        let t0 = std::time::Instant::now();
        let got = self.handle().and_then(|dev| read(dev, &self.truth));
        let me = own_pid();
        let n = got.map_or(CONTEXT, |(busy, k)| count(&busy[..k], me));
        if let Some((busy, k)) = got {
            // This process's PID not known yet: every busy process is an other, itself among them (the
            // lending then grows step by step where it would have taken the GPU alone at once; a tenant
            // that kept its PID from being learned gains nothing by it).
            let (others, own) = loads(&busy[..k], me.unwrap_or(0));
            self.others.store(others, Ordering::Relaxed);
            self.own.store(own, Ordering::Relaxed);
            self.readings.fetch_add(1, Ordering::Relaxed);
        }
        let before = self.sharers.swap(n, Ordering::Relaxed);
        if before != n {
            self.contradicted_age
                .store(CONTRADICTED_NS, Ordering::Relaxed);
        } else if contradicted {
            let age = self.contradicted_age.load(Ordering::Relaxed);
            self.contradicted_age
                .store((2 * age).min(STALE_NS), Ordering::Relaxed);
        }
        self.spent
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        n
    }
}

impl Busy {
    /// The last reading: (how many so far, the others' SM utilisation together, this process's), percent;
    /// `(0, _, _)` before the first (NVML cannot say). Before this process's PID is known, every busy
    /// process counts as an other.
    pub fn loads(&self) -> (u64, u32, u32) {
        (
            self.readings.load(Ordering::Relaxed),
            self.others.load(Ordering::Relaxed),
            self.own.load(Ordering::Relaxed),
        )
    }
}

/// The SM utilisation of the processes other than `me` together (at most 100) and of `me`, percent, from
/// one reading's `(pid, sm)` pairs. The container's other processes are among the others: NVML names
/// processes, not containers.
pub fn loads(busy: &[(u32, u32)], me: u32) -> (u32, u32) {
    let (mut others, mut own) = (0u32, 0u32);
    for &(p, sm) in busy {
        if p == me {
            own = own.saturating_add(sm);
        } else {
            others = others.saturating_add(sm);
        }
    }
    (others.min(100), own.min(100))
}

/// How busy a neighbour must keep the GPU to count as a whole context: 5% of its time (NVML's SM
/// utilisation, percent). Below, it counts in proportion.
pub const WHOLE_AT: u32 = 5;

/// Contexts sharing the GPU, in thousandths, from the busy processes NVML reported with their SM
/// utilisation over the window (`(pid, sm)`, one per process, percent): this process counts one, every
/// other one `sm / WHOLE_AT`, at most one. When this process's NVML PID is not known, the busy ones
/// alone (it may be among them).
///
/// Why not relative to this process's own utilisation: NVML's figure is a mean over the second, and a
/// 30% tenant beside a 70% one is busy at half the other's rate on average, yet, while both run, each
/// holds the GPU half the time; counted as half a context, the 70% tenant would pay more than its part
/// then. Any neighbour that keeps the GPU 5% busy counts whole, as before; one that only keeps NVML's
/// reading alive costs the tenant little and counts little.
pub fn count(busy: &[(u32, u32)], own: Option<u32>) -> u64 {
    let weigh = |&(_, sm): &(u32, u32)| (sm as u64 * CONTEXT / WHOLE_AT as u64).min(CONTEXT);
    let n = match own {
        Some(me) => {
            CONTEXT
                + busy
                    .iter()
                    .filter(|&&(p, _)| p != me)
                    .map(weigh)
                    .sum::<u64>()
        }
        None => busy.iter().map(weigh).sum(),
    };
    n.clamp(CONTEXT, MAX_SHARERS * CONTEXT)
}

/// This process's PID as NVML reports it: learned from its first context (`hooks::measure`), or its own
/// in the initial PID namespace.
fn own_pid() -> Option<u32> {
    match RECORDS.nvml_pid.load(Ordering::Relaxed) {
        0 => {}
        p => return Some(p),
    }
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    (ns.as_os_str() == "pid:[4026531836]").then(std::process::id)
}

/// NVML's handle of the device named `uuid` (None: NVML cannot say).
fn handle_of(uuid: &str) -> Option<*mut c_void> {
    if !crate::identity::nvml_ready() {
        return None;
    }
    let by_uuid = real!(
        Lib::Nvml,
        "nvmlDeviceGetHandleByUUID",
        unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> nvmlReturn_t
    )?;
    let c = std::ffi::CString::new(uuid).ok()?;
    let mut dev: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid C string and out-pointer.
    (unsafe { by_uuid(c.as_ptr(), &mut dev) } == NVML_SUCCESS && !dev.is_null()).then_some(dev)
}

/// Samples read at most in one refresh.
const MAX_SAMPLES: usize = 256;

/// The processes with SM activity on device `dev` in the last `WINDOW_US`, each once with its mean SM
/// utilisation over its samples of the window, and how many (None: NVML cannot say). The samples since
/// the floor's last reading (`truth`), when older, are asked too: they go to the floor.
fn read(dev: *mut c_void, truth: &Truth) -> Option<([(u32, u32); MAX_SAMPLES], usize)> {
    let util = real!(
        Lib::Nvml,
        "nvmlDeviceGetProcessUtilization",
        unsafe extern "C" fn(*mut c_void, *mut Sample, *mut c_uint, u64) -> nvmlReturn_t
    )?;
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_micros() as u64;
    let window = now_us - WINDOW_US;
    let since = truth.since().map_or(window, |t| t.min(window));
    let mut buf = [Sample::default(); MAX_SAMPLES];
    let mut n = buf.len() as c_uint;
    // SAFETY: `buf` holds `n` samples; a handle NVML gave.
    let r = unsafe { util(dev, buf.as_mut_ptr(), &mut n, since) };
    const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
    let mut busy = [(0u32, 0u32); MAX_SAMPLES];
    match r {
        NVML_SUCCESS => {}
        NVML_ERROR_NOT_FOUND => return Some((busy, 0)),
        _ => return None,
    }
    let got = &mut buf[..(n as usize).min(MAX_SAMPLES)];
    if let Some(me) = own_pid() {
        let mut own = [(0u32, 0u64, 0u32); MAX_SAMPLES];
        for (o, s) in own.iter_mut().zip(got.iter()) {
            *o = (s.pid, s.time_stamp, s.sm);
        }
        truth.observe(&own[..got.len()], me, now_us);
    }
    // The count is the last second's: older samples were asked for the floor only.
    let recent = partition_recent(got, window);
    let k = mean_by_pid(&mut got[..recent], &mut busy);
    Some((busy, k))
}

/// Moves the samples newer than `since` (µs) to the front of `samples`; returns how many.
fn partition_recent(samples: &mut [Sample], since: u64) -> usize {
    let mut k = 0;
    for i in 0..samples.len() {
        if samples[i].time_stamp >= since {
            samples.swap(i, k);
            k += 1;
        }
    }
    k
}

/// Each process of `samples` that had SM activity, once, with the mean of its samples' SM utilisation
/// (idle samples included), into `out`; returns how many. Sorts `samples` by PID (no allocation: this
/// runs on the tenant's launching thread).
fn mean_by_pid(samples: &mut [Sample], out: &mut [(u32, u32); MAX_SAMPLES]) -> usize {
    samples.sort_unstable_by_key(|s| s.pid);
    let mut busy = 0;
    for group in samples.chunk_by(|a, b| a.pid == b.pid) {
        let sum: u64 = group.iter().map(|s| s.sm as u64).sum();
        if sum > 0 && busy < out.len() {
            out[busy] = (group[0].pid, (sum / group.len() as u64) as u32);
            busy += 1;
        }
    }
    busy
}

#[cfg(test)]
mod tests {
    use super::*;

    // NVML's reading costs ~1.4 ms on an H100: a launching thread asks for it once a second, a napping
    // one (it waits anyway) every 100 ms. Before, every charge asked whenever the reading was 100 ms old.
    #[test]
    fn a_launching_thread_asks_nvml_once_a_second_a_napping_one_more_often() {
        let b = Busy::new("GPU-none");
        let t = 5_000_000_000;
        b.sharers_beside(t, CONTEXT);
        assert_eq!(
            b.read_at.load(Ordering::Relaxed),
            t,
            "the first charge reads"
        );
        b.sharers_beside(t + 200_000_000, CONTEXT);
        assert_eq!(
            b.read_at.load(Ordering::Relaxed),
            t,
            "200 ms later a charge does not"
        );
        b.refresh(t + 200_000_000);
        assert_eq!(
            b.read_at.load(Ordering::Relaxed),
            t + 200_000_000,
            "a nap does"
        );
        b.refresh(t + 250_000_000);
        assert_eq!(b.read_at.load(Ordering::Relaxed), t + 200_000_000);
        b.sharers_beside(t + 1_300_000_000, CONTEXT);
        assert_eq!(
            b.read_at.load(Ordering::Relaxed),
            t + 1_300_000_000,
            "a second old: a charge reads"
        );
    }

    // Regression (H200, 4096² eager, 30 / 70): the 70% tenant, never held, kept a reading of one context
    // taken while its neighbour waited for its bucket for up to a second after the neighbour ran again:
    // it paid all of its time-sliced launches' elapsed time (80 ms charged per 100 ms while it ran at 45%
    // of its rate alone), ran dry and was held while the 30% tenant ran alone. When its own work reads as stretched
    // by more contexts than the reading says, a charge asks again after 100 ms; while the reading does
    // not change, after twice as long each time, up to the second.
    #[test]
    fn a_reading_its_own_stretch_contradicts_is_asked_again_sooner() {
        let b = Busy::new("GPU-none");
        let t = 5_000_000_000;
        let at = |b: &Busy| b.read_at.load(Ordering::Relaxed);
        b.sharers_beside(t, CONTEXT);
        assert_eq!(at(&b), t);
        b.sharers_beside(t + 150_000_000, CONTEXT);
        assert_eq!(at(&b), t, "a stretch that agrees: the reading is kept");
        b.sharers_beside(t + 150_000_000, 1400);
        assert_eq!(at(&b), t, "a stretch under half a context more: kept");
        b.sharers_beside(t + 150_000_000, 2 * CONTEXT);
        assert_eq!(at(&b), t + 150_000_000, "stretched by two: asked again");
        // NVML still says one (no NVML here): the next asks wait 200, then 400, 800, 1000 ms.
        let mut now = t + 150_000_000;
        for wait in [
            200_000_000,
            400_000_000,
            800_000_000,
            1_000_000_000,
            1_000_000_000,
        ] {
            b.sharers_beside(now + wait - 1, 2 * CONTEXT);
            assert_eq!(at(&b), now, "not before {wait} ns");
            b.sharers_beside(now + wait, 2 * CONTEXT);
            assert_eq!(at(&b), now + wait, "after {wait} ns");
            now += wait;
        }
        // A reading that changed brings the next ask back to 100 ms.
        b.sharers.store(2 * CONTEXT, Ordering::Relaxed);
        b.sharers_beside(now + 1_000_000_000, 3 * CONTEXT);
        now += 1_000_000_000;
        assert_eq!(at(&b), now);
        b.sharers_beside(now + 100_000_000, 3 * CONTEXT);
        assert_eq!(
            at(&b),
            now + 100_000_000,
            "the reading changed (2 to 1): 100 ms again"
        );
    }

    #[test]
    fn loads_are_the_others_together_and_this_process() {
        assert_eq!(loads(&[(7, 30), (8, 50), (9, 40)], 7), (90, 30));
        assert_eq!(
            loads(&[(8, 50), (9, 60)], 7),
            (100, 0),
            "at most the whole GPU"
        );
        // This process's PID not known (0): itself among the others.
        assert_eq!(loads(&[(7, 30), (8, 50)], 0), (80, 0));
    }

    #[test]
    fn sharers_are_this_process_and_the_other_busy_ones_bounded() {
        assert_eq!(count(&[], Some(7)), CONTEXT);
        assert_eq!(
            count(&[(7, 90)], Some(7)),
            CONTEXT,
            "its own samples are not a neighbour"
        );
        assert_eq!(count(&[(7, 50), (9, 50)], Some(7)), 2 * CONTEXT);
        assert_eq!(count(&[(9, 40)], Some(7)), 2 * CONTEXT);
        assert_eq!(
            count(&[(9, 40)], None),
            CONTEXT,
            "its own PID unknown: the busy ones alone"
        );
        let six: Vec<(u32, u32)> = (1..=6).map(|p| (p, 30)).collect();
        assert_eq!(count(&six, Some(7)), MAX_SHARERS * CONTEXT);
    }

    // Regression (fake driver: a 10% share at 35%): three processes of the tenant's own that launched a
    // 2 ms kernel every 300 ms were three busy neighbours, so a launch was charged a quarter of what it
    // took. A neighbour counts whole from 5% of the GPU's time, in proportion below.
    #[test]
    fn a_neighbour_that_barely_uses_the_gpu_counts_barely() {
        assert_eq!(count(&[(7, 12), (1, 1), (2, 1), (3, 1)], Some(7)), 1600);
        assert_eq!(count(&[(7, 12), (1, 1), (2, 1), (3, 1)], None), 1600);
        // A 30% tenant beside a 70% one: each counts the other whole, whatever their means.
        assert_eq!(count(&[(7, 62), (1, 28)], Some(7)), 2 * CONTEXT);
        assert_eq!(count(&[(7, 28), (1, 62)], Some(7)), 2 * CONTEXT);
    }

    #[test]
    fn samples_are_averaged_per_process_and_idle_processes_left_out() {
        let s = |pid: u32, sm: u32| Sample {
            pid,
            sm,
            ..Sample::default()
        };
        let mut out = [(0u32, 0u32); MAX_SAMPLES];
        let k = mean_by_pid(
            &mut [s(7, 60), s(9, 0), s(7, 20), s(9, 0), s(3, 5)],
            &mut out,
        );
        assert_eq!(&out[..k], &[(3, 5), (7, 40)]);
    }
}
