#!/usr/bin/env bash
# Unified memory on the fake driver (docs/libvgpu.md, "Unified memory"), configured by the environment as
# a process outside a container is: spill mode (past the quota into a host budget shared by the processes
# of one ledger, exact across SIGKILL) and oversubscribe mode (every allocation managed, quotas that sum
# past the device). Every allocation path: plain, pitch, managed, async (stays device memory). The
# time-quanta turn gate of oversubscribed GPUs, with tests/e2e/lib/turn.py in the arbiter's place.
# Needs `make build` (target/vgpu/libvgpu.so, target/fake/*, target/clients/*). No root needed.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
SUITE=libvgpu-unified
RT=$CLIENTS_DIR/rt_client
t_require "$LIBVGPU" "$RT" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1"
export LD_LIBRARY_PATH=$FAKE_DIR
W=$(mktemp -d /tmp/vgpu-unified-test.XXXXXX)
on_exit "kill \$(jobs -p); rm -rf '$W'"
trap _run_on_exit EXIT
GiB=1073741824; MiB=1048576

n=0
fresh() {   # fresh [DEVICES]: new fake-device state (default one 16 GiB device) and a new ledger prefix
    n=$((n + 1))
    export FAKE_CUDA_STATE_DIR=$W/fake$n CACHE=$W/cache$n FAKE_CUDA_DEVICES=${1:-1}
    mkdir -p "$FAKE_CUDA_STATE_DIR"
    export FAKE_CUDA_CONTEXT_BYTES=0
}
# vg CLIENT ARGS...: under the library with a 1 GiB quota (LIMIT overrides) and the MODE variables given.
vg() { env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-1g} $MODE "$@"; }
get() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }   # get KEY < lines
opline() { grep "^op=$1 " | sed -n "${2:-1}p"; }
# bg NAME ARGS...: a client left holding its memory at a "wait" (stdin a FIFO); its output in $W/NAME.out
bg() {
    local name=$1; shift
    rm -f "$W/$name.in"; mkfifo "$W/$name.in"
    # exec: $! is the client itself (what the SIGKILL cases kill), never a subshell around it
    (exec env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-1g} \
        $MODE "$RT" "$@" wait) <"$W/$name.in" >"$W/$name.out" 2>&1 &
    eval "${name}_pid=$!"
    # the FIFO's writer stays open here (the client waits on it) until `gone` closes it
    exec {fd}>"$W/$name.in"; eval "${name}_fd=$fd"
    for _ in $(seq 100); do grep -q ready "$W/$name.out" && return 0; sleep 0.1; done
    return 1
}
# gone NAME: SIGKILL the held client, close its FIFO, and check it is dead
gone() {
    local pid fd
    eval "pid=\$${1}_pid fd=\$${1}_fd"
    kill -9 "$pid"; wait "$pid" 2>/dev/null
    exec {fd}>&-
    ! kill -0 "$pid" 2>/dev/null
}

echo "-- spill: past the quota into the host budget"
fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(vg "$RT" '!alloc' 512m '!alloc' 1g memcheck ismanaged info alloc 2g pitch 4096 262144 ismanaged async 1g 2>&1)
check "within the quota, then 1 GiB past it, served (ok, ok)" test "$(echo "$out" | opline alloc 1 | get rc)/$(echo "$out" | opline alloc 2 | get rc)" = 0/0
check "the spilled memory is usable (memcheck)" test "$(echo "$out" | opline memcheck | get ok)" = 1
check "it is managed memory of device 0 (cuPointerGetAttribute)" test "$(echo "$out" | opline ismanaged | get managed)/$(echo "$out" | opline ismanaged | get devord)" = 1/0
check "the quota's view: 512 MiB used of 1 GiB" test "$(echo "$out" | opline info | get free)/$(echo "$out" | opline info | get total)" = "$((512 * MiB))/$GiB"
check "past the 2 GiB budget: out of memory" test "$(echo "$out" | opline alloc 3 | get err)" = CUDA_ERROR_OUT_OF_MEMORY
check "a pitch allocation past the quota spills with 512-byte rows" test "$(echo "$out" | opline pitch | get rc)/$(echo "$out" | opline pitch | get pitch)/$(echo "$out" | opline ismanaged 2 | get managed)" = 0/4096/1
check "stream-ordered memory never spills (out of memory)" test "$(echo "$out" | opline async | get err)" = CUDA_ERROR_OUT_OF_MEMORY
out=$(MODE= vg "$RT" alloc 512m alloc 1g 2>&1)
check "the same without spill: out of memory" test "$(echo "$out" | opline alloc 2 | get err)" = CUDA_ERROR_OUT_OF_MEMORY
fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(vg "$RT" alloc 960m alloc 1g free-last alloc 1g free-all alloc 960m alloc 2g 2>&1)
check "frees refund the spill budget exactly (after free-all: the quota less the code's room + the whole 2 GiB budget)" \
    test "$(echo "$out" | grep '^op=\(alloc\|free\)' | grep -c 'rc=0')" = 7

