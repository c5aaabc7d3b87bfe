#!/usr/bin/env python3
"""Issue 41's attack 3 on a real GPU: work that overlaps on several streams, and a flood of long kernels.

    overlap.py pipeline --streams K [--per 50] [--n 512 | --spin-us U] [--seconds S]
    overlap.py flood [--n 6144] [--every 100] [--duty F] [--seconds S]

pipeline: K streams, each given PER bf16 N x N matmuls a round, one synchronisation a round: the kernels of
different streams may run at once. Prints kernels per second; a K-stream run against a 1-stream run is the
speed-up the share must keep (the issue: 4 streams kept 8-10% of it under a 50% share on an H200).
`--spin-us U`: one-thread kernels that spin about U microseconds (`torch.cuda._sleep`) instead of matmuls,
so that kernels of different streams surely run at once (small matmuls launched from Python are bound by
the launch rate: an H200 ran 4 streams of them no faster than one).
flood: bf16 N x N matmuls (~0.7 ms each on an H200 at 6144), a synchronisation every EVERY: kernels per
second, whose ratio to the same flood without the library is the GPU time it got (the issue: NVML read 31%
at a 50% share; this says whether it got 31%). Each round's GPU time is read from events around it
(`gpu_us_per_kernel`: without the library, the kernel's own time); `--duty F` sleeps after each round so the
GPU is busy a fraction F of the time (a GPU half idle runs its kernels at other clocks than a busy one: the
kernel time at 50% duty without the library is what a 50% share's kernels take). Last stdout line: `RESULT {json}`. Warm-up 2 s untimed.
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", choices=["pipeline", "flood"])
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--per", type=int, default=50)
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--spin-us", type=float, default=0.0)
    ap.add_argument("--duty", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    n = a.n or (512 if a.work == "pipeline" else 6144)
    k = a.streams if a.work == "pipeline" else 1
    streams = [torch.cuda.Stream() for _ in range(k)]
    mats = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.empty(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(k)]
    per = a.per if a.work == "pipeline" else a.every

    # clock64 ticks at the SM clock: the spin's cycles for U microseconds, calibrated by events
    cycles = 0
    if a.spin_us:
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        c0.record()
        torch.cuda._sleep(10_000_000)
        c1.record()
        torch.cuda.synchronize()
        cycles = int(a.spin_us * 10_000_000 / (1000 * c0.elapsed_time(c1)))
    ev = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
    gpu_ms = 0.0

    def rnd():
        nonlocal gpu_ms
        t = time.time()
        if a.work == "flood":
            ev[0].record(streams[0])
        for s, (x, y, z) in zip(streams, mats):
            with torch.cuda.stream(s):
                for _ in range(per):
                    if a.spin_us:
                        torch.cuda._sleep(cycles)
                    else:
                        torch.matmul(x, y, out=z)
        if a.work == "flood":
            ev[1].record(streams[0])
        torch.cuda.synchronize()
        if a.work == "flood":
            gpu_ms += ev[0].elapsed_time(ev[1])
        if a.duty < 1.0:
            time.sleep((time.time() - t) * (1.0 - a.duty) / a.duty)

    end = time.time() + 2.0
    while time.time() < end:
        rnd()
    done = 0
    gpu_ms = 0.0
    t0 = time.time()
    while time.time() - t0 < a.seconds:
        rnd()
        done += per * k
    dt = time.time() - t0
    print("RESULT " + json.dumps({"work": a.work, "streams": k, "n": n, "spin_us": a.spin_us, "kernels": done, "seconds": round(dt, 3),
                                  "per_s": round(done / dt, 1), "t0": round(t0, 3), "t1": round(t0 + dt, 3),
                                  "gpu_us_per_kernel": round(1000 * gpu_ms / done, 2) if done else 0}), flush=True)


if __name__ == "__main__":
    main()
