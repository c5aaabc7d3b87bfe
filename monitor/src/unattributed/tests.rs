//! Unit tests of the unattributed remainder: what it counts, what never lowers it, who is named, and when
//! it is logged.
use super::*;
use vgpu_host::attribution::TrueProc;
use vgpu_host::usage::GpuState;
use vgpu_ledger::KubeNames;

const MIB: u64 = 1 << 20;
const U0: &str = "GPU-0";

fn s() -> Settings {
    Settings {
        threshold: 256 * MIB,
        scans: 3,
        tolerance: 64 * MIB,
    }
}

fn container(id: &str, total: u64, vmm: u64) -> ContainerState {
    let mut g = GpuState {
        uuid: U0.into(),
        limit: Some(2048 * MIB),
        total,
        slots_sum: total,
        ..Default::default()
    };
    g.by_kind[Kind::Vmm.index()] = vmm;
    g.by_kind[Kind::Context.index()] = total - vmm;
    ContainerState {
        id: id.into(),
        live: true,
        names: Some(KubeNames {
            namespace: "ml".into(),
            pod: "p".into(),
            container: id.into(),
        }),
        gpus: vec![g],
        ..Default::default()
    }
}

fn proc_(pid: u32, used: u64) -> TrueProc {
    TrueProc {
        pid,
        start_time: 1,
        used,
        tracked: true,
    }
}

/// The issue's H200 figures: three rounds of a 1 GiB export kept after its release under a 2 GiB quota;
/// the device used 3,599 MiB, NVML's figure of the process 518 MiB.
fn issue_reading() -> GpuReading {
    GpuReading {
        index: 0,
        uuid: U0.into(),
        used: 3599 * MIB,
        processes: Some(vec![(10, 518 * MIB)]),
        ..Default::default()
    }
}

fn truth_of(c: usize, procs: Vec<TrueProc>) -> Truth {
    let mut t = Truth {
        listed: vec![U0.into()],
        ..Default::default()
    };
    t.by_gpu.insert((c, 0), procs);
    t
}

/// Issue 48, item 2: memory an exported handle keeps after its release is in the device's used memory and
/// in no process's figure. The remainder is used − processes, from NVML alone; the library refunded the
/// release, so no ledger explains it and nobody is named.
#[test]
fn memory_no_process_shows_is_the_remainder() {
    let cs = [container("a", 523 * MIB, 0)];
    let truth = truth_of(0, vec![proc_(10, 518 * MIB)]);
    let rs = remainders(&cs, &[issue_reading()], &truth, s());
    assert_eq!(rs.len(), 1);
    let r = &rs[0];
    assert_eq!(
        (r.used, r.reserved, r.processes, r.containers),
        (3599 * MIB, 0, 518 * MIB, 518 * MIB)
    );
    assert_eq!(r.unattributed, 3081 * MIB);
    assert_eq!(
        r.holders,
        vec![],
        "its ledger (523 MiB) is within NVML's 518 + tolerance"
    );
    assert!(
        suspects(r, &cs).contains("the holder is not known"),
        "{}",
        suspects(r, &cs)
    );
}

/// A library that keeps exported handles charged (or managed memory, which NVML's per-process figure leaves
/// out): the container whose ledger charges past its processes' figures is named, as likely, for at most
/// the remainder; a container within the tolerance, or one that is gone, is not.
#[test]
fn the_container_charged_past_its_nvml_figure_is_the_likely_holder() {
    let mut gone = container("gone", 3000 * MIB, 2900 * MIB);
    gone.live = false;
    let cs = [
        container("honest", 530 * MIB, 0),
        container("exporter", 3590 * MIB, 3072 * MIB),
        gone,
        container("small", 600 * MIB, 100 * MIB),
    ];
    let mut truth = truth_of(0, vec![proc_(10, 518 * MIB)]);
    truth.by_gpu.insert((1, 0), vec![proc_(11, 518 * MIB)]);
    truth.by_gpu.insert((3, 0), vec![proc_(12, 518 * MIB)]);
    let r = GpuReading {
        used: 4000 * MIB + 518 * MIB * 2,
        processes: Some(vec![(10, 518 * MIB), (11, 518 * MIB), (12, 518 * MIB)]),
        ..issue_reading()
    };
    let rs = remainders(&cs, &[r], &truth, s());
    let r = &rs[0];
    assert_eq!(r.unattributed, 4000 * MIB - 518 * MIB);
    assert_eq!(
        r.holders,
        vec![
            Holder {
                c: 1,
                g: 0,
                charged: 3590 * MIB,
                nvml: 518 * MIB,
                likely: 3072 * MIB,
            },
            Holder {
                c: 3,
                g: 0,
                charged: 600 * MIB,
                nvml: 518 * MIB,
                likely: 82 * MIB,
            }
        ],
        "the largest first; the honest container (12 MiB past NVML) and the gone one are not named"
    );
    let line = suspects(r, &cs);
    assert!(
        line.starts_with("likely held by container exporter (pod ml/p, container exporter), whose ledger charges 3.00 GiB more than NVML shows for its processes (3.51 GiB against 518 MiB; its ledger: vmm 3.00 GiB)"),
        "{line}"
    );
}

