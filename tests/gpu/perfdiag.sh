#!/usr/bin/env bash
# Where does a PyTorch training-step difference come from? Runs tests/gpu/torch_case.py train-perf (300 steps,
# median ms per step) in fresh processes: bare, with an empty preloaded object, with libvgpu.so and no limit,
# with a limit, and with the engine preloaded directly; three rounds, printed one line per round.
# On the GPU machine, carrying target/vgpu:  bash tests/gpu/perfdiag.sh
set -u
PY=/opt/torch/.venv/bin/python3
gcc -shared -fPIC -o /tmp/empty.so -x c /dev/null
L=$PWD/target/vgpu/libvgpu.so
run() { env "$@" $PY tests/gpu/torch_case.py train-perf --steps 300 2>/dev/null | sed -n 's/^RESULT //p' | python3 -c "import json,sys; print(round(json.load(sys.stdin)['step_ms_median'],3))"; }
for r in 1 2 3; do
  echo "round $r bare=$(run X=1) empty=$(run LD_PRELOAD=/tmp/empty.so) nolimit=$(run LD_PRELOAD=$L CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/c1) limit=$(run LD_PRELOAD=$L CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/c2) core=$(run LD_PRELOAD=$PWD/target/vgpu/libvgpu_core.so CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/c3)"
done
