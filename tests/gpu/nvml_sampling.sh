#!/usr/bin/env bash
# What the compute share wall reads on a real GPU (issue 24 item 3): NVML's per-process SM utilisation
# through the host tools' binding (vgpu_host::nvml, host/examples/nvml_readings built here for glibc 2.28
# and carried as NVML_READINGS), once a second while a PyTorch process keeps the GPU busy for 6 s and then
# stays alive and idle for 8 s. The binding asks for the samples since its previous reading and averages
# them: the idle seconds must read as idle (absent or 0), not as the last busy sample NVML still buffers.
# Run from the repository root on the GPU machine.
set -u
bin=${NVML_READINGS:-.gpu/nvml/nvml_readings}
py=${GPU_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
"$py" - <<'PY' &
import time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t = time.time()
while time.time() - t < 6:
    for _ in range(8):
        x @ x
    torch.cuda.synchronize()
print(f"busy_done t={time.time()-t:.1f}", flush=True)
time.sleep(8)
PY
pid=$!
sleep 2   # the process has its context and is busy
echo "worker pid=$pid"
"$bin" libnvidia-ml.so.1 12 | grep -E "gpu=0 " | sed "s/($pid,/(WORKER,/g"
wait "$pid"
