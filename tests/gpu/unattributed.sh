#!/usr/bin/env bash
# Issue 48, "the node sees what no per-process figure shows", on a real GPU: `vgpuctl monitor`'s unattributed
# memory (used − driver reserve − every listed process's figure) and `vgpuctl status`'s line, with no
# library, for four cases on GPU 0: idle; a process holding a plain allocation (its context is in its
# figure); an export kept by its descriptor after the handle's release (`cuMemCreate` 1 GiB,
# `cuMemExportToShareableHandle`, `cuMemRelease`); 1 GiB of managed memory prefetched to the GPU. Beside
# each, nvidia-smi's view. And the monitor's log line once the export's remainder lasted three collections.
#   VGPUCTL   the vgpuctl to run (default target/release/vgpuctl)
#   OUT       results folder (unattributed.txt)
# Run on an H200 2026-11-29 (docs/gpu-results.md): the export and managed memory each read 1.01 GiB unattributed.
set -uo pipefail
vgpuctl=$(realpath "${VGPUCTL:-target/release/vgpuctl}")
out=${OUT:-/tmp/unattributed}
mkdir -p "$out"
log=$out/unattributed.txt
: >"$log"
w=$(mktemp -d)
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
gcc -O2 -std=gnu11 -Wno-deprecated-declarations -I"$inc" -DRT_CLIENT tests/clients/client.c -o "$w/rt_client" -ldl -lpthread \
    || { echo "unattributed: client build failed" | tee "$log"; exit 1; }
nvml=$(ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}')
nvml=${nvml:-libnvidia-ml.so.1}
mkdir -p "$w/state"
printf 'state_root = "%s"\nnvml_library = "%s"\n' "$w/state" "$nvml" >"$w/config.toml"
export VGPU_CONFIG=$w/config.toml
echo "### $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0); nvml $nvml" >>"$log"

# show NAME: the monitor's figures for GPU 0, status's line and nvidia-smi's.
show() {
    echo "### $1" >>"$log"
    "$vgpuctl" monitor --once 2>>"$log" | grep -E '^(hami_host_gpu_memory_used_bytes|vgpu_host_gpu_memory_(unattributed|processes|reserved)_bytes)\{.*device_index="0"' \
        | sed 's/{.*}//' >>"$log"
    "$vgpuctl" status 2>&1 | grep -A1 '^GPU  *USED' >>"$log"
    nvidia-smi --query-gpu=memory.used,memory.reserved --format=csv,noheader -i 0 | sed 's/^/nvidia-smi used, reserved: /' >>"$log"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader -i 0 | sed 's/^/nvidia-smi process: /' >>"$log"
}
# during NAME SECS OPS...: the client runs OPS then sleeps SECS; shown once its ops are done.
during() {
    local name=$1 secs=$2; shift 2
    "$w/rt_client" "$@" sleep "$secs" >"$w/client.out" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do grep -q '^op=sleep' "$w/client.out" && break; sleep 0.1; done
    grep -v '^op=load\|^op=init' "$w/client.out" | sed 's/^/client: /' >>"$log"
    show "$name"
    [ -n "${KEEP_MONITOR:-}" ] && {
        "$vgpuctl" monitor --listen 127.0.0.1:0 --interval 1 >"$w/mon.log" 2>&1 &
        local mon=$!
        sleep 6
        kill "$mon"
        grep 'unattributed memory' "$w/mon.log" >>"$log"
    }
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}
show "idle"
during "a process with 1 GiB of plain memory" 20 device 0 '!alloc' 1g truth 0
KEEP_MONITOR=1 during "an export kept by its descriptor after the release" 20 vmm-fd 1g '!vmm-export' '!vmm-drop-first' truth 0
during "1 GiB of managed memory prefetched to the GPU" 20 device 0 '!managed' 1g prefetch-device truth 0
show "idle again"
cat "$log"
