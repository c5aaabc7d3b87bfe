#!/usr/bin/env bash
# What the time-quanta turn gate (issue 29, libvgpu's `turns`) adds to a launch on a real GPU: the launch
# loops of tests/gpu/launch_cost.cu (idle: the GPU keeps up; queued: each launch behind the one before) bare,
# under the library with a plain 8 GiB quota (no gate), with an oversubscribed 8 GiB quota and no arbiter (the
# ledger's turn Unmanaged: the gate's fast path), and oversubscribed with the arbiter's Free written into the
# ledger (tests/e2e/lib/turn.py plays the arbiter); with GPU_TQ_BEFORE, also the library before the gate,
# oversubscribed. TQ_ROUNDS rounds (3), interleaved. A benchmark that prints numbers; writes
# $OUT/time-quanta-lib.txt. Only the safe regime: each process takes a few MiB of managed memory (the quota
# is never filled), and the script stops unless the GPU has 8 GiB free.
# Run from the repository root on the GPU machine with GPU_TQ_DIR (.gpu/time_quanta) holding libvgpu.so and
# libvgpu_core.so built from this tree, and GPU_TQ_BEFORE (optional) a folder with the library before it.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/lib.sh
dir=$(realpath -m "${GPU_TQ_DIR:-.gpu/time_quanta}")
before=${GPU_TQ_BEFORE:+$(realpath -m "$GPU_TQ_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
[ -f "$dir/libvgpu.so" ] && [ -f "$dir/libvgpu_core.so" ] || { echo "time_quanta_lib: no library in $dir" >&2; exit 2; }
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-tq.XXXXXX)
trap 'rm -rf "$W"' EXIT
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0); used $(used) of $total MiB"
if [ $((total - $(used))) -lt 8192 ]; then echo "time_quanta_lib: less than 8 GiB free; not run" >&2; exit 2; fi
nvcc -O2 -arch=sm_90 -o "$W/launch_cost" tests/gpu/launch_cost.cu -lcuda || exit 1
res=$out/time-quanta-lib.txt
: >"$res"
# lib LIB PREFIX [VAR=VALUE...] -- ARGS: launch_cost under LIB, its ledgers at PREFIX.<uuid>, 8 GiB quota.
lib() {
    local L=$1 p=$2; shift 2
    env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$p" LIBCUDA_LOG_LEVEL=1 "$@"
}
# The Free configuration's ledger exists once a process under the library started CUDA; then Free goes in.
lib "$dir/libvgpu.so" "$W/free" CUDA_OVERSUBSCRIBE=true "$W/launch_cost" init || exit 1
for l in "$W"/free.*; do python3 tests/e2e/lib/turn.py set "$l" free 1; echo "ledger $l: turn $(python3 tests/e2e/lib/turn.py get "$l" mode)"; done
for round in $(seq "${TQ_ROUNDS:-3}"); do
    "$W/launch_cost" | sed "s/^RESULT /r$round bare /" | tee -a "$res"
    lib "$dir/libvgpu.so" "$W/plain$round" "$W/launch_cost" | sed "s/^RESULT /r$round plain-quota /" | tee -a "$res"
    lib "$dir/libvgpu.so" "$W/over$round" CUDA_OVERSUBSCRIBE=true "$W/launch_cost" | sed "s/^RESULT /r$round over-no-arbiter /" | tee -a "$res"
    lib "$dir/libvgpu.so" "$W/free" CUDA_OVERSUBSCRIBE=true "$W/launch_cost" | sed "s/^RESULT /r$round over-free /" | tee -a "$res"
    if [ -n "$before" ]; then
        lib "$before/libvgpu.so" "$W/before$round" CUDA_OVERSUBSCRIBE=true "$W/launch_cost" | sed "s/^RESULT /r$round before-over /" | tee -a "$res"
    fi
done
for l in "$W"/free.*; do echo "ledger $l after: turn $(python3 tests/e2e/lib/turn.py get "$l" mode), waiting $(python3 tests/e2e/lib/turn.py get "$l" waiting), launches $(python3 tests/e2e/lib/turn.py get "$l" launches)" | tee -a "$res"; done
echo "device used after: $(used) MiB" | tee -a "$res"
# Best of the rounds per configuration and loop (ns per launch).
awk '{k=$2" "$3; if (!(k in b) || $4 < b[k]) b[k]=$4} END {for (k in b) print "best " k " " b[k]}' <(grep '^r[0-9]' "$res") | sort | tee -a "$res"
