#!/usr/bin/env bash
# `vgpuctl update` on a real GPU (issue 27): a PyTorch process under the library (LD_PRELOAD and a limits
# file, no container) with a 4 GiB quota holds 3 GiB, is refused 3 GiB more, then sees
# torch.cuda.mem_get_info's total become 8 GiB within a second of `vgpuctl update … --memory-limit 8Gi`, and
# the same 3 GiB allocation fits; nvidia-smi under the library shows the new total. The state folder is laid
# out as the hook provisions it (marker, limits.json with its second name limits.mounted.json, the ledger the
# process creates), so vgpuctl updates it exactly as it updates a container's. Then a shrink to 4 GiB below
# what it holds: vgpuctl records what NVML shows the process holding (limits.json's held_at_shrink, to
# compare with nvidia-smi's figure for it), and the monitor's watchdog reports a pending shrink up to it.
# The limits record the script's own cgroup, as the hook records a container's, so that the watchdog's
# attribution (by cgroup: the host's PID namespace names no container) finds the process.
# Run from the repository root on the GPU machine with GPU_UPDATE_DIR holding libvgpu.so, libvgpu_core.so and
# vgpuctl (built for glibc 2.28).
set -u
dir=$(realpath "${GPU_UPDATE_DIR:-.gpu/update}")
py=${GPU_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
work=$(mktemp -d)
root=$work/state
c=$root/containers/gpu-update-1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0
mkdir -p "$c/ledgers"
marker='Made by vgpu (vgpu-hook / vgpu-container-runtime). vgpu removes only folders holding this file.'
echo "$marker" > "$root/containers/.vgpu-state"
echo "$marker" > "$c/.vgpu-state"
cat > "$c/limits.json" <<EOF
{"version": 1, "container_id": "gpu-update-1", "init_pid": $$, "pid_ns": $(stat -L -c %i /proc/self/ns/pid),
 "cgroup": "$(sed -n 's/^0:://p' /proc/self/cgroup)",
 "devices": [{"index": 0, "uuid": "$uuid", "memory_limit": 4294967296, "ledger": "ledgers/$uuid.ledger"}]}
EOF
ln "$c/limits.json" "$c/limits.mounted.json"
printf 'state_root = "%s"\n' "$root" > "$work/config.toml"
export VGPU_CONFIG=$work/config.toml
under() { LD_PRELOAD=$dir/libvgpu.so VGPU_LIMITS_FILE=$c/limits.mounted.json LIBCUDA_LOG_LEVEL=2 "$@"; }
echo "nvidia-smi under the library before: $(under nvidia-smi --query-gpu=memory.total --format=csv,noheader -i 0)"
under "$py" - "$work" <<'PY' &
import os, sys, time, torch
work = sys.argv[1]
GIB = 1 << 30
free, total = torch.cuda.mem_get_info()
print(f"before: total={total} free={free}", flush=True)
a = torch.empty(3 * GIB, dtype=torch.uint8, device="cuda")
try:
    b = torch.empty(3 * GIB, dtype=torch.uint8, device="cuda")
    print("before: a second 3 GiB FITS (unexpected)", flush=True)
    del b
except torch.cuda.OutOfMemoryError:
    print("before: a second 3 GiB refused (OutOfMemoryError)", flush=True)
open(os.path.join(work, "ready"), "w").close()
t0 = time.time()
while torch.cuda.mem_get_info()[1] != 8 * GIB and time.time() - t0 < 10:
    time.sleep(0.001)
seen = time.time()
free, total = torch.cuda.mem_get_info()
print(f"after: total={total} free={free} seen_at={seen:.3f}", flush=True)
b = torch.empty(3 * GIB, dtype=torch.uint8, device="cuda")
print(f"after: a second 3 GiB allocated; torch holds {torch.cuda.memory_allocated() / GIB:.2f} GiB", flush=True)
open(os.path.join(work, "done"), "w").close()
while not os.path.exists(os.path.join(work, "exit")):
    time.sleep(0.05)
PY
pid=$!
for _ in $(seq 600); do [ -e "$work/ready" ] && break; sleep 0.1; done
sleep 0.3
t0=$(date +%s.%N)
"$dir/vgpuctl" update gpu-update-1 --memory-limit 8Gi --state-root "$root"
echo "update: rc=$? started_at=$t0 returned_at=$(date +%s.%N)"
for _ in $(seq 300); do [ -e "$work/done" ] && break; sleep 0.1; done
echo "nvidia-smi under the library after: $(under nvidia-smi --query-gpu=memory.total --format=csv,noheader -i 0)"
"$dir/vgpuctl" status --state-root "$root" | head -3
"$dir/vgpuctl" update gpu-update-1 --memory-limit 4Gi --state-root "$root"
echo "shrink: rc=$?"
echo "shrink: held_at_shrink=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["devices"][0].get("held_at_shrink"))' "$c/limits.json") bytes"
echo "shrink: nvidia-smi's compute processes (pid, MiB): $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i 0 | tr '\n' ' ')"
"$dir/vgpuctl" monitor --once --state-root "$root" 2>&1 | grep -E 'pending shrink|over quota|vgpu_container_gpu_memory_nvml_bytes\{' | head -5
touch "$work/exit"
wait "$pid"
echo "worker exit=$?"
rm -rf "$work"
