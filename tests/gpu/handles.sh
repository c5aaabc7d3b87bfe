#!/usr/bin/env bash
# Issue 48 items 2-4 on a real GPU: what keeps device memory alive after its handle or pointer is released
# (tests/gpu/handles_probe.c): an exported descriptor (three 1 GiB rounds of create, export, release), another
# process's export mapped in 64 MiB windows, a sparse array's tile, a multicast binding (skipped where the
# GPU has no NVLink switch), and what 48.2 follows: a legacy IPC handle opened by another process (of the
# same container, of another, one that outlives its exporter), a shared pool's pointer imported by another
# process (of the same container, of another: the exporter's pool reservation printed after its free and
# trim) and a dma-buf descriptor, each kept past the exporter's free or not. Not run on a GPU yet for the
# ipc-other, ipc-outlive, pool and pool-other cases (added with the library's hooks, 2026-11-29). Each case without the library, then under
# VGPU_LIB (default target/vgpu/libvgpu.so) at a QUOTA (default 2G) quota, then under VGPU_LIB_BEFORE when
# set; at each stage the device's used memory and NVML's per-process figures (nvidia-smi) and the quota view
# (cuMemGetInfo, the library's view under it). Results in $OUT/handles.txt (OUT: target/gpu-results).
# Environment: CUDA_INCLUDE (/usr/local/cuda/include), HANDLES_CASES (all but multicast), HANDLES_MIB (1024), TWO_QUOTA
# (4G: the quota of the two-process cases, windows, ipc* and pool*).
# Run from the repository root on the GPU machine.
set -u
root=$PWD
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
quota=${QUOTA:-2G}
mib=${HANDLES_MIB:-1024}
# multicast only when named: where the GPUs have NVLink switches a multicast object can put every GPU of the
# host, other users' too, out of service (the GPU machines here forbid cuMulticastCreate).
cases=${HANDLES_CASES:-export windows sparse ipc ipc-other ipc-outlive pool pool-other dmabuf}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -std=gnu11 -Wall -Wno-deprecated-declarations -I"$inc" "$root/tests/gpu/handles_probe.c" \
    -o "$work/handles_probe" -lcuda -ldl || exit 1
. "$root/tests/gpu/lib.sh"
res=$out/handles.txt
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
    echo "libvgpu sha256 $(sha256sum "$lib" | cut -d' ' -f1)${before:+; before: $(sha256sum "$before" | cut -d' ' -f1)}"
    for c in $cases; do
        echo "=== $c: without the library (device used $(used) MiB before)"
        sampled "$work/handles_probe" "$c" "$mib"
        # Two processes (windows, ipc) each need a context (~518 MiB on an H200) beside the exporter's
        # handle: under 2 GiB the child's context did not fit (2026-11-29), so they run at TWO_QUOTA.
        q=$quota
        case $c in windows | ipc* | pool*) q=${TWO_QUOTA:-4G} ;; esac
        for L in "$lib" ${before:+"$before"}; do
            echo "=== $c: $L, quota $q"
            sampled env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT="$q" \
                CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger-$c-$RANDOM" LIBCUDA_LOG_LEVEL=2 \
                "$work/handles_probe" "$c" "$mib"
        done
    done
} 2>&1 | tee "$res"
