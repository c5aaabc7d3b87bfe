#!/usr/bin/env python3
"""What timing events between kernels cost the GPU, without the library (a diagnostic for issue 24).

    event_cost.py [--n 2048] [--seconds 3]

The compute share times launches with a CUDA event after each (and one before a launch queued behind
nothing). Under a 99% share a 2048² eager matmul loop kept ~94% of its bare rate where the same kernels as
a CUDA graph (two events per 24 matmuls) kept 98.5%. This runs the precision matrix's loop (24 bf16
matmuls a step, a synchronisation after each) bare, then with a timing event recorded after every
matmul, then with events that do not time (`enable_timing=False`), then with a timing event after every
fourth matmul, and prints each one's rate against the bare loop: `RESULT {json}`.
"""
import argparse
import json
import time

import torch


def rate(step, seconds):
    end = time.time() + 1.0
    while time.time() < end:
        step()
        torch.cuda.synchronize()
    done, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        step()
        torch.cuda.synchronize()
        done += 24
    return done / (time.time() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    timing = [torch.cuda.Event(enable_timing=True) for _ in range(25)]
    plain = [torch.cuda.Event(enable_timing=False) for _ in range(25)]

    def bare():
        for _ in range(24):
            torch.matmul(x, y, out=z)

    def every(events, k):
        def step():
            events[0].record()
            for i in range(24):
                torch.matmul(x, y, out=z)
                if (i + 1) % k == 0:
                    events[i + 1].record()
        return step

    out = {"n": a.n}
    base = rate(bare, a.seconds)
    out["bare_per_s"] = round(base, 1)
    for name, step in [("timing_each", every(timing, 1)), ("notiming_each", every(plain, 1)),
                       ("timing_every4", every(timing, 4))]:
        out[name] = round(rate(step, a.seconds) / base, 4)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
