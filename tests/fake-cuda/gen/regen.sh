#!/usr/bin/env bash
# Regenerates src/errors.rs and src/procaddr_table.rs from the CUDA headers and the symbols the
# fake exports. Run after adding or removing an exported function (twice if the symbol set changed:
# the table lists the symbols of the previous build).
set -euo pipefail
cd "$(dirname "$0")/.."
inc=${CUDA_INCLUDE:-../../.deps/cuda/include}
python3 gen/errors.py "$inc/cuda.h" src/errors.rs
cargo build --release -q -p fake-cuda
nm -D --defined-only ../../target/release/libfake_cuda.so | awk '$2 == "T" && $3 ~ /^cu/ {print $3}' | sort >/tmp/fake-cuda-syms.$$
python3 gen/procaddr.py "$inc/cudaTypedefs.h" /tmp/fake-cuda-syms.$$ src/procaddr_table.rs
rm -f /tmp/fake-cuda-syms.$$
cargo build --release -q -p fake-cuda
