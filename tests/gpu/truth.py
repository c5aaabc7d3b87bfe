"""The truth check every case of the GPU suite gets: NVML's own per-process figures, summed over the
processes that share a quota, never above that quota.

A `Watch` samples NVML (pynvml, else nvidia-smi) a few times a second in a thread of the suite, which is
never preloaded itself. For every process NVML lists, it reads /proc/PID/environ: a process that runs
under libvgpu (LD_PRELOAD names it) with a limit in its environment (CUDA_DEVICE_MEMORY_LIMIT, or
CUDA_DEVICE_MEMORY_LIMIT_<i> for GPU i) belongs to the quota of its ledger prefix
(CUDA_DEVICE_MEMORY_SHARED_CACHE) on that GPU; processes with one prefix share the quota, so their
figures are summed. `take()` returns the worst group since the last call. Processes configured by a
container's limits file (no limit in the environment) are left to their own case's checks.
"""
import os
import subprocess
import threading

import measure

DEFAULT_PREFIX = "(default)"


def parse_size(s):
    """Bytes of a limit as the environment writes it: 1073741824, 8g, 8Gi, 512MiB, 1.5G."""
    s = s.strip()
    units = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    low = s.lower().removesuffix("b").removesuffix("i")
    num = low.rstrip("kmgt")
    return int(float(num) * units[low[len(num):]])


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def quota_of(env, gpu):
    """(ledger prefix, limit in bytes) of a process's environment on NVML GPU `gpu`, or None."""
    if env is None or "libvgpu" not in env.get("LD_PRELOAD", ""):
        return None
    raw = env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{gpu}") or env.get("CUDA_DEVICE_MEMORY_LIMIT")
    try:
        limit = parse_size(raw) if raw else 0
    except (ValueError, KeyError):
        return None
    if limit <= 0:
        return None
    return env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE") or DEFAULT_PREFIX, limit


def _sample():
    """[(gpu index, pid, bytes)] of every compute process NVML lists."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.usedGpuMemory is not None:
                        out.append((i, p.pid, int(p.usedGpuMemory)))
            return out
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    idx = {}
    for line in measure._smi(["--query-gpu=index,uuid", "--format=csv,noheader"]).splitlines():
        i, _, u = line.partition(",")
        idx[u.strip()] = int(i)
    out = []
    for line in measure._smi(["--query-compute-apps=gpu_uuid,pid,used_memory",
                              "--format=csv,noheader,nounits"]).splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0] in idx and parts[1].isdigit() and parts[2].isdigit():
            out.append((idx[parts[0]], int(parts[1]), int(parts[2]) * measure.MIB))
    return out


def worst(samples, environ=_environ):
    """The group (prefix, GPU) whose summed figure is furthest above, or closest to, its limit."""
    groups = {}
    for gpu, pid, used in samples:
        q = quota_of(environ(pid), gpu)
        if q is None:
            continue
        g = groups.setdefault((q[0], gpu), {"limit": q[1], "used": 0, "pids": []})
        g["limit"] = min(g["limit"], q[1])
        g["used"] += used
        g["pids"].append(pid)
    best = None
    for (prefix, gpu), g in groups.items():
        r = {"prefix": prefix, "gpu": gpu, "used": g["used"], "limit": g["limit"], "pids": g["pids"]}
        if best is None or r["used"] / r["limit"] > best["used"] / best["limit"]:
            best = r
    return best


class Watch:
    def __init__(self, period=0.25):
        self.period = period
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.worst = None
        self.samples = 0
        self.error = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stop_ev.set()
        self.thread.join(timeout=5)

    def _loop(self):
        while not self.stop_ev.wait(self.period):
            try:
                w = worst(_sample())
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                self.error = f"{type(e).__name__}: {e}"
                continue
            except Exception as e:  # pynvml's own errors: no NVML here, nothing to watch
                self.error = f"{type(e).__name__}: {e}"
                return
            with self.lock:
                self.samples += 1
                if w and (self.worst is None or w["used"] / w["limit"] > self.worst["used"] / self.worst["limit"]):
                    self.worst = w

    def take(self):
        """(the worst group since the last take, or None; samples taken since)."""
        with self.lock:
            w, n = self.worst, self.samples
            self.worst, self.samples = None, 0
        return w, n


def self_check():
    """The grouping and the size grammar on made-up processes (no GPU needed); the suite runs it first."""
    envs = {1: {"LD_PRELOAD": "/x/libvgpu.so", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/a"},
            2: {"LD_PRELOAD": "/x/libvgpu.so", "CUDA_DEVICE_MEMORY_LIMIT": "1073741824",
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/a"},
            3: {"LD_PRELOAD": "", "CUDA_DEVICE_MEMORY_LIMIT": "1g"},
            4: {"LD_PRELOAD": "/x/libvgpu.so", "CUDA_DEVICE_MEMORY_LIMIT_1": "512Mi",
                "CUDA_DEVICE_MEMORY_LIMIT": "0"}}
    w = worst([(0, 1, 600 << 20), (0, 2, 600 << 20), (0, 3, 9 << 30), (1, 4, 100 << 20), (0, 4, 9 << 30)],
              environ=envs.get)
    assert w["prefix"] == "/a" and w["used"] == 1200 << 20 and w["limit"] == 1 << 30, w
    assert parse_size("1.5G") == 3 << 29 and parse_size("512MiB") == 512 << 20 and parse_size("42") == 42


if __name__ == "__main__":
    self_check()
    print("truth.py: self-check ok")
