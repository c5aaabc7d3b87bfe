#!/usr/bin/env bash
# Issue 23 item 3 on a real GPU: kernel stack growth under a memory quota (stack_probe.cu), without the
# library, under a 1 GiB quota (the growth cannot fit: refused before the launch) and under an 8 GiB one
# (charged before the launch), each with the device's used memory and NVML's per-process figure read by
# nvidia-smi at each stage. VGPU_LIB (default target/vgpu/libvgpu.so); VGPU_LIB_BEFORE, if set, another
# build run the same way for comparison. Run from the repository root on the GPU machine.
set -u
root=$PWD
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nvcc -O2 -arch=sm_90 -o "$work/stack_probe" "$root/tests/gpu/stack_probe.cu" || exit 1
. "$root/tests/gpu/lib.sh"
quota_stages "$work/stack_probe" "$lib" ${VGPU_LIB_BEFORE:+"$(realpath -m "$VGPU_LIB_BEFORE")"}
