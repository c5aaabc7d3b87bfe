#!/usr/bin/env bash
# End-to-end tests of the attribution rule on the fake driver with two GPUs: every charge goes to the
# device of the object it concerns (a pool's location, a graph node's location, an imported handle's
# device), never to the current context's; a refusal never happens while the process's freed
# stream-ordered memory would make it fit; CUDA 13's cuCtxSynchronize_v2 reconciles. Each case checks
# the truth: the fake GPU's figure for this process (NVML's process list, which the library does not
# hook) against the ledger (the hooked nvmlDeviceGetMemoryInfo). Needs `make build`.
# VGPU_LIB=path runs the cases against another build of the library (e.g. an older one).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LIB=${VGPU_LIB:-$ROOT/target/vgpu/libvgpu.so}
RT=$ROOT/target/clients/rt_client
for f in "$LIB" "$RT" target/fake/libcuda.so.1 target/fake/libnvidia-ml.so.1; do
    [ -e "$f" ] || { echo "libvgpu-attribution.test: $f missing (run make build)"; echo "0 passed, 1 failed"; exit 1; }
done
export LD_LIBRARY_PATH=$ROOT/target/fake
W=$(mktemp -d /tmp/vgpu-attribution-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }

MiB=1048576
# vg ARGS...: the runtime-style client under the library on two fresh fake GPUs (quota LIMIT, default 1g;
# each context CTX_BYTES, each green context GREEN_BYTES, default 0); its log lines go to $W/err.
vg() {
    local d; d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
    FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=${CTX_BYTES:-0} \
        FAKE_CUDA_GREEN_CONTEXT_BYTES=${GREEN_BYTES:-0} FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/cache CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-1g} \
        timeout 30 "$RT" "$@" 2>"$W/err"
}
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }
opline() { grep "^op=$1 " | sed -n "${2:-1}p"; }
rcs() { grep "^op=$1 " | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' '; }
# truth OUT [Nth]: "used/ledger" of the Nth truth op
truth() { local l; l=$(echo "$1" | opline truth "${2:-1}"); echo "$(echo "$l" | field used)/$(echo "$l" | field ledger)"; }

# --- item 7: CUDA 13's cudaDeviceSynchronize (cuCtxSynchronize_v2), and no refusal while freed pool memory would fit
out=$(vg async 800m free-async sync2 truth 0 alloc 900m truth 0)
check "cuCtxSynchronize_v2 reconciles the pool the driver released (device and ledger 0)" test "$(truth "$out")" = "0/0"
check "so the next 900 MiB allocation under 1 GiB is granted, the ledger equal to the device" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out" 2)" = "0 /$((900 * MiB))/$((900 * MiB))"
out=$(vg async 800m free-async alloc 900m truth 0)
check "with no synchronisation at all, a refusal first trims the freed pool memory: granted, truth = ledger" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")" = "0 /$((900 * MiB))/$((900 * MiB))"
out=$(vg async 800m alloc 300m truth 0)
check "memory still in use in the pool is not reclaimed: refused" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")" = "2 /$((800 * MiB))/$((800 * MiB))"

# --- item 1: a pool's allocations are charged to the pool's location
out=$(vg device 0 nocontext pool-of 0 700m pool-of 0 700m truth 0)
check "device 0's current pool with no context current is held to device 0's quota" \
    test "$(echo "$out" | rcs pool-of)/$(truth "$out")" = "0 2 /$((704 * MiB))/$((704 * MiB))"
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=8g CUDA_DEVICE_MEMORY_LIMIT_1=1g vg device 0 pool-of 1 700m pool-of 1 700m truth 1 truth 0)
check "device 1's pool used from device 0's context is held to device 1's quota" \
    test "$(echo "$out" | rcs pool-of)/$(truth "$out")/$(truth "$out" 2)" = "0 2 /$((704 * MiB))/$((704 * MiB))/0/0"
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g vg device 0 pool-of 1 700m pool-of 1 700m truth 1)
check "and is not refused by device 0's quota while device 1 has room" \
    test "$(echo "$out" | rcs pool-of)/$(truth "$out")" = "0 0 /$((1408 * MiB))/$((1408 * MiB))"

