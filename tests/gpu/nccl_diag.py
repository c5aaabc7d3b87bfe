#!/usr/bin/env python3
"""Diagnostic (not a pass/fail case): where NCCL's device memory comes from, step by step. Two processes,
a GPU each; at each step every rank prints NVML's own figure for it on its GPU and what the library's
ledger says (quota - cuMemGetInfo's free, under the preload), so the step where they part is visible.

    LD_PRELOAD=... CUDA_DEVICE_MEMORY_LIMIT=8Gi CUDA_DEVICE_MEMORY_SHARED_CACHE=... nccl_diag.py
    nccl_diag.py            (bare: NVML only)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import measure  # noqa: E402

MIB = 1 << 20


def worker(rank, world, port):
    import torch
    import torch.distributed as dist

    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")

    def limit(which):
        v = ctypes.c_size_t(0)
        return v.value if cuda.cuCtxGetLimit(ctypes.byref(v), which) == 0 else None

    def step(name):
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        nv = (measure.usage_per_gpu(os.getpid()) or {}).get(str(rank))
        # CU_LIMIT_STACK_SIZE 0, PRINTF_FIFO_SIZE 1, MALLOC_HEAP_SIZE 2: the driver grows the stack on its own
        # when a kernel needs more (local memory for every resident thread)
        print(json.dumps({"rank": rank, "step": name, "stack": limit(0), "printf": limit(1), "heap": limit(2),
                          "nvml_mib": None if nv is None else nv // MIB,
                          "ledger_mib": (total - free) // MIB, "total_mib": total // MIB,
                          "torch_reserved_mib": torch.cuda.memory_reserved() // MIB}), flush=True)

    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")
    step("context")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    step("init_process_group")
    x = torch.ones(64 * MIB // 4, device="cuda")
    step("tensor")
    dist.all_reduce(x)
    step("first_all_reduce")
    for _ in range(20):
        dist.all_reduce(x)
    step("all_reduce_x20")
    dist.barrier()
    step("barrier")
    dist.destroy_process_group()
    step("destroyed")


def main():
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, 2, 29544)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)


if __name__ == "__main__":
    main()
