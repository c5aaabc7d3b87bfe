#!/usr/bin/env python3
"""NCCL all-reduce across two GPUs, one process per GPU, each under its own quota (run by suite.py with
LD_PRELOAD=libvgpu.so and CUDA_DEVICE_MEMORY_LIMIT set; NCCL_NVLS_ENABLE=0). Each process: all-reduce a
64 MiB tensor 20 times (checks the values), fill its GPU with 256 MiB tensors to OutOfMemoryError, give
one back and all-reduce again (NCCL still works at the quota); NVML's own figure for the process on each
GPU, read at the peak, must stay within the quota (which is per GPU).

    nccl_case.py --quota BYTES

The last line on stdout is `RESULT {json}` with one entry per rank; suite.py decides pass or fail.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure  # noqa: E402

MIB = 1 << 20


def worker(rank, world, port, out):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    r = {"rank": rank}
    try:
        r["total"] = int(torch.cuda.mem_get_info()[1])
        x = torch.full((64 * MIB // 4,), float(rank + 1), device="cuda")
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        r["values_ok"] = x[0].item() == 3.0 * 2 ** 19 and x[-1].item() == 3.0 * 2 ** 19
        held, r["error_type"] = [], None
        try:
            while len(held) < 4096:
                held.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            r["error_type"] = type(e).__name__
        r["granted"] = len(held) * 256 * MIB
        # per GPU: a process's quota is per GPU, and NCCL may touch the peer GPU too
        per_gpu = measure.usage_per_gpu(os.getpid())
        r["nvml_per_gpu"] = per_gpu
        r["nvml_at_peak"] = None if per_gpu is None else max(per_gpu.values(), default=0)
        if held:
            held.pop()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        r["reduce_after_fill_ok"] = x[0].item() == 3.0 * 2 ** 20
    except Exception as e:  # the type is the finding
        r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    finally:
        dist.destroy_process_group()
    out.put(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quota", type=int, required=True)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    world = 2
    if torch.cuda.device_count() < world:
        print("RESULT " + json.dumps({"skip": f"{torch.cuda.device_count()} GPU(s)"}), flush=True)
        return
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, a.port, out)) for r in range(world)]
    for p in procs:
        p.start()
    ranks = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ranks.sort(key=lambda r: r["rank"])
    print("RESULT " + json.dumps({"ranks": ranks, "quota": a.quota}), flush=True)


if __name__ == "__main__":
    main()