echo "-- spill: room left in the quota for lazily loaded code (1/16 of it, at most 256 MiB)"
fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(vg "$RT" alloc 960m ismanaged alloc 32m ismanaged alloc 32m ismanaged info 2>&1)
check "960 MiB of the 1 GiB quota: device memory" test "$(echo "$out" | opline ismanaged 1 | get managed)" = 0
check "32 MiB more would leave 32 of the 64 MiB room: spilled" test "$(echo "$out" | opline ismanaged 2 | get managed)/$(echo "$out" | opline ismanaged 3 | get managed)" = 1/1
check "  ... the quota's view: 960 MiB used" test "$(echo "$out" | opline info | get free)" = "$((64 * MiB))"

echo "-- CUDA IPC: device memory only; memory served as managed is refused with CUDA_ERROR_NOT_SUPPORTED"
fresh; MODE="VGPU_MEMORY_SPILL=2g"
out=$(vg "$RT" alloc 512m ipc alloc 1g ipc 2>&1)
check "spill mode, within the quota: device memory, a handle (rc 0)" test "$(echo "$out" | opline ipc 1 | get rc)" = 0
check "spill mode, spilled: CUDA_ERROR_NOT_SUPPORTED" test "$(echo "$out" | opline ipc 2 | get err)" = CUDA_ERROR_NOT_SUPPORTED
check "  ... with one line saying why" test "$(echo "$out" | grep -c 'cuIpcGetMemHandle: .* served as managed memory')" = 1
out=$(MODE="CUDA_OVERSUBSCRIBE=true" vg "$RT" alloc 512m ipc 2>&1)
check "oversubscribe mode: CUDA_ERROR_NOT_SUPPORTED" test "$(echo "$out" | opline ipc | get err)" = CUDA_ERROR_NOT_SUPPORTED
out=$(vg "$RT" managed 64m ipc 2>&1)
check "the application's own managed memory: the driver's answer, passed through" test "$(echo "$out" | opline ipc | get err)" = CUDA_ERROR_INVALID_VALUE

echo "-- spill: one budget for the processes of a ledger, exact across SIGKILL"
fresh; MODE="VGPU_MEMORY_SPILL=2g"
bg a '!alloc' 960m '!alloc' 1536m; check_eq "process A: 960 MiB of the quota + 1.5 GiB spilled, held" "$?" 0
out=$(vg "$RT" alloc 1g 2>&1)
check "process B: nothing left of quota or budget (out of memory)" test "$(echo "$out" | opline alloc | get err)" = CUDA_ERROR_OUT_OF_MEMORY
out=$(vg "$RT" alloc 512m 2>&1)
check "process B: the budget's last 512 MiB spills" test "$(echo "$out" | opline alloc | get rc)" = 0
gone a; check_eq "process A killed (SIGKILL) and reaped" "$?" 0
out=$(vg "$RT" '!alloc' 960m '!alloc' 2g 2>&1)
check "A killed: its quota and spill come back whole (960 MiB + 2 GiB)" test "$(echo "$out" | grep '^op=alloc' | grep -c 'rc=0')" = 2

