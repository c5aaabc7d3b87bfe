#!/usr/bin/env python3
"""Unified memory on the GPU (docs/libvgpu.md, "Unified memory"), the library configured by its
environment (no container). Never asks for more managed memory than the card has free: every case checks
the card's free memory first, and the largest spills 8 GiB at most.

usage: unified_case.py cases LIBVGPU_SO   the functional cases, one JSON line each on stdout:
           a ~9 GiB Adam-trained MLP under a 4 GiB quota, plain (must fail with OOM) and with an 8 GiB
           spill budget (must finish with the bare card's loss); CUDA IPC of spilled and of device memory;
           two oversubscribe processes with 48 GiB quotas (96 GiB on an 80 GiB card)
       unified_case.py bench LIBVGPU_SO   the benchmark (make bench on a GPU machine): one JSON line per run,
           then a Markdown table on stdout after the line "MARKDOWN":
           - each mode's cost when everything fits: a ~11 ms training step, bare / spill / oversubscribe,
             alternated for UNIFIED_ROUNDS rounds (default 5), medians
           - the slowdown of the same step with 10%, 25% and 50% of its memory spilled
       unified_case.py --worker KIND STEPS   one training run under the environment it was given"""
import ctypes, json, os, subprocess, sys, time

GIB = 1 << 30
MIB = 1 << 20
MODELS = {  # width, layers, batch
    "big": (10240, 5, 64),     # 5 x 10240^2 params = 2.1 GB; + grads + Adam's two moments: ~8.4 GB
    "small": (4096, 1, 256),   # ~270 MB with Adam
    "mid": (4096, 8, 4096),    # ~2.7 GB with Adam and activations; a ~11 ms step on an H100
}


def managed_bytes(torch):
    """Bytes of the caching allocator's segments that are managed memory (spilled or oversubscribed),
    asked of the driver (cuPointerGetAttribute IS_MANAGED), and the allocator's total."""
    cu = ctypes.CDLL("libcuda.so.1")
    total = managed = 0
    for seg in torch.cuda.memory_snapshot():
        m = ctypes.c_uint(0)
        # CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
        if cu.cuPointerGetAttribute(ctypes.byref(m), 8, ctypes.c_uint64(seg["address"])) == 0 and m.value:
            managed += seg["total_size"]
        total += seg["total_size"]
    return managed, total


def worker(kind, steps):
    import torch
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    width, layers, batch = MODELS[kind]
    try:
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to("cuda")
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(batch, width, device="cuda")
        times = []
        for _ in range(steps):
            torch.cuda.synchronize(); t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            torch.cuda.synchronize(); times.append(time.perf_counter() - t)
        warm = times[3:] or times
        free, total = torch.cuda.mem_get_info()
        managed, segs = managed_bytes(torch)
        q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout
        nvml = next((int(l.split(",")[1]) * MIB for l in q.splitlines() if l.split(",")[0].strip() == str(os.getpid())), None)
        print(json.dumps({"nvml_used": nvml, "ok": True, "loss": float(loss), "step_ms": 1000 * sorted(warm)[len(warm) // 2],
                          "reserved": torch.cuda.memory_reserved(), "mem_get_info": [free, total],
                          "managed": managed, "segments": segs}))
    except torch.cuda.OutOfMemoryError as e:
        print(json.dumps({"ok": False, "oom": True, "error": str(e).splitlines()[0][:200]}))


def ipc_worker():
    """CUDA IPC of a tensor within the quota and of one spilled past it (the library must refuse the
    second with CUDA_ERROR_NOT_SUPPORTED), and what the driver itself answers for managed memory."""
    import torch
    r = {}
    a = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")       # within the 1 GiB quota
    b = torch.empty(1536 * MIB, dtype=torch.uint8, device="cuda")      # past it: spilled
    for name, t in (("device", a), ("spilled", b)):
        try:
            t.untyped_storage()._share_cuda_()
            r[name] = "shared"
        except RuntimeError as e:
            r[name] = str(e).splitlines()[0][:160]
    cu = ctypes.CDLL("libcuda.so.1")
    p = ctypes.c_uint64(0)
    h = (ctypes.c_ubyte * 64)()
    cu.cuMemAllocManaged(ctypes.byref(p), ctypes.c_size_t(MIB), 1)
    r["driver_on_managed"] = cu.cuIpcGetMemHandle(h, p)
    cu.cuMemFree_v2(p)
    print(json.dumps({"ok": True, **r}))


def free_bytes():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) * MIB if out else 0


def run(lib, name, kind, steps, env, args=None):
    e = dict(os.environ)
    e.update(env)
    if lib:
        e["LD_PRELOAD"] = lib
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"/tmp/vgpu-unified-{name}-{os.getpid()}"
    cmd = [sys.executable, __file__] + (args or ["--worker", kind, str(steps)])
    try:
        p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        res = {"ok": False, "timeout": 300, "case": name}
        print(json.dumps(res), flush=True)
        return res
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    res = json.loads(line) if line else {"ok": False, "rc": p.returncode, "stderr": p.stderr[-600:]}
    res.update(case=name)
    print(json.dumps(res), flush=True)
    return res


