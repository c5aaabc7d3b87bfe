#!/usr/bin/env bash
# Issue 23 leftovers on a real GPU (nocur_probe.cu): a CUkernel with 16 KiB of local memory per thread
# launched while no context is current (on its stream, and on the legacy default stream), and a green
# context created and destroyed; without the library, then under a 1 GiB and an 8 GiB quota, each stage
# with the device's used memory and NVML's per-process figure read by nvidia-smi. VGPU_LIB (default
# target/vgpu/libvgpu.so); VGPU_LIB_BEFORE, if set, another build run the same way. Run from the
# repository root on the GPU machine.
set -u
root=$PWD
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nvcc -O2 -arch=sm_90 -o "$work/nocur_probe" "$root/tests/gpu/nocur_probe.cu" -lcuda || exit 1
. "$root/tests/gpu/lib.sh"
quota_stages "$work/nocur_probe" "$lib" ${VGPU_LIB_BEFORE:+"$(realpath -m "$VGPU_LIB_BEFORE")"}
