#!/usr/bin/env bash
# What a compute share costs a launch-bound program on a real GPU (issue 41): tests/gpu/decode_cost.py's
# decode-shaped loop (72 launches a step, eager, and the same step as one CUDA graph) bare, under the
# library with a memory quota only, under a 99% share (never held back: the library's own cost), and under
# 99% with unmeasured launches allowed (VGPU_COMPUTE_METERED=0); DECODE_ROUNDS rounds (8) interleaved, the
# order turned by one each round, so that the machine's drift falls on every configuration alike,
# DECODE_SECONDS (3) a run, every run pinned to one CPU (DECODE_CPU, 3: a Python loop that moves between
# CPUs reads ±20% on these machines). A benchmark that prints numbers: steps/s by the median over rounds,
# and each configuration's ratio to bare as the median of its rounds' ratios to the bare run of the same
# round (what the drift between rounds leaves out). Writes $OUT/decode-cost.txt. Environment: VGPU_LIB
# (target/vgpu/libvgpu.so), VGPU_LIB_BEFORE (a build to compare), DECODE_CONFIGS (which, by number: 0 bare,
# 1 quota, 2 share 99%, 3 unmeasured allowed, 4 before; default all), DECODE_MODES ("eager graph").
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${DECODE_SECONDS:-3}
pin=(taskset -c "${DECODE_CPU:-3}")
command -v taskset >/dev/null || pin=()
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
    line=$(env "$@" "${pin[@]}" python3 tests/gpu/decode_cost.py "$mode" "$secs" 2>>"$W/stderr" | grep '^RESULT') || line="RESULT $mode - -"
    echo "$label ${line#RESULT }" | tee -a "$res"
}
# config ROUND MODE I: the I-th configuration (0 bare, 1 quota, 2 share99, 3 share99-unmetered, 4 before).
config() {
    local round=$1 mode=$2
    case $3 in
        0) run "r$round bare" "$mode" ;;
        1) run "r$round quota" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/q$round$mode" CUDA_DEVICE_MEMORY_LIMIT=16g ;;
        2) run "r$round share99" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/s$round$mode" CUDA_DEVICE_SM_LIMIT=99 ;;
        3) run "r$round share99-unmetered" "$mode" LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/u$round$mode" CUDA_DEVICE_SM_LIMIT=99 VGPU_COMPUTE_METERED=0 ;;
        4) run "r$round before-share99" "$mode" LD_PRELOAD="$before" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/b$round$mode" CUDA_DEVICE_SM_LIMIT=99 ;;
    esac
}
configs=(${DECODE_CONFIGS:-0 1 2 3})
[ -n "$before" ] && [ -z "${DECODE_CONFIGS:-}" ] && configs+=(4)
n=${#configs[@]}
for round in $(seq "${DECODE_ROUNDS:-8}"); do
    for mode in ${DECODE_MODES:-eager graph}; do
        for k in $(seq 0 $((n - 1))); do
            config "$round" "$mode" "${configs[$(((k + round) % n))]}"
        done
    done
done
# The median over rounds of each configuration, and the median of its ratios to the same round's bare run:
# of the runs' rates, and of their best windows' (the loop's own rate, the machine's other load left out).
python3 - "$res" <<'PY' | tee -a "$res"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 4 and f[0][:1] == "r" and f[0][1:].isdigit() and f[3] != "-":
        runs[(f[1], f[2], f[0])] = (float(f[3]), float(f[5]) if len(f) > 5 else float(f[3]))
for label, mode in sorted({(l, m) for l, m, _ in runs}):
    mine = {r: v for (l, m, r), v in runs.items() if (l, m) == (label, mode)}
    out = [f"median {label} {mode}"]
    for k, what in ((0, "run"), (1, "best window")):
        ratios = [v[k] / runs[("bare", mode, r)][k] for r, v in mine.items() if runs.get(("bare", mode, r))]
        lo, hi = (min(ratios), max(ratios)) if ratios else (0, 0)
        ratio = statistics.median(ratios) if ratios else 0
        rate = statistics.median(v[k] for v in mine.values())
        out.append(f"{what} {rate:.1f} steps/s {ratio:.3f}x bare ({lo:.3f}-{hi:.3f})")
    print(", ".join(out))
PY
grep -c 'vgpu ERROR' "$W/stderr" >/dev/null 2>&1 && { echo "library errors:"; grep 'vgpu ERROR' "$W/stderr" | sort | uniq -c | head; } | tee -a "$res"
exit 0
