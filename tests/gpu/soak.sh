#!/usr/bin/env bash
# The soak on a real GPU (issue 47; docs/soak.md): tests/soak/soak.c built with the machine's nvcc (else gcc
# -lcuda against CUDA_HOME) and run through tests/soak/run.sh with SOAK_DRIVER=real: first SOAK_GPU_BARE_RUNS
# runs (8) without the library (the program's own correctness on this driver: a failure there is the soak's, not
# the library's), then SOAK_GPU_RUNS runs (100) under libvgpu.so spread over the quota (SOAK_QUOTA, 4g), quota +
# share (SOAK_SHARE, 50%), spill, oversubscribe and tight (SOAK_TIGHT, 3g) modes, SOAK_PAR (4) at a time sharing
# one ledger per mode. No crash, no hang, no CUDA error, no charge kept with nothing held, nothing left in a
# ledger. Core dumps are enabled (ulimit -c) and a core's backtrace kept when gdb is there; where the kernel's
# core_pattern pipes cores elsewhere (systemd-coredump, apport), look there. Results in $OUT/soak (summary.tsv,
# lib-lines.txt, failures/<mode>-<seed>/: out, err, what, core backtraces) and $OUT/soak-bare. Replay a failing
# seed with the line printed beside it. Run from the repository root with target/vgpu carried (no Rust needed):
# bash tests/gpu/soak.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${OUT:-target/gpu-results}")
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
[ -f "$lib" ] || { echo "gpu-soak: no interposer at $lib (build it with make libvgpu and carry target/vgpu)" >&2; exit 2; }
mkdir -p "$out"
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "libvgpu: $lib sha256 $(sha256sum "$lib" | cut -d' ' -f1)"
    core=$(dirname "$lib")/libvgpu_core.so
    [ -f "$core" ] && echo "libvgpu_core: $core sha256 $(sha256sum "$core" | cut -d' ' -f1)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    echo "core_pattern: $(cat /proc/sys/kernel/core_pattern 2>/dev/null); gdb: $(command -v gdb || echo none)"
} | tee "$out/soak-environment.txt"

export SOAK_DRIVER=real VGPU_LIB=$lib
rc=0
echo "== the program alone (no library)"
SOAK_RUNS=${SOAK_GPU_BARE_RUNS:-8} SOAK_MODES=bare OUT=$out/soak-bare bash tests/soak/run.sh || rc=1
echo "== under the library"
SOAK_RUNS=${SOAK_GPU_RUNS:-100} SOAK_MODES=${SOAK_MODES:-quota share spill oversub tight} OUT=$out/soak \
    bash tests/soak/run.sh || rc=1
exit $rc
