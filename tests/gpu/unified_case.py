#!/usr/bin/env python3
"""Unified memory on the GPU (docs/libvgpu.md, "Unified memory"), the library configured by its
environment (no container). Never asks for more managed memory than the card has free: the caller
checks free memory first, and the largest case here spills 8 GiB at most.

usage: unified_case.py LIBVGPU_SO          (runs every case; one JSON line per case on stdout)
       unified_case.py --worker KIND STEPS (one training run under whatever environment it was given)

Cases: a ~9 GiB Adam-trained MLP with a 4 GiB quota, without spill (must fail with OOM) and with an 8 GiB
spill budget (must finish), its step time against the bare card; a small model that fits, bare / spill /
oversubscribe (the modes' cost when everything fits); two oversubscribe processes with 6 GiB quotas."""
import json, os, subprocess, sys, time

def worker(kind, steps):
    import torch
    torch.manual_seed(0)
    if kind == "big":     # 5 x 10240^2 params = 2.1 GB; + grads + Adam's two moments: ~8.4 GB
        width, layers, batch = 10240, 5, 64
    else:                 # ~270 MB with Adam: fits any quota here
        width, layers, batch = 4096, 1, 256
    dev = "cuda"
    try:
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(batch, width, device=dev)
        times = []
        for _ in range(steps):
            torch.cuda.synchronize(); t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            torch.cuda.synchronize(); times.append(time.perf_counter() - t)
        warm = times[2:] or times
        print(json.dumps({"ok": True, "loss": float(loss), "step_ms": 1000 * sorted(warm)[len(warm) // 2],
                          "reserved": torch.cuda.memory_reserved(), "mem_get_info": torch.cuda.mem_get_info()}))
    except torch.cuda.OutOfMemoryError as e:
        print(json.dumps({"ok": False, "oom": True, "error": str(e).splitlines()[0][:200]}))

def run(lib, name, kind, steps, env):
    e = dict(os.environ)
    e.update(env)
    if lib:
        e["LD_PRELOAD"] = lib
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"/tmp/vgpu-unified-{name}-{os.getpid()}"
    p = subprocess.run([sys.executable, __file__, "--worker", kind, str(steps)], env=e,
                       capture_output=True, text=True, timeout=240)
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    res = json.loads(line) if line else {"ok": False, "rc": p.returncode, "stderr": p.stderr[-600:]}
    res.update(case=name)
    print(json.dumps(res), flush=True)
    return res

def main(lib):
    out = []
    out.append(run(None, "big-bare", "big", 8, {}))
    out.append(run(lib, "big-4g-plain", "big", 3, {"CUDA_DEVICE_MEMORY_LIMIT": "4g"}))
    out.append(run(lib, "big-4g-spill8g", "big", 8, {"CUDA_DEVICE_MEMORY_LIMIT": "4g", "VGPU_MEMORY_SPILL": "8g"}))
    for r in range(2):
        out.append(run(None, f"small-bare-{r}", "small", 60, {}))
        out.append(run(lib, f"small-spill-{r}", "small", 60, {"CUDA_DEVICE_MEMORY_LIMIT": "4g", "VGPU_MEMORY_SPILL": "8g"}))
        out.append(run(lib, f"small-oversub-{r}", "small", 60, {"CUDA_DEVICE_MEMORY_LIMIT": "4g", "CUDA_OVERSUBSCRIBE": "true"}))
    # two oversubscribe processes at once, 6 GiB quotas each (small models: the total stays tiny)
    e = dict(os.environ, LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_LIMIT="6g", CUDA_OVERSUBSCRIBE="true")
    ps = [subprocess.Popen([sys.executable, __file__, "--worker", "small", "40"],
                           env=dict(e, CUDA_DEVICE_MEMORY_SHARED_CACHE=f"/tmp/vgpu-unified-pair{i}-{os.getpid()}"),
                           stdout=subprocess.PIPE, text=True) for i in range(2)]
    for i, p in enumerate(ps):
        o, _ = p.communicate(timeout=240)
        line = next((l for l in o.splitlines() if l.startswith("{")), "{}")
        r = json.loads(line); r.update(case=f"oversub-pair-{i}"); print(json.dumps(r), flush=True)

if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1])
