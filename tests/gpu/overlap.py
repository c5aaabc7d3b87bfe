#!/usr/bin/env python3
"""Issue 41's attack 3 on a real GPU: work that overlaps on several streams, and a flood of long kernels.

    overlap.py pipeline --streams K [--per 50] [--n 512] [--seconds S]
    overlap.py flood [--n 6144] [--every 100] [--seconds S]

pipeline: K streams, each given PER bf16 N x N matmuls a round, one synchronisation a round: the kernels of
different streams may run at once. Prints kernels per second; a K-stream run against a 1-stream run is the
speed-up the share must keep (the issue: 4 streams kept 8-10% of it under a 50% share on an H200).
flood: bf16 N x N matmuls (~0.7 ms each on an H200 at 6144), a synchronisation every EVERY: kernels per
second, whose ratio to the same flood without the library is the GPU time it got (the issue: NVML read 31%
at a 50% share; this says whether it got 31%). Last stdout line: `RESULT {json}`. Warm-up 2 s untimed.
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
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    n = a.n or (512 if a.work == "pipeline" else 6144)
    k = a.streams if a.work == "pipeline" else 1
    streams = [torch.cuda.Stream() for _ in range(k)]
    mats = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.empty(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(k)]
    per = a.per if a.work == "pipeline" else a.every

    def rnd():
        for s, (x, y, z) in zip(streams, mats):
            with torch.cuda.stream(s):
                for _ in range(per):
                    torch.matmul(x, y, out=z)
        torch.cuda.synchronize()

    end = time.time() + 2.0
    while time.time() < end:
        rnd()
    done = 0
    t0 = time.time()
    while time.time() - t0 < a.seconds:
        rnd()
        done += per * k
    dt = time.time() - t0
    print("RESULT " + json.dumps({"work": a.work, "streams": k, "n": n, "kernels": done, "seconds": round(dt, 3),
                                  "per_s": round(done / dt, 1)}), flush=True)


if __name__ == "__main__":
    main()