# --- item 2: graph memory is charged per device, from each allocation node's location
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=8g CUDA_DEVICE_MEMORY_LIMIT_1=1g vg device 0 graph-on 1 2 600m truth 1)
check "two live 600 MiB nodes on device 1, launched from device 0's context: refused by device 1's 1 GiB" \
    test "$(echo "$out" | rcs graph-on)/$(truth "$out")" = "2 /0/0"
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=4g vg device 0 graph-on 1 4 600m truth 1 truth 0)
check "four 600 MiB nodes on device 1 under device 1's 4 GiB run; device 1's reservation charged there" \
    test "$(echo "$out" | rcs graph-on)/$(truth "$out")/$(truth "$out" 2)" = "0 /$((608 * MiB))/$((608 * MiB))/0/0"

# --- item 5: VMM export/import: the importer is charged; an import of the process's own export keeps it charged
# (the fake keeps exported memory while a copy of its descriptor is open, as an H200 does: issue 48)
out=$(vg vmm-fd 600m vmm-export vmm-import vmm-drop-first truth 0 vmm 600m)
check "create, export, import, release the original: stays charged (truth = ledger = 600 MiB)" \
    test "$(truth "$out")" = "$((600 * MiB))/$((600 * MiB))"
check "so a second 600 MiB under 1 GiB is refused" test "$(echo "$out" | rcs vmm-fd)/$(echo "$out" | rcs vmm)" = "0 /2 "
out=$(vg vmm-fd 600m vmm-export vmm-import truth 0 free-all truth 0 vmm-close-fd info truth 0)
check "the same memory imported in its own process is charged once" test "$(truth "$out")" = "$((600 * MiB))/$((600 * MiB))"
check "both released while the descriptor is open: the device keeps it and it stays charged" \
    test "$(truth "$out" 2)" = "$((600 * MiB))/$((600 * MiB))"
check "the descriptor closed, the device frees it; the ledger keeps it until the process ends (issue 48)" \
    test "$(truth "$out" 3)" = "0/$((600 * MiB))"

# --- issue 48 item 2: an exported handle's memory is kept by its descriptor after the release (three 1 GiB
# rounds under 2 GiB on an H200: 3,599 MiB used, the quota view 523 MiB; the library before this refunded
# each release and granted the third: 3 GiB held, 1 GiB charged)
out=$(vg vmm-fd 600m vmm-export free-all truth 0 vmm 600m)
check "an exported allocation released with its descriptor open: held and charged (truth = ledger = 600 MiB)" \
    test "$(truth "$out")" = "$((600 * MiB))/$((600 * MiB))"
check "so a second 600 MiB under 1 GiB is refused" test "$(echo "$out" | rcs vmm)" = "2 "
out=$(LIMIT=2g vg vmm-fd 1g vmm-export vmm-drop-first vmm-fd 1g vmm-export vmm-drop-first vmm-fd 1g truth 0)
check "three rounds of create, export, release under 2 GiB: the third refused, 2 GiB held and charged" \
    test "$(echo "$out" | rcs vmm-fd)/$(truth "$out")" = "0 0 2 /$((2048 * MiB))/$((2048 * MiB))"

# --- issue 48 (gap 48.2): memory shared through legacy CUDA IPC is kept by the driver past cuMemFree (an H200
# keeps it; the fake too, until the process ends): the free does not refund it (the library before this
# refunded it and granted a second 600 MiB: 1.2 GiB held under 1 GiB)
out=$(vg alloc 600m ipc free-last truth 0 alloc 600m)
check "cuIpcGetMemHandle, then cuMemFree: still held and still charged (truth = ledger = 600 MiB)" \
    test "$(truth "$out")" = "$((600 * MiB))/$((600 * MiB))"
check "  ... so a second 600 MiB under 1 GiB is refused" test "$(echo "$out" | rcs alloc)" = "0 2 "
check "  ... with a line saying why it stays charged" grep -q "it was shared (CUDA IPC, a dma-buf descriptor or an exported pool): another process may keep its memory" "$W/err"
out=$(vg alloc 600m free-last alloc 600m)
check "  ... where a free never shared gives it back (the second granted)" test "$(echo "$out" | rcs alloc)" = "0 0 "
out=$(vg alloc 600m dmabuf free-last truth 0 alloc 600m)
check "a dma-buf descriptor (cuMemGetHandleForAddressRange), then cuMemFree: still held and charged (truth = ledger = 600 MiB)" \
    test "$(echo "$out" | rcs dmabuf)/$(truth "$out")" = "0 /$((600 * MiB))/$((600 * MiB))"
