#!/usr/bin/env bash
# libvgpu against the real driver (run on the GPU machine through the device tool, not in CI):
# both test clients over every allocation kind, PyTorch (caching allocator and cudaMallocAsync), nvidia-smi,
# and 4 processes sharing one quota. Needs target/vgpu/libvgpu.so and target/clients/* carried over.
set -u
cd "$(dirname "$0")/../.."
L=$PWD/target/vgpu/libvgpu.so
PY=/opt/torch/.venv/bin/python3
export CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu-gpu-smoke
rm -f /tmp/vgpu-gpu-smoke.*
q() { LD_PRELOAD=$L CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-8g} "$@"; }
echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
echo "== nvidia-smi under an 8g quota"; q nvidia-smi --query-gpu=memory.total,memory.used,memory.free --format=csv,noheader
q nvidia-smi | grep -i mib
echo "== bare vs preloaded without limit"
target/clients/rt_client info 2>&1 | grep op=info
LD_PRELOAD=$L target/clients/rt_client info 2>&1 | grep op=info
for c in rt_client linked_client; do
    echo "== $c, 8g quota, every kind"
    LIBCUDA_LOG_LEVEL=3 q timeout 90 target/clients/$c info alloc 1g pitch 1m 256 managed 256m array 4096 4096 \
        array3d 512 512 64 mipmap 2048 2048 4 async 256m pool 256m vmm 256m graph 256m module info \
        fill 512m info free-all sync trim info 2>&1 | grep -v "^op=load"
done
echo "== procaddr"
q target/clients/rt_client procaddr cuMemAlloc procaddr cuMemAllocAsync 13000 ptds procaddr cuGetProcAddress 2>&1 | grep procaddr
for conf in "" "backend:cudaMallocAsync" "nocache"; do
    echo "== PyTorch, 8g quota, PYTORCH_CUDA_ALLOC_CONF='$conf'"
    nc=0; [ "$conf" = nocache ] && { nc=1; conf=""; }
    PYTORCH_NO_CUDA_MEMORY_CACHING=$nc PYTORCH_CUDA_ALLOC_CONF=$conf q timeout 120 $PY - <<'PY'
import subprocess, torch
f, t = torch.cuda.mem_get_info(); print("mem_get_info free", f >> 20, "MiB total", t >> 20, "MiB")
xs = []
try:
    while True:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    print("OutOfMemoryError after", len(xs) * 256, "MiB of tensors")
out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], capture_output=True, text=True).stdout
print("NVML per-process:", out.strip().replace("\n", "; "))
del xs; torch.cuda.empty_cache()
m = torch.nn.Linear(4096, 4096).cuda(); opt = torch.optim.SGD(m.parameters(), 0.01)
for _ in range(20):
    loss = m(torch.randn(512, 4096, device="cuda")).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
torch.cuda.synchronize(); print("training loop ok, loss", round(float(loss), 4))
PY
done
echo "== 4 processes sharing a 4g quota"
for i in 1 2 3 4; do (sleep 16 | LIBCUDA_LOG_LEVEL=3 LIMIT=4g q target/clients/rt_client info sleep 4 fill 128m wait 2>&1 | grep -E "op=fill|context" > /tmp/vg-p$i) & done
sleep 12; LIMIT=4g q nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';'; echo
wait; cat /tmp/vg-p*
echo "== after exit"; LIMIT=4g q target/clients/rt_client info 2>&1 | grep op=info
