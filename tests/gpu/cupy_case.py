#!/usr/bin/env python3
"""CuPy under a quota: fill with 256 MiB arrays until cupy.cuda.memory.OutOfMemoryError, through the
default memory pool (`pool`) or the stream-ordered cudaMallocAsync pool (`async`, MemoryAsyncPool), or the
async pool after the default pool was filled and emptied (`pool-then-async`: the driver's first
stream-ordered use comes late in the process). Each must end in a clean OutOfMemoryError, after which CuPy
still works (the anchor crashed in `async`).

    cupy_case.py pool|async|pool-then-async

The last line on stdout is `RESULT {json}`; suite.py decides pass or fail from it.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

MIB = 1 << 20


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("pool", "async", "pool-then-async"):
        sys.exit("usage: cupy_case.py pool|async|pool-then-async")
    import cupy as cp
    if mode == "pool-then-async":
        first = cp.get_default_memory_pool()
        warm = []
        try:
            while True:
                warm.append(cp.empty(256 * MIB, dtype=cp.uint8))
        except cp.cuda.memory.OutOfMemoryError:
            pass
        del warm
        first.free_all_blocks()
    if mode != "pool":
        pool = cp.cuda.MemoryAsyncPool()
    else:
        pool = cp.get_default_memory_pool()
    cp.cuda.set_allocator(pool.malloc)
    free0, total = cp.cuda.runtime.memGetInfo()
    chunk = 256 * MIB
    held, err_type, err = [], None, None
    try:
        while (len(held) + 1) * chunk <= total + chunk:
            held.append(cp.empty(chunk, dtype=cp.uint8))
        cp.cuda.Stream.null.synchronize()
    except Exception as e:  # the type is the finding
        err_type, err = type(e).__name__, str(e).splitlines()[0][:300]
    clean = err_type == "OutOfMemoryError"
    granted = len(held) * chunk
    free_peak, _ = cp.cuda.runtime.memGetInfo()
    nvml_peak = measure.usage(os.getpid())
    del held
    cp.cuda.Stream.null.synchronize()
    pool.free_all_blocks()
    cp.cuda.Stream.null.synchronize()
    free_after, _ = cp.cuda.runtime.memGetInfo()
    usable_after = int((cp.arange(1000) ** 2).sum()) == 332833500
    print("RESULT " + json.dumps({
        "mode": mode, "cupy": cp.__version__, "total": int(total), "free_before": int(free0),
        "chunk": chunk, "granted": granted, "error_type": err_type, "error": err, "oom_clean": clean,
        "free_at_peak": int(free_peak), "free_after": int(free_after), "nvml_at_peak": nvml_peak,
        "usable_after": usable_after,
    }), flush=True)


if __name__ == "__main__":
    main()