/// The tenant's ledger never lowers the remainder: a ledger that claims the whole GPU changes no figure,
/// it only names its own container; one that claims nothing hides only itself from the hint.
#[test]
fn no_ledger_lowers_the_remainder() {
    let truth = truth_of(0, vec![proc_(10, 518 * MIB)]);
    let inflated = [container("a", 80 << 30, 0)];
    let zeroed = [container("a", 0, 0)];
    let a = remainders(&inflated, &[issue_reading()], &truth, s());
    let b = remainders(&zeroed, &[issue_reading()], &truth, s());
    assert_eq!(a[0].unattributed, 3081 * MIB);
    assert_eq!(b[0].unattributed, 3081 * MIB);
    assert_eq!(a[0].holders[0].likely, 3081 * MIB, "at most the remainder");
    assert_eq!(b[0].holders, vec![]);
}

/// The driver's reserve (in v1's used) is the host's to know and is taken off; a process in the graphics
/// or MPS list is counted once (the larger figure) even when it is in the compute list too; host
/// processes count as processes. A GPU whose list is unread, or that lists a process without a figure,
/// has no remainder. A remainder within the threshold names nobody.
#[test]
fn what_the_host_knows_is_counted_once_and_unknowns_give_no_figure() {
    let r = GpuReading {
        used: 1000 * MIB,
        reserved: Some(400 * MIB),
        processes: Some(vec![(10, 300 * MIB), (20, 100 * MIB)]),
        other_processes: Some(vec![(10, 310 * MIB), (30, 50 * MIB)]),
        ..issue_reading()
    };
    let cs = [container("a", 900 * MIB, 600 * MIB)];
    let truth = truth_of(0, vec![proc_(10, 300 * MIB)]);
    let rs = remainders(&cs, std::slice::from_ref(&r), &truth, s());
    assert_eq!(
        (rs[0].reserved, rs[0].processes, rs[0].containers),
        (400 * MIB, 460 * MIB, 300 * MIB)
    );
    assert_eq!(rs[0].unattributed, 140 * MIB);
    assert_eq!(rs[0].holders, vec![], "140 MiB is within the threshold");
    let unread = GpuReading {
        processes: None,
        ..r.clone()
    };
    let unmeasured = GpuReading {
        unmeasured_processes: 1,
        ..r.clone()
    };
    assert_eq!(remainders(&cs, &[unread, unmeasured], &truth, s()), vec![]);
    let more_than_used = GpuReading {
        used: 100 * MIB,
        ..r
    };
    assert_eq!(
        remainders(&cs, &[more_than_used], &truth, s())[0].unattributed,
        0,
        "processes read after the used memory may add up past it: nothing, not an underflow"
    );
}

fn at(bytes: u64) -> Vec<Remainder> {
    vec![Remainder {
        index: 0,
        uuid: U0.into(),
        used: bytes,
        reserved: 0,
        processes: 0,
        containers: 0,
        unattributed: bytes,
        holders: vec![],
    }]
}

/// Logged only once the remainder has stayed past the threshold for `scans` collections in a row (a
/// transient one, between NVML's two readings, never is); again when it grows by another threshold; once
/// when it falls back. An unread collection changes nothing.
#[test]
fn logged_when_sustained_again_when_grown_and_when_gone() {
    let mut e = Episodes::default();
    let s = s();
    assert_eq!(e.scan(&at(1 << 30), s), vec![]);
    assert_eq!(e.scan(&at(1 << 30), s), vec![]);
    assert_eq!(
        e.scan(&at(0), s),
        vec![],
        "a transient remainder is never logged"
    );
    for _ in 0..2 {
        assert_eq!(e.scan(&at(1 << 30), s), vec![]);
    }
    assert_eq!(e.scan(&[], s), vec![], "an unread collection");
    assert_eq!(e.scan(&at(1 << 30), s), vec![Event::Began(0)]);
    assert_eq!(e.scan(&at(1 << 30), s), vec![], "logged once");
    assert_eq!(
        e.scan(&at((1 << 30) + 200 * MIB), s),
        vec![],
        "grown by less than the threshold"
    );
    assert_eq!(e.scan(&at(2 << 30), s), vec![Event::Grew(0)]);
    assert_eq!(e.scan(&at(2 << 30), s), vec![]);
    assert_eq!(
        e.scan(&at(256 * MIB), s),
        vec![Event::Ended(0)],
        "at the threshold is within it"
    );
    assert_eq!(e.scan(&at(0), s), vec![]);
    let once = Settings { scans: 1, ..s };
    assert_eq!(e.scan(&at(1 << 30), once), vec![Event::Began(0)]);
}

/// The lines: one each, naming the GPU, the figures and the suspect.
#[test]
fn the_lines_name_the_gpu_the_figures_and_the_suspect() {
    let cs = [container("exporter", 3590 * MIB, 3072 * MIB)];
    let truth = truth_of(0, vec![proc_(10, 518 * MIB)]);
    let rs = remainders(&cs, &[issue_reading()], &truth, s());
    let began = describe(&Event::Began(0), &rs, &cs, s());
    assert_eq!(
        began,
        "unattributed memory: GPU 0 (GPU-0): 3.01 GiB in use that no process's NVML figure shows, past 256 MiB for 3 collections (used 3.51 GiB, driver reserve 0 B, processes 518 MiB); likely held by container exporter (pod ml/p, container exporter), whose ledger charges 3.00 GiB more than NVML shows for its processes (3.51 GiB against 518 MiB; its ledger: vmm 3.00 GiB) (a hint from its ledger, a file the tenant writes)"
    );
    assert!(!began.contains('\n'));
    assert!(describe(&Event::Grew(0), &rs, &cs, s()).contains("shows, grown (used"));
    assert_eq!(
        describe(&Event::Ended(0), &at(12 * MIB), &cs, s()),
        "unattributed memory: GPU 0 (GPU-0): back to 12.0 MiB, within 256 MiB"
    );
}
