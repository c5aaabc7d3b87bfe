#!/usr/bin/env python3
"""PyTorch under a quota (run by suite.py with LD_PRELOAD=libvgpu.so and CUDA_DEVICE_MEMORY_LIMIT set).

    torch_case.py fill  --quota BYTES   mem_get_info, fill with 256 MiB tensors to OutOfMemoryError, train
    torch_case.py info                  what PyTorch reports (for the no-limit comparison)
    torch_case.py train-perf            median training step time
    torch_case.py churn-perf            median alloc+free of mixed sizes (run with caching disabled)

The last line on stdout is `RESULT {json}`; suite.py decides pass or fail from it.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

MIB = 1 << 20


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def small_model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10),
    ).cuda()


def train(torch, steps, batch=256):
    """Trains the small model on one fixed random batch; returns (losses, step times in ms)."""
    torch.manual_seed(0)
    model = small_model(torch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # steady on a fixed batch: the loss must fall
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # item() synchronises
        times.append((time.perf_counter() - t0) * 1e3)
    return losses, times


def is_oom(torch, e):
    """PyTorch's own OutOfMemoryError, or (caching disabled) the runtime's 'out of memory' error."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def fill(args):
    import torch
    free0, total = torch.cuda.mem_get_info()
    props_total = torch.cuda.get_device_properties(0).total_memory
    chunk = args.chunk_mib * MIB
    cap = 2 * args.quota if args.quota else total + chunk
    held, err, err_type = [], None, None
    try:
        while (len(held) + 1) * chunk <= cap:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except Exception as e:  # which exception it was is the finding
        err, err_type = str(e).splitlines()[0][:300], type(e).__name__
        clean = is_oom(torch, e)
    else:
        clean = False
    granted = len(held) * chunk
    torch.cuda.synchronize()
    free_peak, _ = torch.cuda.mem_get_info()
    nvml_peak = measure.usage(os.getpid())
    del held
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()
    losses, _ = train(torch, args.steps)
    nvml_train = measure.usage(os.getpid())
    train_ok = all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    result(total=total, free_before=free0, props_total=props_total, chunk=chunk, granted=granted,
           error_type=err_type, error=err, oom_clean=clean, free_at_peak=free_peak, free_after=free_after,
           nvml_at_peak=nvml_peak, train_steps=len(losses), loss_first=losses[0], loss_last=losses[-1],
           train_ok=train_ok, nvml_after_train=nvml_train,
           max_reserved=torch.cuda.max_memory_reserved(),
           caching=os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1")


def info(args):
    import torch
    free0, total = torch.cuda.mem_get_info()
    t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free1, total1 = torch.cuda.mem_get_info()
    del t
    result(total=total, free=free0, total_after_1g=total1, free_after_1g=free1,
           props_total=torch.cuda.get_device_properties(0).total_memory,
           name=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda)


def train_perf(args):
    import torch
    losses, times = train(torch, args.warmup + args.steps)
    t = times[args.warmup:]
    result(steps=len(t), step_ms_median=statistics.median(t), step_ms_min=min(t),
           train_ok=losses[-1] < losses[0])


def churn_perf(args):
    import torch
    sizes = [4 << 10, 64 << 10, 1 << 20, 8 << 20, 64 << 20, 256 << 10, 16 << 20, 2 << 20]
    for s in sizes:  # warm-up
        t = torch.empty(s, dtype=torch.uint8, device="cuda")
        del t
    per_pair = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(args.pairs):
            t = torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device="cuda")
            del t
        torch.cuda.synchronize()
        per_pair.append((time.perf_counter() - t0) * 1e6 / args.pairs)
    result(pairs=args.pairs, reps=args.reps, us_per_pair_median=statistics.median(per_pair),
           us_per_pair_min=min(per_pair), sizes=sizes,
           caching=os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["fill", "info", "train-perf", "churn-perf"])
    ap.add_argument("--quota", type=int, default=0)
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    {"fill": fill, "info": info, "train-perf": train_perf, "churn-perf": churn_perf}[args.mode](args)


if __name__ == "__main__":
    main()
