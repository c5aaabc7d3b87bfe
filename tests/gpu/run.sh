#!/usr/bin/env bash
# The real-GPU suite. Run on the GPU machine from the repository root, with the
# interposer built here and carried in the tree (target/vgpu/libvgpu.so; no Rust is needed there):
#
#   bash tests/gpu/run.sh            real driver, results to $OUT (else target/gpu-results)
#   bash tests/gpu/run.sh --fake     dry run against the project's fake driver (after make build)
#
# Builds the C programs with the machine's nvcc (or gcc -lcuda), then runs tests/gpu/suite.py, which
# runs every case under the quota and writes results.jsonl + summary.md. Environment:
#   OUT                 results folder          VGPU_LIB            the interposer to test
#   GPU_QUOTA           quota per case (8Gi)    GPU_SUITE_BUDGET_S  time budget for the cases (480)
#   GPU_SUITE_ONLY      comma-separated groups: smi,driverapi,devices,shared,torch,cupy,jax,nccl,perf,unified,unified-bench,bench
#   GPU_BENCH_PROCS     process counts of the throughput bench ("1 8 16")
#   GPU_BENCH_ROUNDS    alternating rounds of the bench (2)
#   GPU_TORCH_PYTHON, GPU_JAX_PYTHON, GPU_CUPY_PYTHON   interpreters (else found under /opt/*/.venv)
#   GPU_FAKE_DIR        --fake only: folder of the fake libcuda.so.1 (target/fake)
# Exit status: 0 when every case that ran passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

fake=
case "${1:-}" in
    --fake) fake=--fake ;;
    "") ;;
    *) echo "usage: tests/gpu/run.sh [--fake]" >&2; exit 2 ;;
esac
out=$(realpath -m "${OUT:-target/gpu-results}")
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
build=$root/target/gpu-build
mkdir -p "$out" "$build"
[ -f "$lib" ] || { echo "gpu-suite: no interposer at $lib (build it with make libvgpu and carry target/vgpu)" >&2; exit 2; }

# The orchestrator needs only Python's standard library; prefer the frameworks' interpreter.
python=
for c in "${GPU_SUITE_PYTHON:-}" /opt/torch/.venv/bin/python3 /opt/*/.venv/bin/python3 python3; do
    if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1; then python=$(command -v "$c"); break; fi
done
[ -n "$python" ] || { echo "gpu-suite: no python3 found" >&2; exit 2; }

# Build the C programs against this machine's CUDA (or, for --fake, the project's headers and fake).
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ -n "$fake" ]; then
    gcc -O2 -Wall -I.deps/cuda/include -o "$build/driverapi" tests/gpu/driverapi.c -L"${GPU_FAKE_DIR:-target/fake}" -lcuda
else
    nvcc=$(command -v nvcc || echo "$cuda_home/bin/nvcc")
    if ! { [ -x "$nvcc" ] && "$nvcc" -O2 -o "$build/driverapi" tests/gpu/driverapi.c -lcuda; }; then
        echo "gpu-suite: nvcc unavailable or failed; building with gcc" >&2
        gcc -O2 -Wall -I"$cuda_home/include" -o "$build/driverapi" tests/gpu/driverapi.c \
            -L"$cuda_home/lib64/stubs" -L"$cuda_home/lib64" -lcuda
    fi
fi

# What was tested, for the record.
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "libvgpu: $lib sha256 $(sha256sum "$lib" | cut -d' ' -f1)"
    core=$(dirname "$lib")/libvgpu_core.so
    [ -f "$core" ] && echo "libvgpu_core: $core sha256 $(sha256sum "$core" | cut -d' ' -f1)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "python: $python"
    if [ -z "$fake" ]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
        (nvcc --version 2>/dev/null || "$cuda_home/bin/nvcc" --version 2>/dev/null) | tail -1 || true
    fi
} >"$out/environment.txt"
cat "$out/environment.txt"

exec "$python" tests/gpu/suite.py --lib "$lib" --build "$build" --out "$out" $fake
