#!/usr/bin/env bash
# A library loaded with no context current (issue 23 item 6; docs/libvgpu.md, "Contexts, modules and
# libraries"): the fake driver loads it into a context only at its first use there (cuLibraryGetModule,
# cuKernelGetFunction), as the real driver does; the library charges it then, once per context, and a
# first use past the quota is refused with the library unloaded. The truth is the device's used memory
# (the fake NVML, unpreloaded). Needs `make build`. No root needed.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
SUITE=libvgpu-libraries
RT=$CLIENTS_DIR/rt_client
NV=$CLIENTS_DIR/nvml_client
t_require "$LIBVGPU" "$RT" "$NV" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1"
export LD_LIBRARY_PATH=$FAKE_DIR
W=$(mktemp -d /tmp/vgpu-libraries-test.XXXXXX)
on_exit "kill \$(jobs -p) 2>/dev/null; rm -rf '$W'"
trap _run_on_exit EXIT
MiB=1048576

n=0
fresh() {   # a new fake device (16 GiB, contexts free, each library copy $1) and a new ledger
    n=$((n + 1))
    export FAKE_CUDA_STATE_DIR=$W/fake$n CACHE=$W/cache$n FAKE_CUDA_DEVICES=1 FAKE_CUDA_CONTEXT_BYTES=0 \
        FAKE_CUDA_MODULE_BYTES=$1
    mkdir -p "$FAKE_CUDA_STATE_DIR"
}
get() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
opline() { grep "^op=$1 " | sed -n "${2:-1}p"; }
# held ARGS...: the client under the library (1 GiB quota) up to a "wait": its output so far and the
# device's used memory (MiB) then.
held() {
    rm -f "$W/in"; mkfifo "$W/in"
    (exec env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=1g \
        "$RT" "$@" wait) <"$W/in" >"$W/out" 2>&1 &
    local pid=$!
    exec {fd}>"$W/in"
    for _ in $(seq 100); do grep -q ready "$W/out" && break; sleep 0.1; done
    cat "$W/out"; echo
    echo "device_used_mib=$(( $("$NV" | grep '^nvml index=0' | get used) / MiB ))"
    exec {fd}>&-
    wait "$pid"
}

echo "-- loaded with no context current, used in one"
fresh 2Gi
out=$(held '!library-early' library-module info)
check "the load (no context current) succeeds" test "$(echo "$out" | opline library-early | get rc)" = 0
check "its first use in a context takes 2 GiB past the 1 GiB quota: out of memory" \
    test "$(echo "$out" | opline library-module | get err)" = CUDA_ERROR_OUT_OF_MEMORY
check "  ... with one line saying why" test "$(echo "$out" | grep -c 'past device 0.s quota: unloaded')" = 1
check "  ... the device holds nothing of it (was 2048 MiB under the 1 GiB quota)" test "$(echo "$out" | get device_used_mib)" = 0

fresh 300Mi
out=$(held '!library-early' '!library-module' info '!library-kernel' info)
check "300 MiB: charged at its first use (cuLibraryGetModule)" test "$(echo "$out" | opline info | get free)" = $((724 * MiB))
check "  ... once per context (cuKernelGetFunction after it: nothing more)" test "$(echo "$out" | opline info 2 | get free)" = $((724 * MiB))
check "  ... the device holds 300 MiB, as the ledger says" test "$(echo "$out" | get device_used_mib)" = 300

fresh 300Mi
out=$(held '!library-early' '!library-kernel' '!ctx' '!library-kernel' info)
check "a kernel's first use in each of two contexts: 600 MiB charged" test "$(echo "$out" | opline info | get free)" = $((424 * MiB))
check "  ... the device holds 600 MiB" test "$(echo "$out" | get device_used_mib)" = 600
out=$(held '!library-early' '!library-kernel' '!ctx' '!library-kernel' free-all info)
check "the unload (and the context) give it all back" \
    test "$(echo "$out" | opline info | get free)/$(echo "$out" | get device_used_mib)" = "$((1024 * MiB))/0" 

fresh 600Mi
out=$(held '!library-early' '!library-module' '!ctx' library-module)
check "600 MiB in a second context does not fit beside the first: refused before the driver loads it" \
    test "$(echo "$out" | opline library-module 2 | get err)/$(echo "$out" | get device_used_mib)" = CUDA_ERROR_OUT_OF_MEMORY/600

t_done
