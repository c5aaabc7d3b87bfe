#!/usr/bin/env bash
# The compute share's precision matrix on a real GPU (issue 24): a benchmark that prints numbers, not a
# test. For each kernel length (bf16 matmuls of 2048², 4096², 8192²) and each of eager and CUDA graphs,
# tests/gpu/compute_matrix.py runs alone without the library, then as two unlimited processes at once,
# then as a 30/70 pair under the library (two containers: two ledgers), all in this one run. Each result
# is a throughput against the same loop alone (percent); the target is each capped tenant within 5 points
# of its share of what the unlimited pair together got, and the capped pair's sum not below the unlimited
# pair's. Writes $OUT/compute-matrix.txt. Environment: VGPU_LIB, OUT, MATRIX_SECONDS (5), MATRIX_SIZES
# ("2048 4096 8192"), MATRIX_MODES ("eager graph"), PY (/opt/torch/.venv/bin/python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${MATRIX_SECONDS:-5}
py=${PY:-/opt/torch/.venv/bin/python3}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-matrix.XXXXXX)
trap 'rm -rf "$W"' EXIT
res=$out/compute-matrix.txt
# run NAME SM ARGS...: SM "none" without the library; prints matmuls per second.
run() {
    local name=$1 sm=$2; shift 2
    if [ "$sm" = none ]; then
        "$py" tests/gpu/compute_matrix.py --seconds "$secs" "$@" >"$W/$name.out" 2>"$W/$name.err"
    else
        LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name" CUDA_DEVICE_SM_LIMIT="$sm" \
            "$py" tests/gpu/compute_matrix.py --seconds "$secs" "$@" >"$W/$name.out" 2>"$W/$name.err"
    fi
    grep '^RESULT' "$W/$name.out" | tail -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()[7:])["per_s"])' 2>/dev/null || echo 0
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "-" }'; }
printf '%-6s %-5s %8s | %-13s | %-13s | %s\n' size mode alone/s "unlimited a/b" "capped 30/70" "targets 30/70 (share x unlimited sum)" | tee "$res"
for mode in ${MATRIX_MODES:-eager graph}; do
    g=; [ "$mode" = graph ] && g=--graph
    for n in ${MATRIX_SIZES:-2048 4096 8192}; do
        alone=$(run "alone-$n-$mode" none --n "$n" $g)
        at=$(python3 -c 'import time; print(time.time() + 7)')
        run "ua-$n-$mode" none --n "$n" $g --start-at "$at" >"$W/ua" &
        run "ub-$n-$mode" none --n "$n" $g --start-at "$at" >"$W/ub"; wait
        at=$(python3 -c 'import time; print(time.time() + 7)')
        run "c30-$n-$mode" 30 --n "$n" $g --start-at "$at" >"$W/c30" &
        run "c70-$n-$mode" 70 --n "$n" $g --start-at "$at" >"$W/c70"; wait
        ua=$(pct "$(cat "$W/ua")" "$alone"); ub=$(pct "$(cat "$W/ub")" "$alone")
        c30=$(pct "$(cat "$W/c30")" "$alone"); c70=$(pct "$(cat "$W/c70")" "$alone")
        sum=$(awk -v a="$ua" -v b="$ub" 'BEGIN { print a + b }')
        printf '%-6s %-5s %8s | %5s / %5s | %5s / %5s | %.1f / %.1f (capped sum %.1f, unlimited %.1f)\n' "$n" "$mode" "$alone" \
            "$ua" "$ub" "$c30" "$c70" "$(awk -v s="$sum" 'BEGIN { print 0.3 * s }')" "$(awk -v s="$sum" 'BEGIN { print 0.7 * s }')" \
            "$(awk -v a="$c30" -v b="$c70" 'BEGIN { print a + b }')" "$sum" | tee -a "$res"
    done
done
