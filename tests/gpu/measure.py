#!/usr/bin/env python3
"""What NVML measures, from outside any quota: the GPU suite's yardstick.

    measure.py PID...   {"<pid>": bytes of GPU memory NVML charges to that process, ...}, "source": ...
    measure.py --gpu    {"total": bytes, "used": bytes, "free": bytes} of GPU 0, "source": ...

Uses pynvml (nvidia-ml-py) when importable, else `nvidia-smi`. Run it without LD_PRELOAD (usage()
below does that): the interposer must not stand between the measurement and the driver.
A process NVML does not list gets 0. Prints one JSON line; exit status 1 if neither source works.
"""
import json
import os
import subprocess
import sys

MIB = 1 << 20
_CLEAN_ENV_DROP = ("LD_PRELOAD", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE")


def clean_env():
    """The environment without the interposer and its settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in _CLEAN_ENV_DROP and not k.startswith("CUDA_DEVICE_MEMORY_LIMIT_")}
    return env


def _smi(args):
    return subprocess.run(["nvidia-smi"] + args, capture_output=True, text=True, timeout=30,
                          env=clean_env(), check=True).stdout


def per_process(pids):
    """NVML's bytes for each PID on the GPU where it holds the most: a quota is per GPU, and a process
    with a context on a second GPU (CuPy makes one on every visible GPU) must not be summed across them."""
    pids = [int(p) for p in pids]
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            seen = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.usedGpuMemory is not None:
                        seen[p.pid] = max(seen.get(p.pid, 0), int(p.usedGpuMemory))
            return {str(p): seen.get(p, 0) for p in pids}, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    seen = {}
    for line in _smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]).splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            seen[int(parts[0])] = max(seen.get(int(parts[0]), 0), int(parts[1]) * MIB)
    return {str(p): seen.get(p, 0) for p in pids}, "nvidia-smi"


def per_gpu(pid):
    """NVML's bytes for PID on each GPU, by NVML index: {"0": bytes, "1": bytes, ...}."""
    pid = int(pid)
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                out[str(i)] = sum(int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                                  if p.pid == pid)
            return out, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    out, idx = {}, {}
    for line in _smi(["--query-gpu=index,uuid", "--format=csv,noheader"]).splitlines():
        i, u = (x.strip() for x in line.split(","))
        idx[u] = i
        out[i] = 0
    for line in _smi(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]).splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[1] == str(pid) and parts[2].isdigit() and parts[0] in idx:
            out[idx[parts[0]]] += int(parts[2]) * MIB
    return out, "nvidia-smi"


def gpu():
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            return {"total": int(m.total), "used": int(m.used), "free": int(m.free)}, "pynvml"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    line = _smi(["--query-gpu=memory.total,memory.used,memory.free", "--format=csv,noheader,nounits",
                 "-i", "0"]).strip().splitlines()[0]
    t, u, f = (int(x.strip()) * MIB for x in line.split(","))
    return {"total": t, "used": u, "free": f}, "nvidia-smi"


def usage_per_gpu(pid):
    """NVML's bytes for PID on each GPU ({"0": bytes, ...}), measured by a fresh process without the
    interposer; None if unmeasurable."""
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--per-gpu", str(pid)],
                           capture_output=True, text=True, timeout=60, env=clean_env())
        if r.returncode != 0:
            return None
        d = json.loads(r.stdout.strip().splitlines()[-1])
        d.pop("source", None)
        return d
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def usage(pid, python=None, env=None):
    """NVML's bytes for PID, measured by a fresh process without the interposer; None if unmeasurable.
    ENV: the environment to measure in (default: this one, without the interposer)."""
    try:
        r = subprocess.run([python or sys.executable, os.path.abspath(__file__), str(pid)],
                           capture_output=True, text=True, timeout=60, env=env or clean_env())
        if r.returncode != 0:
            return None
        return json.loads(r.stdout.strip().splitlines()[-1]).get(str(pid))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def main():
    try:
        if sys.argv[1:] == ["--gpu"]:
            d, src = gpu()
        elif len(sys.argv) == 3 and sys.argv[1] == "--per-gpu" and sys.argv[2].isdigit():
            d, src = per_gpu(sys.argv[2])
        elif sys.argv[1:] and all(a.isdigit() for a in sys.argv[1:]):
            d, src = per_process(sys.argv[1:])
        else:
            sys.exit("usage: measure.py PID... | --per-gpu PID | --gpu")
    except Exception as e:  # no NVML of either kind: say so in one line
        print(f"measure.py: cannot read NVML: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    d["source"] = src
    print(json.dumps(d))


if __name__ == "__main__":
    main()
