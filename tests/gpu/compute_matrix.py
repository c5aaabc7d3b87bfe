#!/usr/bin/env python3
"""A workload written for the compute share's precision check (issue 24), not one it was calibrated on.

    compute_matrix.py --n N [--graph] --seconds S [--warmup W] [--start-at T]

A bf16 matmul loop of N x N matrices (2048: short kernels, 4096: medium, 8192: long). Eager: 24 matmuls,
then a synchronisation; graph: a CUDA graph of 24 matmuls replayed, a synchronisation every replay. The
loop runs W seconds untimed (the capped process spends its fresh bucket's credit), then counts the matmuls
done in S seconds. `--start-at` (time.time()) lines up the processes of a pair. Last stdout line:
`RESULT {json}` with matmuls per second.
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--start-at", type=float, default=0.0)
    a = ap.parse_args()
    per = 24
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(a.n, a.n, device="cuda", dtype=torch.bfloat16)

    def batch():
        for _ in range(per):
            torch.matmul(x, y, out=z)

    batch()
    torch.cuda.synchronize()
    step = batch
    if a.graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            batch()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            batch()
        step = g.replay
    torch.cuda.synchronize()
    if a.start_at:
        time.sleep(max(0.0, a.start_at - time.time()))
    end = time.time() + a.warmup
    while time.time() < end:
        step()
        torch.cuda.synchronize()
    done = 0
    t0 = time.time()
    while time.time() - t0 < a.seconds:
        step()
        torch.cuda.synchronize()
        done += per
    dt = time.time() - t0
    print("RESULT " + json.dumps({"n": a.n, "graph": a.graph, "matmuls": done, "seconds": round(dt, 3),
                                  "per_s": round(done / dt, 2)}), flush=True)


if __name__ == "__main__":
    main()