check "  ... so a second 600 MiB under 1 GiB is refused" test "$(echo "$out" | rcs alloc)" = "0 2 "

# --- issue 48 (gap 48.2), legacy IPC's importer (cuIpcOpenMemHandle): another container's memory opened here is
# charged here (the library before this charged nothing: 600 MiB opened and 600 MiB more granted under
# 1 GiB); memory a live process of the same container exported is charged once (to its exporter, until
# it ends); a close gives back only what the open charged; an open whose exporter ended is charged here.
# ipc_pair CACHE_A LIMIT_A EXPORTER_SECS CACHE_B LIMIT_B OPS...: a process exports 600 MiB (in the
# container of ledger CACHE_A) and lives EXPORTER_SECS; another (CACHE_B) opens its handle, then runs OPS.
ipc_pair() {
    local d a=$1 la=$2 secs=$3 b=$4 lb=$5; shift 5
    d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
    FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/$a CUDA_DEVICE_MEMORY_LIMIT=$la \
        timeout 30 "$RT" alloc 600m ipc sleep "$secs" >"$d/exporter.out" 2>/dev/null &
    local exporter=$!
    for _ in $(seq 100); do grep -q '^op=ipc ' "$d/exporter.out" 2>/dev/null && break; sleep 0.1; done
    FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/$b CUDA_DEVICE_MEMORY_LIMIT=$lb \
        timeout 30 "$RT" ipc-open "$(opline ipc <"$d/exporter.out" | field handle)" "$@" 2>"$W/err"
    kill "$exporter" 2>/dev/null; wait "$exporter" 2>/dev/null
}
ledger() { echo "$1" | opline truth "${2:-1}" | field ledger; }
out=$(ipc_pair ipc-a 8g 10 ipc-b 1g truth 0 alloc 600m ipc-close truth 0 alloc 600m)
check "cuIpcOpenMemHandle of another container's 600 MiB: charged to the importer (its ledger 600 MiB)" \
    test "$(echo "$out" | rcs ipc-open)/$(ledger "$out")" = "0 /$((600 * MiB))"
check "  ... so 600 MiB more under its 1 GiB is refused; after cuIpcCloseMemHandle, nothing charged and granted" \
    test "$(echo "$out" | rcs alloc)/$(ledger "$out" 2)" = "2 0 /0"
out=$(ipc_pair ipc-c 1g 10 ipc-c 1g truth 0 alloc 300m alloc 200m ipc-close alloc 200m)
check "the same container's export opened: charged once (the ledger 600 MiB), so 300 MiB more fit under 1 GiB" \
    test "$(ledger "$out")/$(echo "$out" | rcs alloc)" = "$((600 * MiB))/0 2 2 "
check "  ... and the close gives back nothing its exporter holds (200 MiB still refused)" \
    test "$(echo "$out" | rcs ipc-close)" = "0 "
out=$(ipc_pair ipc-e 1g 1 ipc-e 1g sleep 3 info alloc 500m truth 0)
check "the exporter ended while the importer maps its memory: charged to the importer, 500 MiB more refused" \
    test "$(echo "$out" | rcs ipc-open)/$(echo "$out" | rcs alloc)" = "0 /2 "
check "  ... the device keeps it for the importer, and the ledger says so (truth = ledger = 600 MiB)" \
    test "$(truth "$out")" = "$((600 * MiB))/$((600 * MiB))"

# The mark is the tenant's to forge: a process of the container that never loads the library holds the lock
# at the handle's mark (a POSIX read lock of that byte of the ledger file) from before the exporter ends.
# Then the open stays charged nothing after the exporter ended: its 600 MiB held and charged to nobody, and
# 500 MiB more granted under 1 GiB. What writing the ledger buys, no more (docs/security.md: the ledger is the
# container's account, not a wall; the node sees such memory as unattributed). Shown so the docs stay true.
forge_mark() {
    python3 -c 'import fcntl, glob, os, sys, time
h = 0xcbf29ce484222325
for b in bytes.fromhex(sys.argv[2]):
    h = ((h ^ b) * 0x100000001b3) % (1 << 64)
fd = os.open(sorted(glob.glob(sys.argv[1] + ".GPU-*"))[0], os.O_RDONLY)
fcntl.lockf(fd, fcntl.LOCK_SH, 1, (1 << 56) + h % (1 << 40))
print("held", flush=True)
time.sleep(float(sys.argv[3]))' "$@"
}
d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/ipc-f CUDA_DEVICE_MEMORY_LIMIT=1g \
    timeout 30 "$RT" alloc 600m ipc sleep 1.5 >"$d/exporter.out" 2>/dev/null &