echo "-- oversubscribe: managed memory, quotas summing past the device"
fresh 1x4Gi; MODE="CUDA_OVERSUBSCRIBE=true"; LIMIT=3g
bg a '!alloc' 2560m memcheck; check_eq "process A (3 GiB quota on a 4 GiB device): 2.5 GiB, held" "$?" 0
CACHE=$W/other$n
out=$(vg "$RT" alloc 2560m memcheck ismanaged info alloc 1g 2>&1)
check "process B of another quota: 2.5 GiB too (5 GiB on the 4 GiB device)" test "$(echo "$out" | opline alloc | get rc)/$(echo "$out" | opline memcheck | get ok)" = 0/1
check "  ... managed memory" test "$(echo "$out" | opline ismanaged | get managed)" = 1
check "cuMemGetInfo: total the quota, free less the 1.5 GiB reserve (0 left)" test "$(echo "$out" | opline info | get total)/$(echo "$out" | opline info | get free)" = "$((3 * GiB))/0"
check "the quota still caps the total (out of memory)" test "$(echo "$out" | opline alloc 2 | get err)" = CUDA_ERROR_OUT_OF_MEMORY
gone a
fresh 1x4Gi; MODE=""; LIMIT=3g
bg a '!alloc' 2560m; check_eq "plain mode, process A: 2.5 GiB held" "$?" 0
CACHE=$W/other$n
out=$(vg "$RT" alloc 2560m 2>&1)
check "plain mode, process B: the device is full (out of memory)" test "$(echo "$out" | opline alloc | get err)" = CUDA_ERROR_OUT_OF_MEMORY
gone a
fresh; MODE="VGPU_MEMORY_MODE=oversubscribe VGPU_MEMORY_RESERVE=256m"; LIMIT=32g
out=$(vg "$RT" info 2>&1)
check "a quota past the device's 16 GiB is the size seen; the reserve is configurable" test "$(echo "$out" | opline info | get total)/$(echo "$out" | opline info | get free)/$(echo "$out" | opline info | get devtotal)" = "$((32 * GiB))/$((32 * GiB - 256 * MiB))/$((32 * GiB))"
unset LIMIT

echo "-- time quanta: every launch path waits for the GPU's turn (tests/e2e/lib/turn.py plays the arbiter)"
TURN="python3 $(dirname "$0")/lib/turn.py"
UUID0=GPU-fa4ec0de-0000-4000-8000-000000000000
# vgbg NAME ARGS...: a client under the library in the background, output in $W/NAME.out, pid in NAME_pid
vgbg() { local name=$1; shift; (exec env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE \
    CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-1g} $MODE "$RT" "$@") >"$W/$name.out" 2>&1 & eval "${name}_pid=$!"; }
