//! Unit tests of `nvml/library`: the binding's conversions, without a driver.

use super::lists::*;
use super::*;

fn sample(pid: u32, time_stamp: u64, sm: u32) -> UtilSample {
    UtilSample {
        pid,
        time_stamp,
        sm,
        ..Default::default()
    }
}

/// Regression: the newest buffered sample of each process was taken, asked from timestamp 0, so a
/// process that had stopped (or been frozen) still read as busy for as long as NVML kept its last
/// busy sample. Samples at or before the last reading are no figure for this one; the rest average.
#[test]
fn utilisation_is_the_mean_of_the_samples_since_the_last_reading() {
    let buf = [
        sample(7, 100, 100),
        sample(7, 200, 100),
        sample(7, 300, 0),
        sample(7, 400, 0),
        sample(9, 150, 80),
    ];
    let (f, newest) = mean_per_pid(&buf, 200);
    assert_eq!(
        f,
        vec![(7, 0.0)],
        "pid 9's sample and pid 7's first two are older than the last reading"
    );
    assert_eq!(newest, 400);
    let (f, newest) = mean_per_pid(&buf, 0);
    assert_eq!(
        f,
        vec![(7, 0.5), (9, 0.8)],
        "a first reading takes every sample NVML keeps"
    );
    assert_eq!(newest, 400);
    assert_eq!(mean_per_pid(&[], 400), (vec![], 400));
}

#[test]
fn a_library_that_is_not_there_is_one_line_naming_it() {
    let e = Library::load("/nonexistent/libnvidia-ml.so.1")
        .err()
        .unwrap();
    assert!(matches!(e, NvmlError::Load { .. }), "{e:?}");
    let s = e.to_string();
    assert!(
        s.starts_with("cannot load NVML (/nonexistent/libnvidia-ml.so.1): "),
        "{s}"
    );
    assert!(!s.contains('\n'));
    // Issue 46: dlopen's own reason, not libloading's bare "dlopen failed".
    assert!(
        s.ends_with("dlopen failed: /nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or directory"),
        "{s}"
    );
}

#[test]
fn a_library_without_nvml_is_a_missing_symbol() {
    // libc is loadable and has none of NVML's symbols.
    let e = Library::load("libc.so.6").err().unwrap();
    assert!(
        matches!(
            e,
            NvmlError::MissingSymbol {
                symbol: "nvmlInit_v2",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn architectures_are_named_as_nvidias_tools_name_them() {
    assert_eq!(architecture_name(7), Some("Ampere"));
    assert_eq!(architecture_name(8), Some("Ada Lovelace"));
    assert_eq!(architecture_name(9), Some("Hopper"));
    assert_eq!(architecture_name(10), Some("Blackwell"));
    // NVML_DEVICE_ARCH_UNKNOWN, and a number newer than this table: no attribute rather than a guess.
    assert_eq!(architecture_name(0xffff_ffff), None);
    assert_eq!(architecture_name(12), None);
}

/// A process list of three, one without a figure (`NVML_VALUE_NOT_AVAILABLE`), the first call answering
/// INSUFFICIENT_SIZE for a buffer too small.
unsafe extern "C" fn three_processes(_: Device, n: *mut c_uint, buf: *mut ProcessV2) -> c_int {
    let procs = [(10, 5 << 20), (11, u64::MAX), (12, 7 << 20)];
    // SAFETY: the binding passes a valid count and a buffer of that many entries.
    unsafe {
        if (*n as usize) < procs.len() {
            *n = procs.len() as c_uint;
            return INSUFFICIENT_SIZE;
        }
        for (i, (pid, used)) in procs.into_iter().enumerate() {
            buf.add(i).write(ProcessV2 {
                pid,
                used,
                ..Default::default()
            });
        }
        *n = procs.len() as c_uint;
    }
    SUCCESS
}

/// A process NVML lists without a figure is left out of the list and counted, so the monitor knows that
/// its memory is no per-process figure's (the unattributed remainder is not computed on such a GPU).
#[test]
fn processes_without_a_figure_are_counted_apart() {
    let (ps, unmeasured) = list(std::ptr::null_mut(), three_processes, |p: &ProcessV2| {
        (p.pid, p.used)
    })
    .unwrap();
    assert_eq!(ps, vec![(10, 5 << 20), (12, 7 << 20)]);
    assert_eq!(unmeasured, 1);
}

/// `nvmlMemory_v2`, as nvml.h defines it: 40 bytes, version 2 in the high byte.
#[test]
fn memory_v2_has_nvmls_layout_and_version() {
    assert_eq!(std::mem::size_of::<MemoryV2>(), 40);
    assert_eq!(MEMORY_V2, 40 | (2 << 24));
}