exporter=$!
for _ in $(seq 100); do grep -q '^op=ipc ' "$d/exporter.out" 2>/dev/null && break; sleep 0.1; done
handle=$(opline ipc <"$d/exporter.out" | field handle)
forge_mark "$W/ipc-f" "${handle#0x}" 8 >"$d/forger.out" 2>&1 &
forger=$!
for _ in $(seq 50); do grep -q held "$d/forger.out" && break; sleep 0.1; done
out=$(FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/ipc-f CUDA_DEVICE_MEMORY_LIMIT=1g \
    timeout 30 "$RT" ipc-open "$handle" sleep 3 info alloc 500m truth 0 2>"$W/err")
wait "$exporter" 2>/dev/null; kill "$forger" 2>/dev/null; wait "$forger" 2>/dev/null
check "a forged mark (a lock held by a process without the library): once the exporter ended, the open is charged to nobody: 500 MiB more granted, 1,100 MiB held under 1 GiB with 500 charged" \
    test "$(echo "$out" | rcs ipc-open)/$(echo "$out" | rcs alloc)/$(truth "$out")" = "0 /0 /$((1100 * MiB))/$((500 * MiB))"

# --- issue 48 (gap 48.2), shared pools: an exported pool's freed allocation may be kept by an importer (the
# fake keeps an exported pointer's memory until its exporter ends), so neither its free nor the pool's
# destruction gives it back (the library before this refunded it at the destruction: 608 MiB held, the
# ledger at 0, and 600 MiB more granted under 1 GiB); a pointer imported from another container's pool is
# charged to the importer until it frees it; from the same container's, once.
out=$(vg pool-shared pool 600m pool-export pool-export-ptr free-async sync pool-destroy info truth 0 alloc 600m)
check "an exported pool's pointer exported, freed, the pool destroyed: held and charged (truth = ledger = 608 MiB)" \
    test "$(echo "$out" | rcs pool-export-ptr)/$(truth "$out")" = "0 /$((608 * MiB))/$((608 * MiB))"
check "  ... so 600 MiB more under 1 GiB is refused, with the line saying why" \
    test "$(echo "$out" | rcs alloc)/$(grep -c 'or an exported pool): another process may keep its memory' "$W/err")" = "2 /1"
# pool_pair CACHE_A CACHE_B OPS...: a process exports its pool and a 600 MiB pointer of it (ledger CACHE_A,
# 1 GiB), another (CACHE_B, 1 GiB) imports the pool and the pointer, then runs OPS.
pool_pair() {
    local d a=$1 b=$2; shift 2
    d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
    FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/$a CUDA_DEVICE_MEMORY_LIMIT=1g \
        timeout 30 "$RT" pool-shared pool 600m pool-export pool-export-ptr sleep 10 >"$d/exporter.out" 2>/dev/null &
    local exporter=$!
    for _ in $(seq 100); do grep -q '^op=pool-export-ptr ' "$d/exporter.out" 2>/dev/null && break; sleep 0.1; done
    local fd pid data
    fd=$(opline pool-export <"$d/exporter.out" | field fd); pid=$(opline init <"$d/exporter.out" | field pid)
    data=$(opline pool-export-ptr <"$d/exporter.out" | field data)
    FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/$b CUDA_DEVICE_MEMORY_LIMIT=1g \
        timeout 30 "$RT" pool-import-path "/proc/$pid/fd/$fd" pool-import-ptr "$data" "$@" 2>"$W/err"
    kill "$exporter" 2>/dev/null; wait "$exporter" 2>/dev/null
}
out=$(pool_pair pool-a pool-b truth 0 alloc 600m free-imported truth 0 alloc 600m)
check "cuMemPoolImportPointer of another container's 600 MiB: charged to the importer (its ledger 600 MiB)" \
    test "$(echo "$out" | rcs pool-import-ptr)/$(ledger "$out")" = "0 /$((600 * MiB))"
check "  ... so 600 MiB more under its 1 GiB is refused; once it frees the pointer, nothing charged and granted" \
    test "$(echo "$out" | rcs alloc)/$(ledger "$out" 2)" = "2 0 /0"
