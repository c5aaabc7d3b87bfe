#!/usr/bin/env bash
# libvgpu and fork: a child never inherits a lock of the library that another thread of the parent held at
# the fork. Everything the library remembers per process is in its records, whose locks the fork handlers
# hold while the process forks. Needs `make build`.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
t_init libvgpu-fork
t_require "$LIBVGPU" "$CLIENTS_DIR/rt_client" "$FAKE_DIR/libcuda.so.1"
export LD_LIBRARY_PATH=$FAKE_DIR FAKE_CUDA_STATE_DIR=$WORK/fake FAKE_CUDA_DEVICES=1
mkdir -p "$FAKE_CUDA_STATE_DIR"

# Regression: what cuCtxSetLimit charged was kept in a static of its own, locked across the driver's set.
# A fork while another thread was inside cuCtxSetLimit gave the child that lock locked: its own first
# cuCtxSetLimit hung for ever. (The fake's set takes 1.5 s; the fork comes 0.3 s into it; `timeout`
# turns a hang into a failure.)
out=$(LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_LIMIT=2g CUDA_DEVICE_MEMORY_SHARED_CACHE=$WORK/cache \
    FAKE_CUDA_SET_LIMIT_DELAY_MS=1500 timeout 20 "$CLIENTS_DIR/rt_client" \
    bg-limit heap 256Mi sleep 0.3 fork limit heap 64Mi 2>&1)
st=$?
check "fork while another thread is inside cuCtxSetLimit: the child's own cuCtxSetLimit returns (exit $st)" \
    test $st = 0
check_match "  and succeeds in the child" '^op=limit limit=heap value=67108864 got=67108864 rc=0$' "$out"
check_match "  and the parent sees the child exit 0" '^op=fork child=[0-9]+ child_status=0 rc=0$' "$out"
t_done