def cases(lib):
    if free_bytes() < 20 * GIB:
        print(json.dumps({"case": "unified", "ok": None, "skip": f"{free_bytes() // MIB} MiB free, 20 GiB needed"}))
        return
    run(None, "big-bare", "big", 8, {})
    run(lib, "big-4g-plain", "big", 3, {"CUDA_DEVICE_MEMORY_LIMIT": "4g"})
    run(lib, "big-4g-spill8g", "big", 8, {"CUDA_DEVICE_MEMORY_LIMIT": "4g", "VGPU_MEMORY_SPILL": "8g"})
    run(lib, "ipc-spill", None, 0, {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "VGPU_MEMORY_SPILL": "2g"}, ["--ipc"])
    # two oversubscribe processes at once whose quotas (48 GiB each) sum past the card (80 GiB), which plain
    # mode's admission would refuse; small models, so the managed memory actually asked for stays tiny
    e = dict(os.environ, LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_LIMIT="48g", CUDA_OVERSUBSCRIBE="true")
    ps = [subprocess.Popen([sys.executable, __file__, "--worker", "small", "40"],
                           env=dict(e, CUDA_DEVICE_MEMORY_SHARED_CACHE=f"/tmp/vgpu-unified-pair{i}-{os.getpid()}"),
                           stdout=subprocess.PIPE, text=True) for i in range(2)]
    for i, p in enumerate(ps):
        o, _ = p.communicate(timeout=240)
        line = next((l for l in o.splitlines() if l.startswith("{")), "{}")
        r = json.loads(line); r.update(case=f"oversub-pair-{i}"); print(json.dumps(r), flush=True)


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def bench(lib):
    if free_bytes() < 12 * GIB:
        print(json.dumps({"case": "unified-bench", "ok": None, "skip": f"{free_bytes() // MIB} MiB free"}))
        return
    rounds = int(os.environ.get("UNIFIED_ROUNDS", "5"))
    steps = int(os.environ.get("UNIFIED_STEPS", "40"))
    big = {"CUDA_DEVICE_MEMORY_LIMIT": "16g"}
    modes = {"bare": (None, {}), "spill": (lib, dict(big, VGPU_MEMORY_SPILL="8g")),
             "oversubscribe": (lib, dict(big, CUDA_OVERSUBSCRIBE="true"))}
    fits = {m: [] for m in modes}
    cal = None
    for r in range(rounds):
        for m, (l, env) in modes.items():
            res = run(l, f"fits-{m}-{r}", "mid", steps, env)
            if res.get("ok"):
                fits[m].append(res["step_ms"])
                if m == "spill" and cal is None:
                    cal = res
    rows = []
    if cal:
        # What the library charges besides the allocator's segments (context, modules, cuBLAS workspace):
        # from its own cuMemGetInfo, total - free - segments.
        free, total = cal["mem_get_info"]
        other = total - free - cal["segments"]
        segs = cal["segments"]
        for frac in (0.10, 0.25, 0.50):
            # the device part is the quota less spill mode's room for lazily loaded code (1/16, <= 256 MiB)
            device = other + int(segs * (1 - frac))
            quota = device * 16 // 15 if device // 15 < 256 * MIB else device + 256 * MIB
            quota -= quota % MIB
            res = run(lib, f"spill-{int(frac * 100)}", "mid", int(os.environ.get("UNIFIED_SPILL_STEPS", "10")),
                      {"CUDA_DEVICE_MEMORY_LIMIT": str(quota), "VGPU_MEMORY_SPILL": "8g"})
            rows.append((frac, quota, res))
    b = median(fits["bare"])
    md = ["| mode (everything fits) | step, median of rounds | vs bare |", "| --- | --- | --- |"]
    for m, v in fits.items():
        med = median(v)
        md.append(f"| {m} | {med:.3f} ms ({', '.join(f'{x:.3f}' for x in v)}) | "
                  f"{(med / b - 1) * 100:+.2f}% |" if med and b else f"| {m} | no result | |")
    md += ["", "| spilled (target) | quota | spilled, measured | step | vs bare | NVML (process) |",
           "| --- | --- | --- | --- | --- | --- |"]
    for frac, quota, res in rows:
        if res.get("ok"):
            got = res["managed"] / res["segments"] if res["segments"] else 0
            md.append(f"| {frac:.0%} | {quota // MIB} MiB | {got:.1%} ({res['managed'] // MIB} MiB) | "
                      f"{res['step_ms']:.2f} ms | {res['step_ms'] / b:.2f}x | {(res.get('nvml_used') or 0) // MIB} MiB |"
                      if b else "")
        else:
            why = res.get("error") or (f"timeout {res['timeout']} s" if "timeout" in res else res.get("stderr", "")[-120:])
            md.append(f"| {frac:.0%} | {quota // MIB} MiB | failed: {why} | | | |")
    print("MARKDOWN")
    print("\n".join(md))


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "--ipc":
        ipc_worker()
    elif sys.argv[1] == "cases":
        cases(sys.argv[2])
    elif sys.argv[1] == "bench":
        bench(sys.argv[2])
    else:
        sys.exit(__doc__)