out=$(pool_pair pool-c pool-c truth 0 alloc 300m alloc 200m)
check "a pointer of the same container's pool imported: charged once (the exporter's 608 MiB), 300 MiB more fit" \
    test "$(echo "$out" | rcs pool-import-ptr)/$(ledger "$out")/$(echo "$out" | rcs alloc)" = "0 /$((608 * MiB))/0 2 "

# --- issue 48 item 3: another process's export mapped in windows is charged by their union (the library
# before this charged the largest window: 32 windows of 64 MiB, 2 GiB in all, cost 64 MiB under 1 GiB)
d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/exporter CUDA_DEVICE_MEMORY_LIMIT=8g \
    timeout 30 "$RT" vmm-fd 2g vmm-export sleep 10 >"$d/exporter.out" 2>/dev/null &
exporter=$!
for _ in $(seq 100); do grep -q '^op=vmm-export ' "$d/exporter.out" 2>/dev/null && break; sleep 0.1; done
fd=$(opline vmm-export <"$d/exporter.out" | field fd); pid=$(opline init <"$d/exporter.out" | field pid)
out=$(FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/importer CUDA_DEVICE_MEMORY_LIMIT=1g \
    timeout 30 "$RT" vmm-import-path "/proc/$pid/fd/$fd" vmm-windows 64m 32 2>"$W/err")
kill "$exporter" 2>/dev/null; wait "$exporter" 2>/dev/null
check "another process's 2 GiB mapped in 64 MiB windows under 1 GiB: 16 windows, the 17th refused" \
    test "$(echo "$out" | rcs vmm-import-path)/$(echo "$out" | opline vmm-windows | field mapped)/$(echo "$out" | rcs vmm-windows)" = "0 /16/2 "

# --- issue 48 item 4: a sparse array's tile and a multicast binding hold the memory they map or bind (the
# library before this passed both through: the release refunded what the driver still held)
out=$(vg vmm 600m tile-map vmm-drop-first truth 0 vmm 600m tile-unmap info truth 0)
check "a handle released while a sparse array's tile maps it: held and charged (truth = ledger)" \
    test "$(echo "$out" | rcs tile-map)$(truth "$out")" = "0 $((600 * MiB))/$((600 * MiB))"
check "so a second 600 MiB under 1 GiB is refused, and the tile's unmap gives it back" \
    test "$(echo "$out" | rcs vmm)/$(truth "$out" 2)" = "0 2 /0/0"
out=$(vg vmm 600m mc-bind vmm-drop-first truth 0 vmm 600m mc-unbind info truth 0)
check "a handle released while bound to a multicast object: held and charged (truth = ledger)" \
    test "$(echo "$out" | rcs mc-bind)$(truth "$out")" = "0 $((600 * MiB))/$((600 * MiB))"
check "so a second 600 MiB under 1 GiB is refused, and the unbind gives it back" \
    test "$(echo "$out" | rcs vmm)/$(truth "$out" 2)" = "0 2 /0/0"

# --- issue 23 leftover: a green context is a context of its own on its device (the library before it
# charged nothing: device 1 held 300 MiB with an empty ledger, and 2 GiB under a 1 GiB quota)
out=$(GREEN_BYTES=$((300 * MiB)) CUDA_DEVICE_MEMORY_LIMIT_0=8g CUDA_DEVICE_MEMORY_LIMIT_1=1g vg device 0 green 1 truth 1)
check "a green context of device 1, made from device 0's context, is charged to device 1 (truth = ledger)" \
    test "$(echo "$out" | rcs green)/$(truth "$out")" = "0 /$((300 * MiB))/$((300 * MiB))"
out=$(GREEN_BYTES=$((2048 * MiB)) CUDA_DEVICE_MEMORY_LIMIT_0=8g CUDA_DEVICE_MEMORY_LIMIT_1=1g vg device 0 green 1 truth 1)
check "one that does not fit device 1's 1 GiB is refused with out-of-memory, and the device holds nothing of it" \
    test "$(echo "$out" | rcs green)/$(truth "$out")" = "2 /0/0"
out=$(CTX_BYTES=$((100 * MiB)) GREEN_BYTES=$((6 * MiB)) vg device 0 green 0 alloc 200m truth 0 green-destroy truth 0)
check "a green context is charged what it took (6 MiB, as on an H100)" \
    test "$(truth "$out")" = "$((306 * MiB))/$((306 * MiB))"
