#!/usr/bin/env bash
# The cost of one `vgpuctl monitor` scrape with 256 containers on 8 fake GPUs, and of the collection behind
# it (once per interval): every ledger read, NVML asked for every GPU, one GPU process per container (each
# in a PID namespace of its own) attributed through /proc, the watchdog pass. Prints the parts, then one
# line; the target is under 20 ms per scrape. Runs as root (PID namespaces).
#   BENCH_CONTAINERS (256), BENCH_GPUS (8), BENCH_SCRAPES (50)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ "$(id -u)" = 0 ] || { echo "monitor bench: needs root (PID namespaces)"; exit 1; }
[ -f target/fake/libnvidia-ml.so.1 ] && [ -x target/clients/linked_client ] || { echo "monitor bench: run make build first"; exit 1; }
cargo build --release -q -p vgpu-monitor --example monitor_bench
work=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-bench-monitor.XXXXXX")
trap 'rm -rf "$work"' EXIT
gpus=${BENCH_GPUS:-8}
# Small contexts, so 256 processes fit on the fake GPUs.
env LD_LIBRARY_PATH="$root/target/fake" FAKE_CUDA_DEVICES="${gpus}x80Gi" FAKE_CUDA_STATE_DIR="$work" \
    FAKE_CUDA_CONTEXT_BYTES=16Mi \
    target/release/examples/monitor_bench "$root/target/clients/linked_client" "$root/target/fake/libnvidia-ml.so.1" \
    --containers "${BENCH_CONTAINERS:-256}" --gpus "$gpus" --scrapes "${BENCH_SCRAPES:-50}"
