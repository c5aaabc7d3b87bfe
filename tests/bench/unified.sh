#!/usr/bin/env bash
# `make bench`, unified memory (docs/libvgpu.md, "Unified memory"): the cost of the spill and oversubscribe
# modes when everything fits, and the slowdown of a training step with 10%, 25% and 50% of its memory
# spilled. Needs a GPU and PyTorch (tests/gpu/unified_case.py); elsewhere it says so and stops (the fake
# driver has no bus to measure). Writes $BENCH_OUT/unified.md (default target/bench).
#   UNIFIED_ROUNDS  alternating rounds of bare / spill / oversubscribe (5)    UNIFIED_STEPS  steps per run (40)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${BENCH_OUT:-target/bench}")
lib=$(realpath -m "${BENCH_LIBVGPU:-target/vgpu/libvgpu.so}")
python=
for c in "${PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
    if [ -n "$c" ] && "$c" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then python=$c; break; fi
done
if ! command -v nvidia-smi >/dev/null 2>&1 || [ -z "$python" ]; then
    echo "bench unified: skipped (no GPU with PyTorch here; run it on the GPU machine: bash tests/bench/unified.sh)"
    exit 0
fi
mkdir -p "$out"
"$python" tests/gpu/unified_case.py bench "$lib" | tee "$out/unified.jsonl" | sed -n '/^MARKDOWN$/,$p' | tail -n +2 >"$out/unified.md"
echo "bench unified: $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)"
cat "$out/unified.md"