# ready NAME...: waits until each client printed its await line (its ledger exists then)
ready() { local c; for c in "$@"; do for _ in $(seq 100); do grep -qs "op=await ready" "$W/$c.out" && break; sleep 0.1; done; done; }
# done_within SECS NAME...: every client exited within SECS
done_within() {
    local secs=$1 c; shift
    for c in "$@"; do
        local pid; eval "pid=\$${c}_pid"
        for _ in $(seq $((secs * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && return 1
    done
    return 0
}
fresh 1x4Gi; MODE="CUDA_OVERSUBSCRIBE=true"; LIMIT=3g
L=$CACHE.$UUID0
go=$W/go$n
vgbg k '!module' await "$go" '!launch' 10
vgbg m '!alloc' 64m await "$go" '!memcheck'
vgbg g '!module' await "$go" '!graph-work' 0.1 1
ready k m g
$TURN set "$L" wait 1; $TURN beat "$L" 60 & beater=$!
on_exit "kill $beater"
touch "$go"; sleep 1
check "Wait: kernels, memsets and copies, and graphs are all held back (no op done after 1 s)" \
    test -z "$(cat "$W/k.out" "$W/m.out" "$W/g.out" | grep -E '^op=(launch|memcheck|graph-work) ')"
check_eq "  ... each process's waiting thread is counted in the ledger" "$($TURN get "$L" waiting)" 3
$TURN set "$L" hold 2
done_within 10 k m g; check_eq "Hold: they go (all three done)" "$?" 0
check "  ... and succeed" test "$(cat "$W/k.out" "$W/m.out" "$W/g.out" | grep -cE '^op=(launch|memcheck|graph-work) .*rc=0')" = 3
check "  ... the memset and copies moved the right bytes" test "$(grep '^op=memcheck' "$W/m.out" | get ok)" = 1
check "  ... their launches while holding are counted (10 kernels + 4 transfers + the graph's)" \
    test "$($TURN get "$L" launches)" -ge 15
check "  ... the waits are summed (3 threads, at least 1 s each)" test "$($TURN get "$L" waited_ns)" -ge 3000000000
check_eq "  ... nobody waits any more" "$($TURN get "$L" waiting)" 0
go=$W/yield$n
vgbg y '!module' '!launch' 5 await "$go" '!launch' 5
ready y
$TURN set "$L" yield 7; touch "$go"
for _ in $(seq 50); do [ "$($TURN get "$L" drained)" = 7 ] && break; sleep 0.1; done
check_eq "Yield: the process drains its work and records the yield's epoch" "$($TURN get "$L" drained)" 7
check_eq "  ... then waits (counted)" "$($TURN get "$L" waiting)" 1
check_eq "  ... its second launch not done" "$(grep -c '^op=launch' "$W/y.out")" 1
$TURN set "$L" free 8
done_within 10 y; check_eq "Free: it goes" "$?" 0
check "  ... both launches done" test "$(grep -c '^op=launch .*rc=0' "$W/y.out")" = 2
# Every entry point of tests/clients/compute_client.c (no context current, a CUkernel, another context's
# function, cuLaunchKernelEx, cooperative, multi-device, a graph, memsets, copies, batch copies).
modes="plain noctx kernel otherctx ex coop multi graph memset memcpy batch batch3d"
$TURN set "$L" wait 20
for m in $modes; do
    (exec env LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=$LIMIT $MODE \
        "$CLIENTS_DIR/compute_client" $m 0.2 8) >"$W/cc-$m.out" 2>&1 &
    eval "cc_${m}_pid=$!"
done
sleep 2
check "Wait: no entry point of compute_client gets through (none done after 2 s: $modes)" \
    test -z "$(for m in $modes; do cat "$W/cc-$m.out"; done | grep '^mode=')"
$TURN set "$L" hold 21
done_within 30 $(for m in $modes; do echo cc_$m; done); check_eq "Hold: every one goes" "$?" 0
check "  ... and succeeds (rc=0 for all $(echo $modes | wc -w))" \
    test "$(for m in $modes; do cat "$W/cc-$m.out"; done | grep -c '^mode=.* rc=0 ')" = "$(echo $modes | wc -w)"
kill $beater; wait $beater 2>/dev/null
$TURN set "$L" wait 9   # and no heartbeat after: the arbiter is gone
t0=$(date +%s%N)
out=$(vg "$RT" '!module' '!launch' 10 2>&1)
ms=$((($(date +%s%N) - t0) / 1000000))
check "a dead arbiter (heartbeat still, Wait): the launches go after the 3 s bound, not later (${ms} ms for 10)" \
    test "$(echo "$out" | opline launch | get rc)" = 0 -a "$ms" -ge 2900 -a "$ms" -lt 8000
check "  ... saying so once" test "$(echo "$out" | grep -c 'heartbeat stood still')" = 1
fresh 1x4Gi; MODE=""; LIMIT=3g
L=$CACHE.$UUID0; go=$W/plain$n
vgbg p '!module' await "$go" '!launch' 10 '!alloc' 64m '!memcheck'
ready p
$TURN set "$L" wait 1; $TURN beat "$L" 20 & beater=$!
touch "$go"
done_within 10 p; check_eq "a plain quota is never gated, whatever its ledger says (done while Wait)" "$?" 0
check "  ... every op succeeded" test "$(grep -cE '^op=(launch|memcheck) .*rc=0' "$W/p.out")" = 2
kill $beater; wait $beater 2>/dev/null
unset LIMIT

echo "-- bad settings never run"
fresh
for bad in "VGPU_MEMORY_MODE=swap" "VGPU_MEMORY_MODE=spill" "VGPU_MEMORY_SPILL=0" "CUDA_OVERSUBSCRIBE=true VGPU_MEMORY_SPILL=1g"; do
    MODE=$bad
    out=$(vg "$RT" info 2>&1)
    check "$bad: CUDA refused with one line naming it" test "$(echo "$out" | grep -c 'VGPU_MEMORY\|CUDA_OVERSUBSCRIBE')" = 1 -a -z "$(echo "$out" | opline info | grep 'rc=0')"
done

t_done
