#!/usr/bin/env python3
"""A workload written for the compute share's precision check (issue 24), not one it was calibrated on.

    compute_matrix.py --n N [--mode eager|graph|compile] [--work matmul|conv] --seconds S [--warmup W]
                      [--barrier DIR --parties P]

A bf16 matmul loop of N x N matrices (2048: short kernels, 4096: medium, 8192: long), 24 matmuls a step and a
synchronisation after each step. eager: 24 `torch.matmul`s; graph: a CUDA graph of them, replayed;
compile: `torch.compile` of 24 matmuls each followed by a scaled tanh (Inductor: cuBLAS's matmul and a
Triton kernel launched by Triton's own launcher). `--work conv` is a second family, one the share was never
tuned on (issue 41's check): 24 cuDNN 3x3 convolutions of 256 channels on 28x28 bf16 images (channels-last),
a batch of N/256 (8, 16, 32), each followed by a ReLU (compile: fused by Inductor); "matmuls" then counts
convolutions. The loop runs W seconds untimed (the capped process
spends its fresh bucket's credit), then counts the matmuls done in S seconds. `--barrier DIR --parties P`
lines up the processes of a pair: each starts once P processes are ready (set up, compiled). Last stdout
line: `RESULT {json}` with matmuls per second and `ticks`, [CLOCK_MONOTONIC ms, matmuls so far] about
every 100 ms from the warm-up's start (the library's trace uses the same clock).
"""
import argparse
import json
import os
import time

import torch


def lined_up(barrier, parties):
    if not barrier:
        return
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.time() + 180
    while len(os.listdir(barrier)) < parties and time.time() < deadline:
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--mode", choices=["eager", "graph", "compile"], default="eager")
    ap.add_argument("--graph", action="store_true", help="the same as --mode graph")
    ap.add_argument("--work", choices=["matmul", "conv"], default="matmul")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--barrier", default="")
    ap.add_argument("--parties", type=int, default=2)
    a = ap.parse_args()
    mode = "graph" if a.graph else a.mode
    per = 24
    x = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(a.n, a.n, device="cuda", dtype=torch.bfloat16)
    scale = 1.0 / a.n ** 0.5

    def batch():
        for _ in range(per):
            torch.matmul(x, y, out=z)

    def chain(u, v):
        for _ in range(per):
            u = torch.tanh((u @ v) * scale)
        return u

    if a.work == "conv":
        conv = torch.nn.Conv2d(256, 256, 3, padding=1, bias=False).to("cuda", torch.bfloat16)
        conv = conv.to(memory_format=torch.channels_last)
        x = torch.randn(a.n // 256, 256, 28, 28, device="cuda", dtype=torch.bfloat16)
        x = x.to(memory_format=torch.channels_last)
        y = None

        @torch.no_grad()
        def batch():
            u = x
            for _ in range(per):
                u = torch.relu(conv(u))

        @torch.no_grad()
        def chain(u, _):
            for _ in range(per):
                u = torch.relu(conv(u))
            return u

    step = batch
    if mode == "compile":
        compiled = torch.compile(chain)

        def step():
            compiled(x, y)
    step()
    torch.cuda.synchronize()
    if mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            batch()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            batch()
        step = g.replay
    step()
    torch.cuda.synchronize()
    lined_up(a.barrier, a.parties)
    ticks = []
    done = 0
    next_tick = 0

    def tick():
        nonlocal next_tick
        now = time.monotonic_ns() // 1_000_000
        if now >= next_tick:
            ticks.append([now, done])
            next_tick = now + 100

    end = time.time() + a.warmup
    while time.time() < end:
        step()
        torch.cuda.synchronize()
        done += per
        tick()
    start_done = done
    t0 = time.time()
    while time.time() - t0 < a.seconds:
        step()
        torch.cuda.synchronize()
        done += per
        tick()
    dt = time.time() - t0
    ticks.append([time.monotonic_ns() // 1_000_000, done])
    print("RESULT " + json.dumps({"n": a.n, "mode": mode, "work": a.work, "matmuls": done - start_done, "seconds": round(dt, 3),
                                  "per_s": round((done - start_done) / dt, 2), "ticks": ticks}), flush=True)


if __name__ == "__main__":
    main()
