#!/usr/bin/env bash
# Managed memory moved onto the device with no allocation call (issue 23 item 4; docs/libvgpu.md, "Managed
# memory and placement"): cuMemAdvise (preferred location) and cuMemPrefetchAsync, every version the
# driver hands out, on the fake driver whose managed memory moves between host and device as they ask
# (tests/fake-driver.md). The truth is the device's used memory (the fake NVML, unpreloaded), never the
# library's own view. Needs `make build`. No root needed.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
SUITE=libvgpu-placement
RT=$CLIENTS_DIR/rt_client
NV=$CLIENTS_DIR/nvml_client
t_require "$LIBVGPU" "$RT" "$NV" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1"
export LD_LIBRARY_PATH=$FAKE_DIR
W=$(mktemp -d /tmp/vgpu-placement-test.XXXXXX)
on_exit "kill \$(jobs -p) 2>/dev/null; rm -rf '$W'"
trap _run_on_exit EXIT
MiB=1048576

n=0
fresh() {   # a new fake device (16 GiB, contexts free) and a new ledger
    n=$((n + 1))
    export FAKE_CUDA_STATE_DIR=$W/fake$n CACHE=$W/cache$n FAKE_CUDA_DEVICES=1 FAKE_CUDA_CONTEXT_BYTES=0
    mkdir -p "$FAKE_CUDA_STATE_DIR"
}
get() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
opline() { grep "^op=$1 " | sed -n "${2:-1}p"; }
# held ARGS...: runs the client under the library (1 GiB quota, $MODE) up to a "wait", prints its output
# so far and the device's used memory (MiB) then, and lets it finish.
held() {
    rm -f "$W/in"; mkfifo "$W/in"
    (exec env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=1g $MODE \
        "$RT" "$@" wait) <"$W/in" >"$W/out" 2>&1 &
    local pid=$!
    exec {fd}>"$W/in"
    for _ in $(seq 100); do grep -q ready "$W/out" && break; sleep 0.1; done
    cat "$W/out"; echo
    echo "device_used_mib=$(( $("$NV" | grep '^nvml index=0' | get used) / MiB ))"
    exec {fd}>&-
    wait "$pid"
}

echo "-- spill mode: spilled memory moved back to the device"
fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(held '!alloc' 960m '!alloc' 1g ismanaged prefetch-device advise-device info)
check "960 MiB on the device, 1 GiB spilled (managed)" test "$(echo "$out" | opline ismanaged | get managed)" = 1
check "prefetching the spilled GiB to the device: out of memory (the quota is full)" \
    test "$(echo "$out" | opline prefetch-device | get err)" = CUDA_ERROR_OUT_OF_MEMORY
check "preferring the device for it: out of memory" test "$(echo "$out" | opline advise-device | get err)" = CUDA_ERROR_OUT_OF_MEMORY
check "  ... each with one line saying why" test "$(echo "$out" | grep -c 'spilled past the quota and does not fit')" = 2
check "the device holds 960 MiB, within the 1 GiB quota (was 1984 MiB)" test "$(echo "$out" | get device_used_mib)" = 960
check "the host, as the library put it: allowed" test "$(held '!alloc' 960m '!alloc' 1g prefetch-host | opline prefetch-host | get rc)" = 0

fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(held '!alloc' 512m '!alloc' 512m ismanaged prefetch-device info alloc 1m ismanaged)
check "512 MiB on the device, 512 MiB spilled (the code's room)" test "$(echo "$out" | opline ismanaged | get managed)" = 1
check "prefetched while the quota has room: moved into the quota (rc 0)" test "$(echo "$out" | opline prefetch-device | get rc)" = 0
check "  ... the quota's view: all 1 GiB used" test "$(echo "$out" | opline info | get free)" = 0
check "  ... the device holds 1024 MiB, as the ledger says" test "$(echo "$out" | get device_used_mib)" = 1024
check "  ... the next allocation spills" test "$(echo "$out" | opline ismanaged 2 | get managed)" = 1
out=$(held '!alloc' 512m '!alloc' 512m prefetch-device free-last info)
check "  ... its free gives the quota back" test "$(echo "$out" | opline info | get free)" = $((512 * MiB))

echo "-- plain mode: the application's own managed memory"
fresh; MODE=
out=$(held '!managed' 768m advise-host prefetch-device advise-device info)
check "prefetched to its own device, charged at allocation: allowed" test "$(echo "$out" | opline prefetch-device | get rc)/$(echo "$out" | opline advise-device | get rc)" = 0/0
check "  ... the device holds 768 MiB, the quota says 768 MiB used" \
    test "$(echo "$out" | get device_used_mib)/$(echo "$out" | opline info | get free)" = "768/$((256 * MiB))"

echo "-- every version cuGetProcAddress hands out reaches the hook"
out=$(env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE "$RT" \
    procaddr cuMemAdvise 8000 procaddr cuMemAdvise 12020 procaddr cuMemPrefetchAsync 8000 \
    procaddr cuMemPrefetchAsync 12020 procaddr cuMemPrefetchAsync 8000 ptds procaddr cuMemPrefetchAsync 13000 ptds 2>&1)
# (the fake's cuMemPrefetchAsync and its _ptsz alias share one address, so either hook may answer for it)
check "each of the six resolves to the library (the preload front's hook)" \
    test "$(echo "$out" | grep '^op=procaddr' | grep -c 'rc=0')/$(echo "$out" | grep '^op=procaddr' | get lib | sort -u)" = 6/libvgpu.so
check "  ... the location forms to their own hooks (cuMemAdvise_v2, cuMemPrefetchAsync_v2, _v2_ptsz)" \
    test "$(echo "$out" | grep '^op=procaddr' | get sym | grep -c '_v2')" = 3

t_done
