#!/usr/bin/env bash
# A measurement for the compute share's design, not a test: what two processes running the compute case's
# saturating matmul loop (tests/gpu/compute_case.py) get under NVIDIA MPS, where the GPU runs both at once
# instead of time-slicing them, against the same pair time-sliced. Without the library. Starts its own MPS
# control daemon (pipe and log folders under a temporary folder) and quits it at the end; the GPU's
# settings (compute mode, clocks) are not touched.
#   1. the loop alone (the baseline);
#   2. two at once, time-sliced (no MPS);
#   3. two at once under MPS;
#   4. two at once under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 30 and 70 (MPS's own SM cap);
#   5. one alone under MPS at 30 and at 10;
#   6. under MPS without its SM cap, the library's compute share instead (CUDA_DEVICE_SM_LIMIT 30 and 70 at
#      once, each its own container's ledger; then 30 alone; then the pair again with CUDA graphs).
# Environment: OUT (results: mps.jsonl), GPU_TORCH_PYTHON, MPS_SECONDS (8), VGPU_LIB
# (target/vgpu/libvgpu.so).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${OUT:-target/gpu-results}")
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
secs=${MPS_SECONDS:-8}
. tests/gpu/torch_python.sh
py=$(torch_python)
command -v nvidia-cuda-mps-control >/dev/null || { echo "mps: no nvidia-cuda-mps-control here"; exit 0; }
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-mps.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
mps_on=0
stop_mps() { ((mps_on)) && echo quit | nvidia-cuda-mps-control; mps_on=0; }
trap 'stop_mps; rm -rf "$W"' EXIT
jsonl=$out/mps.jsonl
: >"$jsonl"

# one NAME [ENV...]: one run of the loop; its RESULT line into mps.jsonl.
one() {
    local name=$1; shift
    local r
    r=$(env "$@" "$py" tests/gpu/compute_case.py matmul --seconds "$secs" ${AT:+--start-at $AT} ${GRAPH:+--graph} 2>&1 |
        grep '^RESULT ' | tail -1 | cut -c8-)
    echo "{\"case\": \"$name\", \"result\": ${r:-null}}" | tee -a "$jsonl"
}
# pair NAME ENV-A ENV-B: two runs starting their loops together (20 s after being started: warm-up).
pair() {
    local name=$1 ea=$2 eb=$3
    AT=$(( $(date +%s) + 20 ))
    AT=$AT one "$name-a" $ea &
    local a=$!
    AT=$AT one "$name-b" $eb &
    wait $a $!
}

one alone
pair sliced X=1 X=1
nvidia-cuda-mps-control -d && mps_on=1
sleep 1
pair mps X=1 X=1
pair mps-30-70 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70
unset AT
one mps-alone-30 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30
one mps-alone-10 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10
share() { echo "LD_PRELOAD=$lib CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/$1 CUDA_DEVICE_SM_LIMIT=$2"; }
pair mps-lib-30-70 "$(share l30 30)" "$(share l70 70)"
unset AT
one mps-lib-alone-30 $(share la30 30)
GRAPH=1 pair mps-lib-graph-30-70 "$(share g30 30)" "$(share g70 70)"
stop_mps
python3 - "$jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["result"]["tflops"] for r in rows if r["case"] == "alone" and r["result"]), None)
for r in rows:
    t = r["result"] and r["result"].get("tflops")
    print(f"mps: {r['case']:12} {t} TFLOP/s" + (f"  {100 * t / base:.1f}% of alone" if t and base else ""))
PY
