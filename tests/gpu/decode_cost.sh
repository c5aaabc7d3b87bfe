#!/usr/bin/env bash
# What a compute share costs a launch-bound program on a real GPU (issue 41): tests/gpu/decode_cost.py's
# decode-shaped loop (72 launches a step, eager, and the same step as one CUDA graph) bare, under the
# library with a memory quota only, under a 99% share (never held back: the library's own cost), and under
# 99% with unmeasured launches allowed (VGPU_COMPUTE_METERED=0); DECODE_ROUNDS rounds (3) interleaved so that
# the machine's drift falls on every configuration alike, DECODE_SECONDS (8) a run. A benchmark that prints
# numbers: steps/s and each configuration's ratio to bare, by the median over rounds. Writes
# $OUT/decode-cost.txt. Environment: VGPU_LIB (target/vgpu/libvgpu.so), VGPU_LIB_BEFORE (a build to compare).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${DECODE_SECONDS:-8}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-decode.XXXXXX)
trap 'rm -rf "$W"' EXIT
res=$out/decode-cost.txt
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
    echo "libvgpu sha256 $(sha256sum "$lib" | cut -d' ' -f1)"
} | tee "$res"
# run LABEL MODE ENV...: one run, its line tagged.
run() {
    local label=$1 mode=$2; shift 2
    local line
    line=$(env "$@" python3 tests/gpu/decode_cost.py "$mode" "$secs" 2>>"$W/stderr" | grep '^RESULT') || line="RESULT $mode - -"
    echo "$label ${line#RESULT }" | tee -a "$res"
}
for round in $(seq "${DECODE_ROUNDS:-3}"); do
    for mode in eager graph; do
        run "r$round bare" "$mode"
        run "r$round quota" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/q$round$mode" CUDA_DEVICE_MEMORY_LIMIT=16g
        run "r$round share99" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/s$round$mode" CUDA_DEVICE_SM_LIMIT=99
        run "r$round share99-unmetered" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/u$round$mode" CUDA_DEVICE_SM_LIMIT=99 VGPU_COMPUTE_METERED=0
        [ -n "$before" ] && run "r$round before-share99" "$mode" LD_PRELOAD="$before" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/b$round$mode" CUDA_DEVICE_SM_LIMIT=99
    done
done
# The median over rounds of each configuration, and its ratio to bare's.
python3 - "$res" <<'PY' | tee -a "$res"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 4 and f[0][:1] == "r" and f[0][1:].isdigit() and f[3] != "-":
        runs.setdefault((f[1], f[2]), []).append(float(f[3]))
med = {k: statistics.median(v) for k, v in runs.items()}
for (label, mode), m in sorted(med.items()):
    bare = med.get(("bare", mode), 0)
    print(f"median {label} {mode} {m:.1f} steps/s, {m / bare if bare else 0:.3f}x bare")
PY
grep -c 'vgpu ERROR' "$W/stderr" >/dev/null 2>&1 && { echo "library errors:"; grep 'vgpu ERROR' "$W/stderr" | sort | uniq -c | head; } | tee -a "$res"
exit 0
