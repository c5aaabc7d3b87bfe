#!/usr/bin/env bash
# Issue 48 item 5 on two GPUs (tests/gpu/managed_peer_probe.cu): managed memory allocated on GPU 0, faulted
# into GPU 1 by a kernel there, read-mostly copies made by reads on both, then plain memory on GPU 1. Bare,
# under VGPU_LIB and under VGPU_LIB_BEFORE when set, each with CUDA_DEVICE_MEMORY_LIMIT=$QUOTA on both GPUs;
# at each stage each GPU's used memory and NVML's per-process figures (nvidia-smi) beside the library's
# view. Results in $OUT/managed-peer.txt. Environment: QUOTA (4G), MANAGED_MIB (2048), PLAIN_MIB (3072).
# Prints "skipped" with fewer than two GPUs. Run from the repository root on the GPU machine.
set -u
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
mkdir -p "$out"
res=$out/managed-peer.txt
W=$(mktemp -d /tmp/vgpu-mpeer.XXXXXX)
trap 'rm -rf "$W"' EXIT
nvcc -O2 -o "$W/probe" tests/gpu/managed_peer_probe.cu || exit 1
gpus() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | tr '\n' ';'; }
procs() { nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits | sed 's/GPU-\(........\)[^,]*/\1/' | tr '\n' ';'; }
sampled() {
    "$@" 2>&1 | while IFS= read -r l; do
        echo "  $l"
        case $l in stage=*) echo "  gpus_used_mib=[$(gpus)] per_process=[$(procs)]";; esac
    done
}
{
    echo "date: $(date -u '+%F %T') UTC; git $(git rev-parse --short HEAD 2>/dev/null)"
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
    nvidia-smi topo -m 2>/dev/null | head -4
    echo "libvgpu sha256 $(sha256sum "$lib" | cut -c1-16)${before:+; before $(sha256sum "$before" | cut -c1-16)}"
    echo "== bare"
    sampled "$W/probe" "${MANAGED_MIB:-2048}" "${PLAIN_MIB:-3072}"
    for L in "$lib" ${before:+"$before"}; do
        echo "== $L, quota ${QUOTA:-4G} on each GPU"
        sampled env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT="${QUOTA:-4G}" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/l-$RANDOM" \
            LIBCUDA_LOG_LEVEL=1 "$W/probe" "${MANAGED_MIB:-2048}" "${PLAIN_MIB:-3072}"
    done
} | tee "$res"
