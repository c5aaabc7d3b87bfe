#!/usr/bin/env bash
# The compute share on a real GPU: a benchmark that prints numbers, not a test. Runs
# tests/gpu/compute_case.py (PyTorch) with and without libvgpu.so and writes compute.jsonl + compute.md
# to $OUT:
#   - a saturating bf16 matmul loop, eager and as a CUDA graph: alone without the library, then at
#     CUDA_DEVICE_SM_LIMIT=30 and 10 (each run its own container: its own ledger prefix);
#   - two processes without the library at once (the time slicing's own split), then at 30 and 70 at once
#     (two containers), eager and graph;
#   - a training step without the library and under it with no limit.
# Each run's stderr (the library's log at level 2: the share, and for graphs whether their solo time came
# from their kernels' own launches) is kept in $OUT/compute-logs/.
# Environment: VGPU_LIB (target/vgpu/libvgpu.so), OUT, GPU_TORCH_PYTHON, COMPUTE_SECONDS (12, after 3 s
# of warm-up), COMPUTE_WINDOWS ("100ms 3s": the eager 30% case again under these pacing windows),
# COMPUTE_SKIP_TRAIN (set: no training-step runs), COMPUTE_MODES ("eager graph"; empty: none), COMPUTE_PAIR_DELAY (20 s:
# the two processes of a pair start their loops together that long after being started).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${COMPUTE_SECONDS:-12}
. tests/gpu/torch_python.sh
py=$(torch_python)
mkdir -p "$out" "$out/compute-logs"
W=$(mktemp -d /tmp/vgpu-compute.XXXXXX)
trap 'rm -rf "$W"' EXIT
jsonl=$out/compute.jsonl
: >"$jsonl"
# The GPU's clock and power through the runs (a duty-cycled GPU clocks higher: see docs/gpu-results.md).
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader -lms 1000 \
        >"$out/compute-clocks.csv" 2>/dev/null &
    smi=$!
    trap 'kill $smi 2>/dev/null; rm -rf "$W"' EXIT
fi

# one NAME SM_LIMIT ARGS...: one run; SM_LIMIT "none" = without the library, "" = library, no limit.
# Each run is its own container: its own ledger prefix ($W/NAME), so its own bucket.
one() {
    local name=$1 sm=$2; shift 2
    local env=()
    if [ "$sm" != none ]; then
        env=(LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name" LIBCUDA_LOG_LEVEL=2)
        [ -n "$sm" ] && env+=(CUDA_DEVICE_SM_LIMIT="$sm")
        [ -n "${WINDOW:-}" ] && env+=(VGPU_COMPUTE_WINDOW="$WINDOW")
    fi
    echo "$(date -u +%H:%M:%S) start $name" >>"$out/compute-cases.log"
    env "${env[@]}" "$py" tests/gpu/compute_case.py "$@" >"$W/$name.out" 2>"$W/$name.err"
    echo "$(date -u +%H:%M:%S) end $name" >>"$out/compute-cases.log"
    grep -v '^RESULT' "$W/$name.err" | tail -3 >&2
    local r
    r=$(grep '^RESULT ' "$W/$name.out" | tail -1 | cut -c8-)
    [ -n "$r" ] || r='{"error": "no result"}'
    # The container's bucket (ledger header bytes 192..232: tokens, refilled_at, charged_ns, held_ns,
    # launches): what the library measured and charged.
    local bucket=null f
    for f in "$W/$name".GPU-*; do
        [ -f "$f" ] && bucket=$(python3 -c 'import struct,sys,json; t=struct.unpack_from("<qQQQQ", open(sys.argv[1],"rb").read(), 192); print(json.dumps(dict(zip(["tokens","refilled_at","charged_ns","held_ns","launches"], t))))' "$f")
    done
    echo "{\"case\": \"$name\", \"sm_limit\": \"$sm\", \"result\": $r, \"bucket\": $bucket}" | tee -a "$jsonl"
    grep -h 'compute share\|vgpu.*error' "$W/$name.err" | grep -v 'graph exec' | head -3 >&2
    grep -h 'graph exec' "$W/$name.err" | head -2 >&2
    cp "$W/$name.err" "$out/compute-logs/$name.err"
}

for mode in ${COMPUTE_MODES-eager graph}; do
    g=; [ $mode = graph ] && g=--graph
    one "$mode-alone-nolib" none matmul --seconds "$secs" $g
    one "$mode-30" 30 matmul --seconds "$secs" $g
    one "$mode-10" 10 matmul --seconds "$secs" $g
    # The pacing window's other ends (the default is 1 s): short bursts clock higher.
    if [ $mode = eager ]; then
        for WINDOW in ${COMPUTE_WINDOWS-100ms 3s}; do
            one "$mode-30-w$WINDOW" 30 matmul --seconds "$secs" $g
        done
        WINDOW=
    fi
    # The same pair without the library: what the GPU's time slicing alone gives two processes (the
    # shares a capped pair can reach add up to this at most).
    at=$(( $(date +%s) + ${COMPUTE_PAIR_DELAY:-20} ))
    one "$mode-pair-nolib-a" none matmul --seconds "$secs" $g --start-at $at &
    pa=$!
    one "$mode-pair-nolib-b" none matmul --seconds "$secs" $g --start-at $at &
    wait $pa $!
    at=$(( $(date +%s) + ${COMPUTE_PAIR_DELAY:-20} ))
    one "$mode-pair-30" 30 matmul --seconds "$secs" $g --start-at $at &
    p30=$!
    one "$mode-pair-70" 70 matmul --seconds "$secs" $g --start-at $at &
    wait $p30 $!
done
if [ -z "${COMPUTE_SKIP_TRAIN:-}" ]; then
    # Alternated, twice: a step's time drifts between runs (the GPU's clock) by more than the library
    # could cost.
    for r in 1 2; do
        one train-nolib-$r none train --steps 200
        one train-lib-$r "" train --steps 200
    done
fi

# The table: each run's throughput against the same mode alone without the library.
python3 - "$jsonl" >"$out/compute.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["case"]: r["result"] for r in rows}
print("| case | limit | TFLOP/s | share of alone | target |")
print("| --- | --- | --- | --- | --- |")
for r in rows:
    c, res = r["case"], r["result"]
    if "tflops" in res:
        base = by.get(res["mode"] + "-alone-nolib", {}).get("tflops")
        share = f"{100 * res['tflops'] / base:.1f}%" if base else "?"
        tgt = r["sm_limit"] + "%" if r["sm_limit"] not in ("none", "") else "100%"
        print(f"| {c} | {r['sm_limit']} | {res['tflops']} | {share} | {tgt} |")
    elif "step_ms" in res:
        print(f"| {c} | {r['sm_limit']} | step {res['step_ms']} ms | | |")
    else:
        print(f"| {c} | {r['sm_limit']} | {res} | | |")
PY
cat "$out/compute.md"
