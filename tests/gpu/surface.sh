#!/usr/bin/env bash
# Issue 23 items 4, 6 and 9 on a real GPU, each with the truth read from outside the process (nvidia-smi:
# the device's used memory, which counts managed memory, and NVML's per-process figure, which does not):
#   item 4  spill mode: spilled memory prefetched / advised to the device (placement_probe.cu)
#   item 6  a library loaded with no context current, used in a context (library_probe.c, biglib.cu)
#   item 9  HMM/ATS: whether the GPU reaches malloc'd memory and moves it in (hmm_probe.cu)
# Run from the repository root on the GPU machine: VGPU_LIB (default target/vgpu/libvgpu.so) is the
# interposer; VGPU_LIB_BEFORE, if set, another build to run the same cases under for comparison.
# Prints every line with the device's used memory (MiB) at each "stage=" line. Needs nvcc, gcc, nvidia-smi.
set -u
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
echo "uvm_disable_hmm=$(cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null || echo unknown)"
nvidia-smi -q 2>/dev/null | grep -i "addressing mode" | sed 's/^ */nvidia-smi /'
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
nvcc -O2 -arch=sm_90 -o "$work/placement_probe" placement_probe.cu || exit 1
nvcc -O2 -arch=sm_90 -o "$work/hmm_probe" hmm_probe.cu || exit 1
nvcc -cubin -arch=sm_90 -o "$work/biglib.cubin" biglib.cu || exit 1
gcc -O2 -o "$work/library_probe" library_probe.c -I"$inc" -lcuda || exit 1
. ./lib.sh   # used, procs, sampled (the working directory is tests/gpu)
cases() {     # LIB LABEL
    local lib=$1 tag=$2
    echo "== $tag ($lib): idle device_used_mib=$(used)"
    echo "-- item 4: spill mode, 2 GiB quota, 8 GiB budget: spilled memory prefetched/advised to the device"
    sampled env LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_LIMIT=2g VGPU_MEMORY_SPILL=8g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tag-spill" "$work/placement_probe"
    echo "-- item 6: a 1.5 GiB library loaded with no context current, used in one, 1 GiB quota"
    sampled env LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tag-lib" \
        "$work/library_probe" "$work/biglib.cubin"
    echo "-- item 9: 1 GiB of malloc'd memory, 1 GiB quota"
    sampled env LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tag-hmm" \
        "$work/hmm_probe"
}
[ -n "${VGPU_LIB_BEFORE:-}" ] && cases "$(realpath "$VGPU_LIB_BEFORE")" before
cases "$(realpath "${VGPU_LIB:-../../target/vgpu/libvgpu.so}")" after
echo "== bare (no interposer)"
sampled "$work/library_probe" "$work/biglib.cubin"
sampled "$work/hmm_probe"