check "its destruction gives back the context and what was made in it (truth = ledger = the primary context)" \
    test "$(echo "$out" | rcs green-destroy)/$(truth "$out" 2)" = "0 /$((100 * MiB))/$((100 * MiB))"

# --- issue 48 item 5: managed memory reaches every device where the process has a context (a kernel there
# faults its pages in; read-mostly advice copies them there), so it is charged on each of them. The fake
# models the faults with FAKE_CUDA_MANAGED_FAULTS=1 (a launch brings the process's managed memory to its
# device). The library before it charged device 0 only: device 1 held 1,102 MiB under its 1 GiB quota with
# 302 MiB charged, and the 300 MiB allocation was granted.
out=$(FAKE_CUDA_MANAGED_FAULTS=1 vg device 0 managed 800m device 1 module launch 1 truth 1 alloc 300m truth 1)
check "800 MiB managed on device 0, a kernel on device 1 faults it in: charged on device 1 too (truth = ledger = 802 MiB)" \
    test "$(truth "$out")" = "$((802 * MiB))/$((802 * MiB))"
check "  ... so 300 MiB more on device 1 under its 1 GiB is refused, the device holding what the ledger says" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out" 2)" = "2 /$((802 * MiB))/$((802 * MiB))"
out=$(FAKE_CUDA_MANAGED_FAULTS=1 vg device 0 managed 800m advise-read-mostly device 1 module launch 1 alloc 300m truth 1 truth 0)
check "read-mostly: device 1's copy is charged there (300 MiB more refused), device 0 keeps its own (truth = ledger on both)" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")/$(truth "$out" 2)" = "2 /$((802 * MiB))/$((802 * MiB))/$((800 * MiB))/$((800 * MiB))"
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m vg device 0 managed 800m device 1 alloc 100m truth 0)
check "a first context on device 1 where the 800 MiB cannot fit its 512 MiB: refused with out-of-memory" \
    test "$(echo "$out" | rcs device)" = "0 2 "
check "  ... with one line saying why, device 0's charge untouched" \
    test "$(grep -c 'refused a context on device 1' "$W/err")/$(truth "$out")" = "1/$((900 * MiB))/$((900 * MiB))"
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m vg device 0 managed 800m green 1 green 0)
check "  ... a green context there too (a context of its own); one on device 0 is not charged it again" \
    test "$(echo "$out" | rcs green)" = "2 0 "
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m vg device 1 device 0 managed 800m truth 0 managed 400m truth 1)
check "with a context on device 1 already, 800 MiB managed that cannot fit its 512 MiB is refused, nothing held" \
    test "$(echo "$out" | rcs managed)/$(truth "$out")" = "2 0 /0/0"
check "  ... and 400 MiB that fits is charged on device 1 too (its ledger 400 MiB)" \
    test "$(ledger "$out" 2)" = "$((400 * MiB))"
d=$(mktemp -d "$W/case.XXXXXX"); mkdir -p "$d/fake"
out=$(FAKE_CUDA_MANAGED_FAULTS=1 FAKE_CUDA_STATE_DIR=$d/fake FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB \
    CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/cache CUDA_DEVICE_MEMORY_LIMIT_1=1g \
    timeout 30 "$RT" device 0 managed 800m device 1 module launch 1 alloc 300m truth 1 2>"$W/err")
check "a quota on device 1 only: device 0's managed memory, faulted in there, is charged there (300 MiB more refused)" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")" = "2 /$((802 * MiB))/$((802 * MiB))"
out=$(vg device 0 managed 800m alloc 200m truth 0)
check "a process on device 0 only is charged its managed memory once (200 MiB more granted under 1 GiB)" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")" = "0 /$((1000 * MiB))/$((1000 * MiB))"
out=$(vg device 1 device 0 managed 800m free-all device 1 alloc 900m truth 1)
check "the free of managed memory gives back every device it was charged on (900 MiB then fit on device 1)" \
    test "$(echo "$out" | rcs alloc)/$(truth "$out")" = "0 /$((900 * MiB))/$((900 * MiB))"

# --- item 11: an allocation whose device cannot be told is refused, with one log line
out=$(vg device 0 nocontext async-default 64m truth 0)
check "cuMemAllocAsync on the default stream with no context current: refused, nothing held" \
    test "$(echo "$out" | rcs async-default)/$(truth "$out")" = "2 /0/0"
check "with one log line saying why" test "$(grep -c 'does not say which device' "$W/err")" = 1

echo "libvgpu-attribution: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
