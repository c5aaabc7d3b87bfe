#!/usr/bin/env bash
# Where a launch's time goes under a compute share on a real GPU (issue 24): tests/gpu/launch_cost.cu's
# driver-call costs (bare), then its launch loops (idle: the GPU keeps up; queued: each launch behind the
# one before) bare, under the library without a share (no limit at all, then a 16 GiB memory quota), and under a 99% share (never held back: the loop's
# CPU cost alone) with VGPU_LIB and, when set, VGPU_LIB_BEFORE; LAUNCH_ROUNDS rounds (2), interleaved. A benchmark that
# prints numbers. Writes $OUT/launch-cost.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-launch.XXXXXX)
trap 'rm -rf "$W"' EXIT
nvcc -O2 -arch=sm_90 -o "$W/launch_cost" tests/gpu/launch_cost.cu -lcuda || exit 1
res=$out/launch-cost.txt
: >"$res"
"$W/launch_cost" calls | sed 's/^RESULT /calls /' | tee -a "$res"
"$W/launch_cost" pattern | sed 's/^RESULT /bare /' | tee -a "$res"
for round in $(seq "${LAUNCH_ROUNDS:-2}"); do
    "$W/launch_cost" | sed "s/^RESULT /r$round bare /" | tee -a "$res"
    LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/n$round" "$W/launch_cost" | sed "s/^RESULT /r$round lib-noshare /" | tee -a "$res"
    LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/q$round" CUDA_DEVICE_MEMORY_LIMIT=16g "$W/launch_cost" | sed "s/^RESULT /r$round lib-quota /" | tee -a "$res"
    if [ -n "$before" ]; then
        LD_PRELOAD="$before" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/b$round" CUDA_DEVICE_SM_LIMIT=99 "$W/launch_cost" | sed "s/^RESULT /r$round before-share99 /" | tee -a "$res"
    fi
    LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/a$round" CUDA_DEVICE_SM_LIMIT=99 "$W/launch_cost" | sed "s/^RESULT /r$round after-share99 /" | tee -a "$res"
done
