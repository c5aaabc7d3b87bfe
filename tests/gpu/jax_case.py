#!/usr/bin/env python3
"""JAX under a quota: XLA preallocates XLA_PYTHON_CLIENT_MEM_FRACTION (default 75%) of what the driver
reports as total, so under libvgpu.so it must take 75% of the quota, not of the GPU. Then fills the
preallocated pool with 256 MiB arrays until JAX's resource-exhausted error.

The last line on stdout is `RESULT {json}`; suite.py decides pass or fail from it.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

MIB = 1 << 20


def main():
    import jax
    import jax.numpy as jnp
    dev = jax.devices()[0]
    jnp.ones(1).block_until_ready()  # the client (and its preallocation) exists from here
    stats = dev.memory_stats() or {}
    nvml_init = measure.usage(os.getpid())
    chunk = 256 * MIB
    held, err_type, err = [], None, None
    try:
        for _ in range(4096):
            held.append(jnp.zeros((chunk // 4,), dtype=jnp.float32).block_until_ready())
    except Exception as e:  # the type is the finding
        err_type, err = type(e).__name__, str(e).splitlines()[0][:300]
    granted = len(held) * chunk
    nvml_peak = measure.usage(os.getpid())
    del held
    ok_after = float(jnp.arange(1000.0).sum()) == 499500.0
    print("RESULT " + json.dumps({
        "platform": dev.platform, "device": str(dev), "jax": jax.__version__,
        "bytes_limit": stats.get("bytes_limit"), "bytes_reserved": stats.get("bytes_reserved"),
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "default"),
        "nvml_after_init": nvml_init, "granted": granted, "error_type": err_type, "error": err,
        "oom_clean": err is not None and ("RESOURCE_EXHAUSTED" in err or "out of memory" in err.lower()),
        "nvml_at_peak": nvml_peak, "usable_after": ok_after,
    }), flush=True)


if __name__ == "__main__":
    main()
