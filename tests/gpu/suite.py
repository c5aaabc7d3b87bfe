#!/usr/bin/env python3
"""The real-GPU suite: every case under a quota enforced by libvgpu.so, run by tests/gpu/run.sh.

Each case runs in its own processes with LD_PRELOAD=libvgpu.so, CUDA_DEVICE_MEMORY_LIMIT=<quota> and a
CUDA_DEVICE_MEMORY_SHARED_CACHE of its own (so cases never share a quota), under a timeout; the suite as
a whole keeps to a time budget (GPU_SUITE_BUDGET_S, default 480 s) and skips what no longer fits.
Results: OUT/results.jsonl (one JSON object per case: "case", "ok", "seconds", the figures) and
OUT/summary.md (a table for docs/gpu-results.md). Logs of every process: OUT/logs/.
Exit status: 0 when every case that ran passed, 1 otherwise.

This orchestrator is never preloaded itself; it only starts preloaded children.
"""
import argparse
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import measure  # noqa: E402
import truth  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


class Suite:
    def __init__(self, a):
        self.a = a
        self.quota = truth.parse_size(a.quota)
        self.out = os.path.abspath(a.out)
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="vgpu-gpu-suite.")
        self.t0 = time.monotonic()
        self.results = []
        self.jsonl = open(os.path.join(self.out, "results.jsonl"), "w")
        self.fake = a.fake
        self.current = None  # the running child, killed if the suite itself is told to stop
        # NVML's truth, sampled all along: every case is checked against it in record()
        self.watch = None if a.fake else truth.Watch().start()

    def on_term(self, signum, frame):
        if self.current is not None and self.current.poll() is None:
            os.killpg(self.current.pid, signal.SIGKILL)
        raise SystemExit(128 + signum)  # unwinds through main's finally: the summary is still written

    # ----- plumbing -------------------------------------------------------------------------------------
    def remaining(self):
        return self.a.budget - (time.monotonic() - self.t0)

    def base_env(self):
        env = measure.clean_env()
        if self.fake:  # the project's fake driver stands in for the GPU (dry run of the suite)
            env["LD_LIBRARY_PATH"] = os.environ.get("GPU_FAKE_DIR") or os.path.join(ROOT, "target", "fake")
            env["FAKE_CUDA_DEVICES"] = "1x80Gi"
            env["FAKE_CUDA_STATE_DIR"] = os.path.join(self.tmp, "fake")
        return env

    def env(self, case, limit=True, preload=True, shared=None, extra=None):
        """Environment of a case's process: the interposer, the quota, a ledger of the case's own."""
        env = self.base_env()
        if preload:
            env["LD_PRELOAD"] = self.a.lib
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.path.join(self.tmp, shared or case, "ledger")
            os.makedirs(os.path.dirname(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]), exist_ok=True)
            if limit:
                env["CUDA_DEVICE_MEMORY_LIMIT"] = str(self.quota)
        env.update(extra or {})
        return env

    def run(self, name, cmd, env, timeout):
        """Runs one process; returns (rc, stdout, seconds). rc is None on timeout (the process group is
        killed). stderr goes to OUT/logs/NAME.log."""
        timeout = max(1, min(timeout, self.remaining()))
        log = open(os.path.join(self.logs, name + ".log"), "w")
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        t = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                             start_new_session=True)
        self.current = p
        try:
            out, _ = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc = None
        log.write(out)
        log.close()
        return rc, out, time.monotonic() - t

    @staticmethod
    def result_line(out):
        for line in reversed(out.splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        return None

    def record(self, case, ok, seconds=0.0, **fields):
        r = {"case": case, "ok": ok, "seconds": round(seconds, 2), "quota": self.quota}
        r.update(fields)
        # The truth check of every case: NVML's figures of the processes that shared a quota, summed,
        # never above it at any sample taken while the case ran (tests/gpu/truth.py).
        if self.watch is not None:
            w, n = self.watch.take()
            r["truth_samples"] = n
            if w is not None:
                r["truth_used"], r["truth_limit"], r["truth_pids"] = w["used"], w["limit"], len(w["pids"])
                if w["used"] > w["limit"] and ok is not None:
                    ok = r["ok"] = False
                    r["reason"] = (f"NVML truth {w['used'] // MIB} MiB over the quota {w['limit'] // MIB} MiB "
                                   f"(PIDs {w['pids']} on GPU {w['gpu']})")
            elif self.watch.error:
                r["truth_error"] = self.watch.error
        self.results.append(r)
        self.jsonl.write(json.dumps(r) + "\n")
        self.jsonl.flush()
        status = "PASS" if ok else ("SKIP" if ok is None else "FAIL")
        print(f"gpu-suite: {status} {case} ({seconds:.1f} s)", flush=True)
        return r

    def skip(self, case, why):
        return self.record(case, None, reason=why)

    def python_case(self, case, python, script, args, env, timeout):
        """Runs a Python case script; returns (result dict or None, rc, seconds)."""
        rc, out, secs = self.run(case, [python, os.path.join(HERE, script)] + args, env, timeout)
        return self.result_line(out), rc, secs

    def fits(self, case, need):
        if self.remaining() < need:
            self.skip(case, f"time budget: {self.remaining():.0f} s left, case needs ~{need} s")
            return False
        return True

    def accuracy(self, nvml):
        return None if nvml is None else round(nvml / self.quota, 4)

    # ----- cases ---------------------------------------------------------------------------------------
    def case_nvidia_smi(self):
        if not shutil.which("nvidia-smi"):
            return self.skip("nvidia-smi", "nvidia-smi not installed")
        q = ["nvidia-smi", "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits", "-i", "0"]
        rc0, bare, _ = self.run("nvidia-smi-bare", q, self.env("nvidia-smi", preload=False), 30)
        rc, out, secs = self.run("nvidia-smi", q, self.env("nvidia-smi"), 30)
        try:
            total, used = (int(x) for x in out.strip().splitlines()[0].split(","))
            btotal, bused = (int(x) for x in bare.strip().splitlines()[0].split(","))
        except (ValueError, IndexError):
            return self.record("nvidia-smi", False, secs, rc=rc, output=out[-300:])
        self.run("nvidia-smi-table", ["nvidia-smi"], self.env("nvidia-smi"), 30)  # kept in logs/
        return self.record("nvidia-smi", rc == 0 and total * MIB == self.quota and 0 <= used <= total, secs,
                           total_mib=total, used_mib=used, physical_total_mib=btotal, physical_used_mib=bused)

    def case_driverapi(self):
        exe = os.path.join(self.a.build, "driverapi")
        rc, out, secs = self.run("driverapi", [exe, "fill", "all", "-q", str(self.quota), "-c", "256"],
                                 self.env("driverapi"), 150)
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if not lines:
            return self.record("driverapi", False, secs, rc=rc, reason="no output (see logs/driverapi.log)")
        for r in lines:
            self.record(f"driverapi/{r.pop('kind')}", bool(r.pop("ok")), secs / len(lines),
                        granted=r["granted"], **{k: v for k, v in r.items() if k not in ("case", "granted", "quota")})
        if rc != 0 and all(r["ok"] for r in self.results if r["case"].startswith("driverapi/")):
            self.record("driverapi", False, secs, rc=rc, reason="exit status without a failed check")

    def case_escape(self):
        """Patterns that once let memory escape the quota: VMM handles released while mapped or retained and
        released, pools destroyed with live allocations. NVML's own figure for the process must stay within
        the quota while it holds everything it was granted."""
        exe = os.path.join(self.a.build, "driverapi")
        rc, out, secs = self.run("escape", [exe, "escape", "-q", str(self.quota)], self.env("escape"), 90)
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if not lines:
            return self.record("escape", False, secs, rc=rc, reason="no output (see logs/escape.log)")
        for r in lines:
            kind = r.pop("kind")
            r.pop("case", None)
            self.record(f"escape/{kind}", bool(r.pop("ok")), secs / len(lines), **r)

    def case_measure(self):
        """Memory nobody asks for by size (items 8/9 of 'hard quota, exactly'). Bare, the free-memory drops
        show what the real driver takes: a context (~500 MiB on H100/H200); cuCtxSetLimit heap 1 GiB and
        printf 64 MiB either at once or at the next launch ("first-launch"); stack 4 KiB per thread about
        (4096 - 1024) x SMs x threads per SM (the "bound"); a PTX library at load (EAGER) or at its first
        kernel (LAZY). Under the library every drop must be at least the bare one (charged >= taken)."""
        exe = os.path.join(self.a.build, "driverapi")
        rows = {}
        for label, preload in (("bare", False), ("vgpu", True)):
            rc, out, secs = self.run(f"measure-{label}", [exe, "measure"], self.env("measure", preload=preload), 60)
            rows[label] = {r["kind"]: r for r in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}
        bare, vg = rows["bare"], rows["vgpu"]
        if not bare or not vg:
            return self.record("measure", False, 0.0, reason="no output (see logs/measure-*.log)")
        for kind, b in bare.items():
            v = vg.get(kind, {})
            charged_ok = kind == "limit-heap-shrink" or v.get("drop", -1) >= b["drop"] - 2 * MIB
            self.record(f"measure/{kind}", charged_ok and v.get("rc") == b["rc"], 0.0, taken=b["drop"],
                        charged=v.get("drop"), bound=b["bound"], rc=b["rc"])

    def case_managed(self):
        # Managed memory may oversubscribe: never ask for more than the GPU has free (driverapi's cap is
        # one chunk past the quota's free, so the quota + 1 GiB must fit in what is really free).
        if self.fake:
            free = 1 << 62
        else:
            try:
                free = measure.gpu()[0]["free"]
            except Exception as e:  # no NVML: do not risk it
                return self.skip("driverapi/managed", f"cannot read the GPU's free memory: {e}")
        if free < self.quota + 2 * GIB:
            return self.skip("driverapi/managed", f"only {free // MIB} MiB free on the GPU")
        exe = os.path.join(self.a.build, "driverapi")
        rc, out, secs = self.run("driverapi-managed", [exe, "fill", "managed", "-q", str(self.quota), "-c", "512"],
                                 self.env("driverapi-managed"), 90)
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if not lines:
            return self.record("driverapi/managed", False, secs, rc=rc, reason="no output")
        r = lines[0]
        r.pop("kind")
        self.record("driverapi/managed", bool(r.pop("ok")), secs, **{k: v for k, v in r.items() if k not in ("case", "quota")})

    def case_devices(self):
        """An NVML query never initialises CUDA; CUDA_DEVICE_MEMORY_LIMIT_<i> follows NVML GPU i (2+ GPUs)."""
        py = sys.executable
        env = self.env("nvml-only", limit=False, extra={"CUDA_DEVICE_MEMORY_LIMIT_0": str(self.quota)})
        r, rc, secs = self.python_case("nvml-only", py, "devices_case.py", ["nvml-only"], env, 30)
        self.record("nvml-only", bool(r) and r["nvml_total"] == self.quota and r["cuda_count_rc_before_init"] == 3,
                    secs, rc=rc, result=r)
        a, b = 2 * GIB, 3 * GIB
        env = self.env("per-index", limit=False, extra={"CUDA_VISIBLE_DEVICES": "1,0",
                                                        "CUDA_DEVICE_MEMORY_LIMIT_0": str(a),
                                                        "CUDA_DEVICE_MEMORY_LIMIT_1": str(b)})
        r, rc, secs = self.python_case("per-index", py, "devices_case.py", ["per-index"], env, 60)
        devs = (r or {}).get("devices", [])
        if len(devs) < 2:
            return self.skip("per-index", "needs two GPUs")
        # CUDA ordinal 0 is NVML GPU 1 here: HAMi-core gives it CUDA_DEVICE_MEMORY_LIMIT_1.
        return self.record("per-index", [d["total"] for d in devs[:2]] == [b, a], secs, rc=rc, devices=devs)

    def start_holders(self, name, n, shared, args):
        exe = os.path.join(self.a.build, "driverapi")
        procs = []
        for i in range(n):
            log = open(os.path.join(self.logs, f"{name}-{i}.log"), "w")
            procs.append(subprocess.Popen([exe, "hold"] + args, env=self.env(name, shared=shared),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          text=True, bufsize=1, start_new_session=True))
        return procs

    @staticmethod
    def read_event(p, deadline):
        """The next JSON line of a holder, or None if it died or the deadline passed."""
        import select
        while time.monotonic() < deadline:
            r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                return None
            line = p.stdout.readline()
            if not line:
                return None
            if line.startswith("{"):
                return json.loads(line)
        return None

    def stop_holders(self, procs):
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def case_peak(self):
        """One process fills with cuMemAlloc to the refusal; NVML measures it there (the accuracy)."""
        t = time.monotonic()
        deadline = t + min(60, self.remaining())
        procs = self.start_holders("driverapi-peak", 1, "driverapi-peak", ["-c", "256"])
        p = procs[0]
        ready = self.read_event(p, deadline)
        held = None
        if ready:
            p.stdin.write("go\n")
            p.stdin.flush()
            held = self.read_event(p, deadline)
        nvml = measure.usage(p.pid, env=self.base_env()) if held else None
        self.stop_holders(procs)
        if not held:
            return self.record("driverapi-peak", False, time.monotonic() - t, reason="holder did not report")
        ok = (held["refused"] == "CUDA_ERROR_OUT_OF_MEMORY" and held["granted"] <= self.quota
              and held["total"] == self.quota and (nvml is None or nvml <= self.quota))
        return self.record("driverapi-peak", ok, time.monotonic() - t, granted=held["granted"],
                           refused=held["refused"], nvml_bytes=nvml, accuracy=self.accuracy(nvml),
                           total=held["total"], free_at_peak=held["free"])

    def case_shared(self, race):
        """4 processes, one quota. Sequential: each asks for 30% of the quota in one allocation, in turn;
        the first is granted, the fourth refused, the sum never above the quota. Race: all fill with
        256 MiB pieces at the same moment until refused; the sum never above the quota."""
        name = "shared-race" if race else "shared-sequential"
        t = time.monotonic()
        deadline = t + min(90, self.remaining())
        share = (self.quota * 3 // 10) // MIB * MIB
        args = ["-c", "256"] if race else ["-b", str(share), "-c", str(share // MIB)]
        procs = self.start_holders(name, 4, name, args)
        helds = [None] * 4
        try:
            if not all(self.read_event(p, deadline) for p in procs):
                return self.record(name, False, time.monotonic() - t, reason="a process did not start")
            if race:
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                helds = [self.read_event(p, deadline) for p in procs]
            else:
                for i, p in enumerate(procs):
                    p.stdin.write("go\n")
                    p.stdin.flush()
                    helds[i] = self.read_event(p, deadline)
            if not all(helds):
                return self.record(name, False, time.monotonic() - t, reason="a process did not report")
            nvml = {}
            for p in procs:
                nvml[p.pid] = measure.usage(p.pid, env=self.base_env())
        finally:
            self.stop_holders(procs)
        granted = [h["granted"] for h in helds]
        refused = [h["refused"] for h in helds]
        total = sum(granted)
        nvml_sum = None if any(v is None for v in nvml.values()) else sum(nvml.values())
        ok = total <= self.quota and all(h["total"] == self.quota for h in helds)
        # a refusal must come at the quota: the refused process then sees less free than it asked for
        if race:
            ok = ok and all(r == "CUDA_ERROR_OUT_OF_MEMORY" for r in refused) and all(h["free"] < 256 * MIB for h in helds)
        else:
            ok = (ok and granted[0] == share and granted[3] == 0 and refused[3] == "CUDA_ERROR_OUT_OF_MEMORY"
                  and helds[3]["free"] < share)
        if nvml_sum is not None:
            ok = ok and nvml_sum <= self.quota
        return self.record(name, ok, time.monotonic() - t, granted=total, per_process=granted, refused=refused,
                           nvml_bytes=nvml_sum, accuracy=self.accuracy(nvml_sum),
                           nvml_per_process=list(nvml.values()))

    def case_torch_fill(self, python, nocache, expandable=False):
        name = "torch-fill-nocache" if nocache else "torch-fill-expandable" if expandable else "torch-fill"
        extra = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if nocache else {}
        if expandable:  # segments grown with the VMM API (cuMemCreate/cuMemMap, handles released while mapped)
            extra["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        r, rc, secs = self.python_case(name, python, "torch_case.py", ["fill", "--quota", str(self.quota)],
                                       self.env(name, extra=extra), 150)
        if r is None:
            return self.record(name, False, secs, rc=rc, reason="no result (crash or timeout, see logs)")
        ok = (r["total"] == self.quota and r["oom_clean"] and r["granted"] <= self.quota and r["train_ok"]
              and (r["nvml_at_peak"] is None or r["nvml_at_peak"] <= self.quota))
        return self.record(name, ok, secs, nvml_bytes=r["nvml_at_peak"], accuracy=self.accuracy(r["nvml_at_peak"]),
                           **r)

    def case_torch_nolimit(self, python):
        bare, rc0, s0 = self.python_case("torch-nolimit-bare", python, "torch_case.py", ["info"],
                                         self.env("torch-nolimit", preload=False), 90)
        lib, rc1, s1 = self.python_case("torch-nolimit", python, "torch_case.py", ["info"],
                                        self.env("torch-nolimit", limit=False), 90)
        if bare is None or lib is None:
            return self.record("torch-nolimit", False, s0 + s1, reason="no result (see logs)")
        # total must be identical; free moves with whatever else runs on the GPU, so allow 64 MiB
        ok = (bare["total"] == lib["total"] and bare["props_total"] == lib["props_total"]
              and abs(bare["free"] - lib["free"]) <= 64 * MIB
              and abs(bare["free_after_1g"] - lib["free_after_1g"]) <= 64 * MIB)
        note = (f"total {bare['total'] // MIB}/{lib['total'] // MIB} MiB, free {bare['free'] // MIB}/"
                f"{lib['free'] // MIB} MiB (without/with the library)")
        return self.record("torch-nolimit", ok, s0 + s1, bare=bare, with_library=lib, note=note)

    def case_torch_perf(self, python):
        out = {}
        secs = 0.0
        # GPU step times drift between processes: alternate with/without, GPU_PERF_ROUNDS times, best of each
        rounds = int(os.environ.get("GPU_PERF_ROUNDS", "3"))
        order = [(f"{kind}{i or ''}", kind == "vgpu") for i in range(rounds) for kind in ("bare", "vgpu")]
        for label, preload in order:
            r, rc, s = self.python_case(f"torch-train-perf-{label}", python, "torch_case.py",
                                        ["train-perf", "--steps", "300"], self.env("torch-perf", preload=preload), 90)
            secs += s
            out[f"train_{label}"] = r
            extra = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
            r, rc, s = self.python_case(f"torch-churn-perf-{label}", python, "torch_case.py",
                                        ["churn-perf", "--pairs", "400", "--reps", "5"],
                                        self.env("torch-perf", preload=preload, extra=extra), 90)
            secs += s
            out[f"churn_{label}"] = r
            if self.remaining() < 60:
                break
        if not all(out.get(k) for k in ("train_bare", "train_vgpu", "churn_bare", "churn_vgpu")):
            return self.record("torch-perf", False, secs, reason="a run gave no result (see logs)", runs=out)

        def best(kind, field, labels):
            vals = [out[f"{kind}_{l}"][field] for l in labels if out.get(f"{kind}_{l}")]
            return min(vals)
        bare = [l for l, p in order if not p]
        vgpu = [l for l, p in order if p]
        tb, tv = best("train", "step_ms_median", bare), best("train", "step_ms_median", vgpu)
        cb, cv = best("churn", "us_per_pair_median", bare), best("churn", "us_per_pair_median", vgpu)
        # a benchmark, not a timed test: "ok" only says every run completed
        return self.record("torch-perf", True, secs, train_step_ms_bare=tb, train_step_ms_vgpu=tv,
                           train_ratio=round(tv / tb, 3), churn_us_bare=cb, churn_us_vgpu=cv,
                           churn_ratio=round(cv / cb, 3), runs=out)

    def case_jax(self, python):
        r, rc, secs = self.python_case("jax", python, "jax_case.py", [], self.env("jax"), 150)
        if r is None:
            return self.record("jax", False, secs, rc=rc, reason="no result (see logs/jax.log)")
        lim = r.get("bytes_limit") or 0
        nv = r.get("nvml_after_init")
        # preallocation follows the quota: 75% of it by default (well under it, far under the GPU)
        ok = (r["platform"] == "gpu" or r["platform"] == "cuda") and 0.5 * self.quota <= lim <= self.quota \
            and r["oom_clean"] and r["usable_after"] and (nv is None or nv <= self.quota)
        r["fill_granted"] = r.pop("granted")
        return self.record("jax", ok, secs, granted=lim, nvml_bytes=nv, accuracy=self.accuracy(nv),
                           prealloc_fraction=round(lim / self.quota, 4) if lim else None, **r)

    def case_cupy(self, python, mode):
        name = f"cupy-{mode}"
        r, rc, secs = self.python_case(name, python, "cupy_case.py", [mode], self.env(name), 120)
        if r is None:
            return self.record(name, False, secs, rc=rc,
                               reason=f"no result: exit status {rc} (a crash at the quota?) see logs/{name}.log")
        ok = (rc == 0 and r["oom_clean"] and r["total"] == self.quota and r["granted"] <= self.quota
              and r["usable_after"] and (r["nvml_at_peak"] is None or r["nvml_at_peak"] <= self.quota))
        return self.record(name, ok, secs, nvml_bytes=r["nvml_at_peak"], accuracy=self.accuracy(r["nvml_at_peak"]),
                           **r)

    def case_nccl(self, python):
        """NCCL all-reduce across two GPUs, a process per GPU under its quota: values right, each fills to a
        clean OutOfMemoryError, all-reduce still works there, NVML's figure per process within the quota."""
        extra = {"NCCL_NVLS_ENABLE": "0"}
        r, rc, secs = self.python_case("nccl", python, "nccl_case.py", ["--quota", str(self.quota)],
                                       self.env("nccl", extra=extra), 300)
        if r is None:
            return self.record("nccl", False, secs, rc=rc, reason="no result (crash or timeout, see logs/nccl.log)")
        if "skip" in r:
            return self.skip("nccl", r["skip"])
        fields = {}
        ok = rc == 0
        for k in r["ranks"]:
            nv = k.get("nvml_at_peak")
            good = (k.get("total") == self.quota and k.get("values_ok") and k.get("error_type") == "OutOfMemoryError"
                    and k.get("reduce_after_fill_ok") and 0 < k.get("granted", 0) <= self.quota
                    and (nv is None or nv <= self.quota))
            ok = ok and bool(good)
            fields[f"rank{k['rank']}"] = {x: k.get(x) for x in ("granted", "nvml_at_peak", "nvml_per_gpu", "error_type",
                                                                  "error")}
        return self.record("nccl", ok, secs, **fields)

    def case_bench(self):
        out = os.path.join(self.out, "bench")
        env = self.base_env()
        env.update({
            "BENCH_DRIVER": "fake" if self.fake else "system", "BENCH_LIBVGPU": self.a.lib, "BENCH_OUT": out,
            "BENCH_PROCS": self.a.bench_procs, "BENCH_ROUNDS": os.environ.get("GPU_BENCH_ROUNDS", "2"), "BENCH_REPS": "5",
            "BENCH_PAIR_ITERS": "2000", "BENCH_ITERS": "20000", "BENCH_PROC_ITERS": "500",
            "BENCH_START_RUNS": "1000", "BENCH_SKIP": "ledger", "PYTHON": sys.executable,
        })
        rc, stdout, secs = self.run("bench", ["bash", os.path.join(ROOT, "tests", "bench", "run.sh")], env, 240)
        raw = os.path.join(out, "raw.jsonl")
        rows = []
        if os.path.exists(raw):
            rows = [json.loads(l) for l in open(raw) if l.strip()]
        return self.record("bench", rc == 0, secs, rc=rc, results_md=os.path.join("bench", "results.md"),
                           raw=rows)

    def case_unified(self, python):
        """Unified memory (docs/libvgpu.md): a model needing ~9 GiB dies under a 4 GiB quota and finishes
        with an 8 GiB spill budget (the bare card's loss); CUDA IPC refused for spilled memory only; two
        oversubscribe processes. The library is configured by its environment (unified_case.py)."""
        env = self.base_env()
        rc, out, secs = self.run("unified", [python, os.path.join(HERE, "unified_case.py"), "cases", self.a.lib],
                                 env, 420)
        res = {}
        for line in out.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                res[r.get("case")] = r
        if "unified" in res and res["unified"].get("skip"):
            return self.skip("unified", res["unified"]["skip"])
        bare, plain, spill = res.get("big-bare", {}), res.get("big-4g-plain", {}), res.get("big-4g-spill8g", {})
        ipc = res.get("ipc-spill", {})
        pair = [res.get(f"oversub-pair-{i}", {}) for i in range(2)]
        checks = {
            "bare_finishes": bool(bare.get("ok")),
            "plain_oom": bool(plain.get("oom")),
            "spill_finishes_same_loss": bool(spill.get("ok")) and bool(bare.get("ok"))
            and abs(spill["loss"] - bare["loss"]) <= 1e-6 * max(1.0, abs(bare["loss"])),
            "spill_sees_quota": bool(spill.get("ok")) and spill["mem_get_info"][1] == 4 * GIB,
            "ipc_device_shares": ipc.get("device") == "shared",
            "ipc_spilled_not_supported": "not supported" in str(ipc.get("spilled", "")),
            "oversub_pair_finishes": all(p.get("ok") for p in pair),
            "oversub_pair_sees_48g": all(p.get("ok") and p["mem_get_info"][1] == 48 * GIB for p in pair),
        }
        return self.record("unified", rc == 0 and all(checks.values()), secs, checks=checks,
                           step_ms_bare=bare.get("step_ms"), step_ms_spill=spill.get("step_ms"),
                           spilled_bytes=spill.get("managed"), ipc=ipc, runs=res)

    def case_unified_bench(self, python):
        env = self.base_env()
        rc, out, secs = self.run("unified-bench", [python, os.path.join(HERE, "unified_case.py"), "bench",
                                                   self.a.lib], env, 420)
        md = out.split("MARKDOWN\n", 1)[1] if "MARKDOWN\n" in out else ""
        with open(os.path.join(self.out, "unified-bench.md"), "w") as f:
            f.write(md)
        print(md, flush=True)
        runs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        return self.record("unified-bench", rc == 0 and bool(md), secs, results_md="unified-bench.md", runs=runs)

    # ----- summary -------------------------------------------------------------------------------------
    def summary(self, device):
        def mib(v):
            return "" if v is None else f"{v / MIB:,.0f}"
        lines = [f"# GPU suite results", "",
                 f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
                 f"- device: {device}",
                 f"- quota: {self.quota // MIB} MiB; library: {self.a.lib}",
                 f"- wall time: {time.monotonic() - self.t0:.0f} s", "",
                 "| case | result | granted (MiB) | NVML-measured (MiB) | NVML / quota | NVML truth, worst sample (MiB) | notes |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in self.results:
            res = "pass" if r["ok"] else ("skipped" if r["ok"] is None else "**FAIL**")
            notes = []
            for k in ("reason", "note", "refused", "refused_at", "error_type", "per_process", "prealloc_fraction",
                      "total_mib", "train_ratio", "churn_ratio"):
                v = r.get(k)
                if v in (None, "", []):
                    continue
                if k == "per_process":
                    v = "/".join(f"{b // MIB}" for b in v) + " MiB"
                elif isinstance(v, list):
                    v = "/".join(x or "ok" for x in v)
                notes.append(f"{k}={v}")
            if r.get("checks"):
                bad = [k for k, v in r["checks"].items() if v is False]
                if bad:
                    notes.append("failed checks: " + ",".join(bad))
            tr = ("" if r.get("truth_used") is None else
                  f"{mib(r['truth_used'])} of {mib(r['truth_limit'])} ({r['truth_pids']} proc, {r['truth_samples']} samples)")
            lines.append(f"| {r['case']} | {res} | {mib(r.get('granted'))} | {mib(r.get('nvml_bytes'))} | "
                         f"{'' if r.get('accuracy') is None else r['accuracy']} | {tr} | {'; '.join(notes)} |")
        perf = next((r for r in self.results if r["case"] == "torch-perf" and r["ok"]), None)
        if perf:
            lines += ["", f"## PyTorch with and without the library (medians, best of {os.environ.get('GPU_PERF_ROUNDS', '3')} alternating runs)", "",
                      "| | without | with libvgpu | ratio |", "| --- | --- | --- | --- |",
                      f"| training step (ms) | {perf['train_step_ms_bare']:.3f} | {perf['train_step_ms_vgpu']:.3f} | {perf['train_ratio']} |",
                      f"| alloc+free, caching off (µs) | {perf['churn_us_bare']:.1f} | {perf['churn_us_vgpu']:.1f} | {perf['churn_ratio']} |"]
        bench_md = os.path.join(self.out, "bench", "results.md")
        if os.path.exists(bench_md):
            lines += ["", f"## Benchmark on this machine (tests/bench/run.sh, "
                          f"BENCH_DRIVER={'fake' if self.fake else 'system'})", ""]
            lines += ["#" + l if l.startswith("#") else l for l in open(bench_md).read().splitlines()[1:]]
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


def find_python(module, given):
    """An interpreter that has MODULE: the given one, /opt/torch's, any /opt/*/.venv, then this one."""
    cands = [given] if given else []
    cands += ["/opt/torch/.venv/bin/python3"] + sorted(glob.glob("/opt/*/.venv/bin/python3")) + [sys.executable]
    for c in cands:
        if not c or not os.path.exists(c):
            continue
        if c == sys.executable:
            if importlib.util.find_spec(module):
                return c
            continue
        r = subprocess.run([c, "-c", f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('{module}') else 1)"],
                           capture_output=True, timeout=30)
        if r.returncode == 0:
            return c
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libvgpu.so")
    ap.add_argument("--build", required=True, help="folder with the built driverapi")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quota", default=os.environ.get("GPU_QUOTA", "8Gi"))
    ap.add_argument("--budget", type=float, default=float(os.environ.get("GPU_SUITE_BUDGET_S", "480")))
    ap.add_argument("--bench-procs", default=os.environ.get("GPU_BENCH_PROCS", "1 8 16"))
    ap.add_argument("--only", default=os.environ.get("GPU_SUITE_ONLY", ""),
                    help="comma-separated case groups: smi,driverapi,devices,shared,torch,cupy,jax,nccl,perf,unified,unified-bench,bench")
    ap.add_argument("--fake", action="store_true", help="dry run against the project's fake driver")
    a = ap.parse_args()
    truth.self_check()  # the truth check's own grouping, before any case relies on it
    a.lib = os.path.abspath(a.lib)
    a.build = os.path.abspath(a.build)
    s = Suite(a)
    signal.signal(signal.SIGTERM, s.on_term)
    only = set(filter(None, a.only.split(",")))

    def want(group):
        return not only or group in only

    device = "fake driver (dry run)" if a.fake else "unknown"
    if not a.fake and shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=30, env=measure.clean_env())
        device = r.stdout.strip() or device
    print(f"gpu-suite: device {device}; quota {s.quota // MIB} MiB; budget {a.budget:.0f} s; out {s.out}", flush=True)
    torch_py = find_python("torch", os.environ.get("GPU_TORCH_PYTHON"))
    jax_py = find_python("jax", os.environ.get("GPU_JAX_PYTHON"))
    cupy_py = find_python("cupy", os.environ.get("GPU_CUPY_PYTHON"))
    print(f"gpu-suite: torch {torch_py}, jax {jax_py}, cupy {cupy_py}", flush=True)

    try:
        if want("smi"):
            s.case_nvidia_smi()
        if want("driverapi") and s.fits("driverapi", 20):
            s.case_driverapi()
            s.case_escape()
            s.case_measure()
            s.case_managed()
            s.case_peak()
        if want("devices") and s.fits("devices", 20):
            s.case_devices()
        if want("shared") and s.fits("shared", 20):
            s.case_shared(race=False)
            s.case_shared(race=True)
        if want("torch"):
            if not torch_py:
                s.skip("torch", "no Python with torch found")
            else:
                for nocache in (False, True):
                    if s.fits("torch-fill" + ("-nocache" if nocache else ""), 30):
                        s.case_torch_fill(torch_py, nocache)
                if s.fits("torch-fill-expandable", 30):
                    s.case_torch_fill(torch_py, False, expandable=True)
                if s.fits("torch-nolimit", 30):
                    s.case_torch_nolimit(torch_py)
        if want("cupy"):
            if not cupy_py:
                s.skip("cupy", "no Python with cupy found")
            else:
                for mode in ("pool", "async", "pool-then-async"):
                    if s.fits(f"cupy-{mode}", 20):
                        s.case_cupy(cupy_py, mode)
        if want("jax"):
            if not jax_py:
                s.skip("jax", "no Python with jax found")
            elif s.fits("jax", 40):
                s.case_jax(jax_py)
        if want("nccl") and torch_py and s.fits("nccl", 60):
            s.case_nccl(torch_py)
        if want("perf") and torch_py and s.fits("torch-perf", 90):
            s.case_torch_perf(torch_py)
        if want("unified") and torch_py and not a.fake and s.fits("unified", 150):
            s.case_unified(torch_py)
        if want("unified-bench") and torch_py and not a.fake and s.fits("unified-bench", 200):
            s.case_unified_bench(torch_py)
        if want("bench") and s.fits("bench", 60):
            s.case_bench()
    finally:
        if s.watch is not None:
            s.watch.stop()
        s.summary(device)
        shutil.rmtree(s.tmp, ignore_errors=True)
    failed = [r["case"] for r in s.results if r["ok"] is False]
    passed = sum(1 for r in s.results if r["ok"])
    skipped = sum(1 for r in s.results if r["ok"] is None)
    print(f"gpu-suite: {passed} passed, {len(failed)} failed, {skipped} skipped"
          + (f" (failed: {', '.join(failed)})" if failed else ""), flush=True)
    print(f"gpu-suite: results in {s.out}/results.jsonl and {s.out}/summary.md", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
