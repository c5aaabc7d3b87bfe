#!/usr/bin/env python3
"""The compute share's workloads (run by compute.sh, under libvgpu.so with CUDA_DEVICE_SM_LIMIT or not).

    compute_case.py matmul --seconds S [--graph] [--start-at T] [--warmup W]   saturating bf16 matmul loop
    compute_case.py train  --steps N                              a PyTorch training step, median time

`matmul` keeps the GPU busy with 8192x8192 bf16 matmuls (eager: synchronising every 32; graph: a CUDA
graph of 32 matmuls replayed), counts the matmuls done in S seconds of wall time after a warm-up, and
prints TFLOP/s. `--start-at` (a time.time() value) lines two processes up to start together. The loop first
runs `--warmup` seconds (3) untimed: an unlimited GPU settles at its saturated clock, and a capped one spends
the credit a fresh bucket starts with, so what is timed is the steady state.
The last line on stdout is `RESULT {json}`.
"""
import argparse
import json
import statistics
import time


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def matmul_batch(torch, n, per):
    """The loop's unit of work, run once eagerly: `per` n×n bf16 matmuls into one output."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

    def batch():
        for _ in range(per):
            torch.matmul(a, b, out=c)

    batch()
    torch.cuda.synchronize()
    return batch


def capture(torch, batch, **graph_args):
    """`batch` warmed up on a side stream, then captured as a CUDA graph (PyTorch's recipe)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        batch()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph(**graph_args)
    with torch.cuda.graph(g):
        batch()
    return g


def matmul(torch, seconds, graph, start_at, warmup):
    n, per = 8192, 32
    batch = matmul_batch(torch, n, per)
    run = batch
    if graph:
        run = capture(torch, batch).replay
        run()
        torch.cuda.synchronize()
    if start_at:
        time.sleep(max(0.0, start_at - time.time()))
    w0 = time.perf_counter()
    while time.perf_counter() - w0 < warmup:
        run()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    done = 0
    while time.perf_counter() - t0 < seconds:
        run()
        torch.cuda.synchronize()
        done += per
    dt = time.perf_counter() - t0
    flop = 2.0 * n * n * n * done
    result(mode="graph" if graph else "eager", matmuls=done, seconds=round(dt, 3),
           tflops=round(flop / dt / 1e12, 2))


def train(torch, steps):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                          nn.Linear(4096, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device="cuda")
    y = torch.randn(512, 2048, device="cuda")
    times = []
    for i in range(steps + 10):
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 10:
            times.append((time.perf_counter() - t) * 1e3)
    result(step_ms=round(statistics.median(times), 3), steps=steps, loss=float(loss))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["matmul", "train"])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--steps", type=int, default=100)
    a = ap.parse_args()
    import torch
    if a.what == "matmul":
        matmul(torch, a.seconds, a.graph, a.start_at, a.warmup)
    else:
        train(torch, a.steps)


if __name__ == "__main__":
    main()
