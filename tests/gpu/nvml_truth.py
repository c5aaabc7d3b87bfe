#!/usr/bin/env python3
"""What NVML's per-process SM utilisation says of a process whose GPU time is known (issue 41: the compute
share's floor, libvgpu/src/compute/truth.rs, integrates it). Runs CMD (a workload that prints
"launched=N seconds=S unit_ms=U": its GPU time is N x U ms), and meanwhile asks
nvmlDeviceGetProcessUtilization every PERIOD seconds for the samples newer than the last answer's newest,
as the library does. Prints every answer's shape (how many samples, their timestamps' gaps, the workload's
SM values), then the workload's GPU time integrated the library's way against the truth:

    nvml_truth.py [--period 0.1] -- CMD...

Read the lines to learn the driver's semantics: one sample per process per answer (the utilisation since
the last query) or one per sample period (with the period's length), and how close the integration is."""
import argparse
import ctypes
import re
import subprocess
import time


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint),
                ("mem", ctypes.c_uint), ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--period", type=float, default=0.1)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    assert nv.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nv.nvmlDeviceGetHandleByIndex_v2(a.index, ctypes.byref(dev)) == 0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    buf = (Sample * 256)()
    last = 0
    answers = []
    while proc.poll() is None:
        n = ctypes.c_uint(256)
        t = time.time()
        rc = nv.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(n), ctypes.c_ulonglong(last))
        took = time.time() - t
        got = [(s.pid, s.ts, s.sm) for s in buf[: n.value]] if rc == 0 else []
        answers.append((int(t * 1e6), rc, took, got))
        if got:
            last = max(last, max(g[1] for g in got))
        time.sleep(a.period)
    out = proc.stdout.read()
    m = re.search(r"launched=(\d+) seconds=([\d.]+) unit_ms=([\d.]+)", out)
    truth = int(m.group(1)) * float(m.group(3)) / 1e3 if m else float("nan")
    pid = proc.pid
    stamps = sorted({g[1] for ans in answers for g in ans[3]})
    gaps = [b - a_ for a_, b in zip(stamps, stamps[1:])]
    print(f"answers {len(answers)}, call ms median {sorted(x[2] for x in answers)[len(answers) // 2] * 1e3:.2f}")
    print(f"distinct timestamps {len(stamps)}; gaps us min {min(gaps) if gaps else '-'} "
          f"median {sorted(gaps)[len(gaps) // 2] if gaps else '-'}")
    for t, rc, took, got in answers[:12]:
        own = [(ts, sm) for p, ts, sm in got if p == pid]
        print(f"  at {t} rc {rc} samples {len(got)} own {own}")
    # The library's integration (truth.rs): the least gap between a batch's distinct timestamps is the
    # period; a sample counts from the later of the last batch's newest and its own previous, capped there.
    period = 0
    used_us = 0.0
    batch_newest = own_newest = 0
    for t, rc, took, got in answers:
        if not got:
            continue
        if batch_newest == 0:
            batch_newest = own_newest = max(max(g[1] for g in got), t)
            continue
        st = sorted({g[1] for g in got if g[1] > batch_newest})
        for x, y in zip(st, st[1:]):
            if y - x >= 10_000 and (period == 0 or y - x < period):
                period = y - x
        frm = max(own_newest, batch_newest)
        for ts, sm in sorted((g[1], g[2]) for g in got if g[0] == pid):
            if ts <= frm:
                continue
            span = ts - frm if period == 0 else min(ts - frm, period)
            used_us += min(sm, 100) * span / 100
            frm = own_newest = ts
        batch_newest = max(batch_newest, max(g[1] for g in got))
    print(f"workload: {out.strip()}")
    print(f"truth {truth:.3f} s of GPU time; NVML integrated {used_us / 1e6:.3f} s (period {period} us); "
          f"ratio {used_us / 1e6 / truth if truth == truth and truth > 0 else float('nan'):.3f}")


if __name__ == "__main__":
    main()
