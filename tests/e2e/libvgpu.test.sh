#!/usr/bin/env bash
# End-to-end tests of libvgpu.so on the fake driver: both test clients (runtime-style through dlsym +
# cuGetProcAddress_v2, and linked), NVML through dlsym, several processes, fork, SIGKILL, configuration.
# Needs `make build` (target/vgpu/libvgpu.so, target/fake/*, target/clients/*).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LIB=$ROOT/target/vgpu/libvgpu.so
RT=$ROOT/target/clients/rt_client
LN=$ROOT/target/clients/linked_client
for f in "$LIB" "$RT" "$LN" target/fake/libcuda.so.1 target/fake/libnvidia-ml.so.1; do
    [ -e "$f" ] || { echo "libvgpu.test: $f missing (run make build)"; echo "0 passed, 1 failed"; exit 1; }
done
export LD_LIBRARY_PATH=$ROOT/target/fake
W=$(mktemp -d /tmp/vgpu-libvgpu-test.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }

GiB=1073741824; MiB=1048576
UUID0=GPU-fa4ec0de-0000-4000-8000-000000000000
UUID1=GPU-fa4ec0de-0000-4000-8000-000000000001

# Each case gets fresh fake-device state and a fresh ledger prefix.
n=0
fresh() {
    n=$((n + 1))
    export FAKE_CUDA_STATE_DIR=$W/fake$n CACHE=$W/cache$n
    mkdir -p "$FAKE_CUDA_STATE_DIR"
    export FAKE_CUDA_CONTEXT_BYTES=0 FAKE_CUDA_DEVICES=1
    unset FAKE_CUDA_MODULE_BYTES
}
# vg CLIENT ARGS...: the client under the library with a 1 GiB quota (override with env before the call).
vg() { LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-1g} "$@"; }
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p"; }   # field KEY < lines
opline() { grep "^op=$1 " | sed -n "${2:-1}p"; }  # opline OP [Nth]

# --- the quota is the GPU's size, through both clients ------------------------------------------------
fresh
for c in "$RT" "$LN"; do
    out=$(vg "$c" info 2>&1)
    check "$(basename "$c"): cuMemGetInfo total and cuDeviceTotalMem are the quota" \
        test "$(echo "$out" | opline info | field total)/$(echo "$out" | opline info | field devtotal)" = "$GiB/$GiB"
    check "$(basename "$c"): free is the quota when nothing is allocated" test "$(echo "$out" | opline info | field free)" = "$GiB"
done

# --- NVML through dlsym (as nvidia-smi resolves it) -----------------------------------------------------
cat > "$W/nvml_probe.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return 2;
    int (*init)(void) = dlsym(h, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(void *, mem_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*info2)(void *, mem2_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    void *d; mem_t m; mem2_t m2 = {.version = (unsigned)(sizeof(mem2_t) | (2u << 24))};
    if (init() || byidx(0, &d)) return 3;
    int r = info(d, &m), r2 = info2 ? info2(d, &m2) : -1;
    printf("nvml total=%llu free=%llu used=%llu rc=%d total2=%llu free2=%llu used2=%llu rc2=%d\n",
           m.total, m.free, m.used, r, m2.total, m2.free, m2.used, r2);
    return 0;
}
C
gcc -O1 -o "$W/nvml_probe" "$W/nvml_probe.c" -ldl
fresh
(sleep 4 | vg "$RT" alloc 256m wait >"$W/holder.out" 2>/dev/null) &   # holds 256 MiB for 4 s
for _ in $(seq 100); do grep -q ready "$W/holder.out" 2>/dev/null && break; sleep 0.1; done
out=$(vg "$W/nvml_probe" 2>&1 | grep '^nvml')
wait
check "NVML memory info: total = quota, used = container usage" \
    test "$(echo "$out" | field total)/$(echo "$out" | field used)/$(echo "$out" | field free)" = "$GiB/$((256 * MiB))/$((768 * MiB))"
check "NVML memory info v2 likewise" test "$(echo "$out" | field total2)/$(echo "$out" | field used2)" = "$GiB/$((256 * MiB))"
fresh
out=$(LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT_0=512m "$W/nvml_probe")
check "NVML with a per-index limit (NVML index 0, no CUDA call)" test "$(echo "$out" | field total)" = "$((512 * MiB))"
out=$(FAKE_CUDA_STATE_DIR=$W/nolimit "$W/nvml_probe"); out2=$(LD_PRELOAD=$LIB FAKE_CUDA_STATE_DIR=$W/nolimit "$W/nvml_probe")
check "NVML without a limit is the driver's answer" test "$out" = "$out2"

# --- every allocation kind stops exactly at the quota with CUDA_ERROR_OUT_OF_MEMORY, and is refunded ------
# 1 GiB quota, contexts cost nothing on this fake run: four 256 MiB objects fit, the fifth is refused.
kinds=("alloc 256m" "managed 256m" "pitch 1m 256" "array 4096 16384" "array3d 1024 1024 64" "async 256m" "pool 256m"
       "vmm 256m")
for k in "${kinds[@]}"; do
    for c in "$RT" "$LN"; do
        fresh
        read -r op _ <<<"$k"
        # shellcheck disable=SC2086
        out=$(vg "$c" $k $k $k $k $k info free-all sync trim info 2>/dev/null)
        codes=$(echo "$out" | grep "^op=$op " | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' ')
        f1=$(echo "$out" | opline info 1 | field free); f2=$(echo "$out" | opline info 2 | field free)
        check "$(basename "$c") $op: 4 fit, the 5th is OOM, full refund after free ($codes free $f1 -> $f2)" \
            test "$codes/$f1/$f2" = "0 0 0 0 2 /0/$GiB"
    done
done

# graph memory: each test graph allocates and frees inside itself, so its reservation is reused by the next
# launch; the reservation is charged, a launch that would grow it past the quota is refused, trim refunds.
for c in "$RT" "$LN"; do
    fresh
    out=$(vg "$c" graph 256m graph 256m info alloc 512m graph 768m graph 512m info free-all trim info 2>/dev/null)
    codes=$(echo "$out" | grep "^op=graph " | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' ')
    f=$(echo "$out" | grep '^op=info' | field free | tr '\n' ' ')
    check "$(basename "$c") graph: reservation charged, over-quota launch OOM, trim refunds ($codes/ $f)" \
        test "$codes/$f" = "0 0 2 0 /$((768 * MiB)) 0 $GiB "
done

# mipmapped arrays and modules are charged and refunded
fresh
out=$(vg "$RT" mipmap 1024 1024 3 info free-all info 2>/dev/null)
f1=$(echo "$out" | opline info 1 | field free); f2=$(echo "$out" | opline info 2 | field free)
check "mipmapped array charged ($f1) and refunded ($f2)" test "$f1" -lt "$GiB" -a "$f2" = "$GiB"
fresh
out=$(FAKE_CUDA_MODULE_BYTES=64m vg "$RT" module info free-all info 2>/dev/null)
check "module memory charged (measured) and refunded" \
    test "$(echo "$out" | opline info 1 | field free)/$(echo "$out" | opline info 2 | field free)" = "$((960 * MiB))/$GiB"
fresh
out=$(FAKE_CUDA_CONTEXT_BYTES=128m vg "$RT" info 2>/dev/null)
check "context memory charged (measured through NVML)" test "$(echo "$out" | opline info | field free)" = "$((896 * MiB))"
fresh
out=$(FAKE_CUDA_CONTEXT_BYTES=3g LIMIT=8g FAKE_CUDA_DEVICES=16Gi vg "$RT" info 2>/dev/null)
check "a context above the old 2 GiB ceiling is charged in full" test "$(echo "$out" | opline info | field free)" = "$((5 * GiB))"
# without NVML (NVIDIA_DRIVER_CAPABILITIES=compute): the driver measures contexts (the first one by what the
# device holds after it, the next through the first) instead of charging nothing
fresh
mkdir -p "$W/nonvml" && ln -sf "$ROOT/target/fake/libcuda.so.1" "$W/nonvml/libcuda.so.1"
out=$(FAKE_CUDA_CONTEXT_BYTES=128m LD_LIBRARY_PATH=$W/nonvml vg "$RT" info ctx info 2>/dev/null | grep '^op=info' | field free | tr '\n' ' ')
check "without NVML contexts are measured with the driver ($out)" test "$out" = "$((896 * MiB)) $((768 * MiB)) "
# cuLibraryLoadData (CUDA 12 context-independent loading) is measured like a module
fresh
out=$(FAKE_CUDA_MODULE_BYTES=64m vg "$RT" library info free-all info 2>/dev/null)
check "library memory charged (measured) and refunded" \
    test "$(echo "$out" | opline info 1 | field free)/$(echo "$out" | opline info 2 | field free)" = "$((960 * MiB))/$GiB"
# cuCtxSetLimit: heap and FIFO growth charged, a shrink refunded, past the quota refused; stack = per thread
# x 132 SMs x 2048 threads
fresh
out=$(vg "$RT" limit heap 264m info limit printf 33m info limit heap 8m info limit heap 2g info 2>/dev/null)
f=$(echo "$out" | grep '^op=info' | field free | tr '\n' ' ')
check "cuCtxSetLimit heap/printf charged and refunded ($f)" \
    test "$f" = "$((768 * MiB)) $((736 * MiB)) $((992 * MiB)) $((992 * MiB)) "
check "cuCtxSetLimit past the quota is CUDA_ERROR_OUT_OF_MEMORY" test "$(echo "$out" | opline limit 4 | field rc)" = 2
fresh
out=$(vg "$RT" limit stack 2048 info free-all limit stack 1024 info 2>/dev/null | grep '^op=info' | field free | tr '\n' ' ')
check "cuCtxSetLimit stack charged per resident thread and refunded ($out)" \
    test "$out" = "$((GiB - 1024 * 132 * 2048)) $GiB "

# primary context reset frees everything the context held; cuCtxCreate/cuCtxDestroy likewise
fresh
out=$(FAKE_CUDA_CONTEXT_BYTES=64m vg "$RT" alloc 256m array 1024 1024 info reset info 2>/dev/null | grep '^op=info' | field free | tr '\n' ' ')
check "cuDevicePrimaryCtxReset refunds the context and its memory ($out)" test "$out" = "$((700 * MiB)) $((960 * MiB)) "
cat > "$W/ctx.c" <<'C'
#include <cuda.h>
#include <stdio.h>
int main(void) {
    CUdevice d; CUcontext c; CUdeviceptr p; size_t f1 = 0, f2 = 0, t;
    if (cuInit(0) || cuDeviceGet(&d, 0)) return 2;
    CUresult r1 = cuCtxCreate(&c, 0, d);
    CUresult r2 = cuMemAlloc(&p, 128 << 20);
    cuMemGetInfo(&f1, &t);
    CUresult r3 = cuCtxDestroy(c);
    cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
    cuMemGetInfo(&f2, &t);
    printf("ctx rc=%d/%d/%d during=%zu after=%zu\n", r1, r2, r3, f1, f2);
    return 0;
}
C
gcc -O1 -I"$ROOT/.deps/cuda/include" -o "$W/ctx" "$W/ctx.c" -L"$ROOT/target/fake" -lcuda
fresh
out=$(FAKE_CUDA_CONTEXT_BYTES=64m vg "$W/ctx" 2>/dev/null)
check "cuCtxCreate charged (measured), cuCtxDestroy refunds it and its allocations ($out)" \
    test "$(echo "$out" | field during)/$(echo "$out" | field after)" = "$((832 * MiB))/$((960 * MiB))"

# stream-ordered: small allocations from 32 MiB pool chunks never push the charge past the quota
fresh
out=$(LIMIT=100m vg "$RT" async 1m async 1m async 1m async 40m async 40m async 40m info 2>/dev/null)
check "async pool chunks stay within the quota (last is OOM)" \
    test "$(echo "$out" | grep '^op=async ' | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' ')" = "0 0 0 0 0 2 "

# A stream-ordered free still pending on its stream when cuMemGetInfo came (issue 47's soak): the query
# reconciled the pools and cleared their "freed since" flag while the reservation still held the freed
# memory; the synchronisation that let the driver shrink it then reconciled nothing, and the 32 MiB chunk
# stayed charged after the process held nothing (every mode of the soak, 52 of 1000 runs).
cat > "$W/pending.c" <<'C'
#include <cuda.h>
#include <stdio.h>
static const char *ptx = ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry k()\n{\n\tret;\n}\n";
int main(void) {
    CUdevice d; CUcontext c; CUmodule m; CUfunction k; CUstream s; CUdeviceptr p;
    size_t f0 = 0, f1 = 0, f2 = 0, t;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) return 2;
    if (cuStreamCreate(&s, 0) || cuModuleLoadData(&m, ptx) || cuModuleGetFunction(&k, m, "k")) return 2;
    cuMemGetInfo(&f0, &t);
    cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL); /* the free below waits behind it */
    CUresult r1 = cuMemAllocAsync(&p, 5 << 20, s);
    CUresult r2 = cuMemFreeAsync(p, s);
    cuMemGetInfo(&f1, &t);                                 /* before the stream reaches the free */
    CUresult r3 = cuStreamSynchronize(s);
    cuMemGetInfo(&f2, &t);
    printf("pending rc=%d/%d/%d before=%zu during=%zu after=%zu\n", r1, r2, r3, f0, f1, f2);
    return 0;
}
C
gcc -O1 -I"$ROOT/.deps/cuda/include" -o "$W/pending" "$W/pending.c" -L"$ROOT/target/fake" -lcuda
fresh
out=$(FAKE_CUDA_KERNEL_US=100000 vg "$W/pending" 2>/dev/null)
check "a stream-ordered free pending when cuMemGetInfo asks is refunded at the synchronisation ($out)" \
    test "$(echo "$out" | field after)" = "$(echo "$out" | field before)"

# a pool destroyed while its allocations live keeps its memory until they are freed: so does the charge
fresh
out=$(LIMIT=1g vg "$RT" pool 600m pool-destroy pool 600m pool-destroy free-all sync pool 600m 2>/dev/null)
check "a destroyed pool's live allocations stay charged until freed (create/alloc/destroy rounds)" \
    test "$(echo "$out" | grep '^op=pool ' | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' ')" = "0 2 0 "

# VMM: physical memory lives until its last reference is gone and it is unmapped: so does the charge
rcs() { grep "^op=$1 " | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' '; }
fresh
out=$(LIMIT=768m vg "$RT" vmm 512m vmm-release vmm 512m vmm-release vmm 512m vmm-release 2>/dev/null)
check "a VMM handle released while still mapped stays charged (map+release rounds)" \
    test "$(echo "$out" | rcs vmm)" = "0 2 2 "
fresh
out=$(LIMIT=768m vg "$RT" vmm 512m vmm-retain vmm 512m 2>/dev/null)
check "retaining a mapped handle and releasing that reference refunds nothing" \
    test "$(echo "$out" | rcs vmm)/$(echo "$out" | rcs vmm-retain)" = "0 2 /0 "
fresh
out=$(LIMIT=768m vg "$RT" vmm 512m vmm-release free-all vmm 512m 2>/dev/null)
check "unmapping a released handle gives its memory back" test "$(echo "$out" | rcs vmm)" = "0 0 "

# stream-ordered memory is charged to the stream's device, whichever context is current
fresh; export FAKE_CUDA_DEVICES=2
out=$(CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=512m vg "$RT" device 1 current 0 async 600m 2>/dev/null)
check "an allocation on device 1's stream with device 0 current is held to device 1's quota" \
    test "$(echo "$out" | rcs async)" = "2 "
export FAKE_CUDA_DEVICES=1

# graph memory: a chain of alloc/free pairs needs one pair's memory at a time, not the sum
fresh
out=$(LIMIT=1g vg "$RT" graph-chain 4 400m 2>/dev/null)
check "four sequential 400 MiB graph alloc/free pairs run under a 1 GiB quota (needed 416 MiB)" \
    test "$(echo "$out" | rcs graph-chain)/$(echo "$out" | opline graph-chain | field graph_reserved)" = "0 /$((416 * MiB))"
out=$(LIMIT=1g vg "$RT" graph-chain 2 1100m 2>/dev/null)
check "a graph whose single step does not fit is still refused" test "$(echo "$out" | rcs graph-chain)" = "2 "

# the driver grows a context's stack on its own when a kernel needs more: charged at the next sync
fresh
out=$(FAKE_CUDA_KERNEL_STACK=2048 vg "$RT" module launch 1 sync info 2>/dev/null)
check "stack the driver grew for a kernel (1 KiB more per resident thread: 264 MiB) is charged" \
    test "$(echo "$out" | opline info | field free)" = "$((1024 * MiB - 2 * MiB - 264 * MiB))"
# issue 23 item 3: a kernel whose stack growth does not fit is refused before the launch (no compute share:
# the launch hooks are handed out for the memory quota alone); the old library let the driver grow it
# (15 KiB more per resident thread: 3,960 MiB under 1 GiB) and charged it after the fact
fresh
out=$(FAKE_CUDA_KERNEL_STACK=16384 vg "$RT" module launch 1 sync info 2>/dev/null)
check "a launch whose stack growth (3,960 MiB) does not fit a 1 GiB quota is refused with out-of-memory" \
    test "$(echo "$out" | rcs launch)" = "2 "
check "  ... and the device holds nothing of it (used = the quota's free view)" \
    test "$(echo "$out" | opline info | field free)" = "$((1024 * MiB - 2 * MiB))"
# ... and a CUkernel launched as the CUDA runtime launches it, whose local size only cuKernelGetAttribute
# gives (the check that asked cuFuncGetAttribute alone let it through on an H100: 4,489 MiB under 1 GiB)
fresh
out=$(FAKE_CUDA_KERNEL_STACK=16384 vg "$RT" library library-launchable info launch 1 sync info 2>/dev/null)
check "  ... a CUkernel's growth is refused too, and the device holds nothing of it" \
    test "$(echo "$out" | rcs launch)/$(echo "$out" | opline info 2 | field free)" = "2 /$(echo "$out" | opline info 1 | field free)"
# ... and launched while no context is current, where only its stream names the device whose size it has
# (the check asked the current context's device, found none, and let the driver grow 3,960 MiB past 1 GiB)
fresh
out=$(FAKE_CUDA_KERNEL_STACK=16384 vg "$RT" library library-launchable info launch-nocur info 2>/dev/null)
check "  ... a CUkernel launched with no context current is refused too, and the device holds nothing of it" \
    test "$(echo "$out" | rcs launch-nocur)/$(echo "$out" | opline info 2 | field free)" = "2 /$(echo "$out" | opline info 1 | field free)"
# ... on the legacy default stream with no context current there is no context to grow: the driver refuses
# such a launch, and so does the library, with the driver's own error
fresh
bare=$(FAKE_CUDA_KERNEL_STACK=16384 "$RT" library library-launchable launch-nocur-default 2>/dev/null | rcs launch-nocur-default)
out=$(FAKE_CUDA_KERNEL_STACK=16384 vg "$RT" library library-launchable info launch-nocur-default info 2>/dev/null)
check "  ... on the default stream with no context current: the driver's refusal (rc $bare), nothing grown" \
    test "$(echo "$out" | rcs launch-nocur-default)/$(echo "$out" | opline info 2 | field free)" = "$bare/$(echo "$out" | opline info 1 | field free)"
fresh
out=$(FAKE_CUDA_KERNEL_STACK=2048 vg "$RT" module launch 1 info 2>/dev/null)
check "  ... one that fits is charged before the launch, no sync needed (264 MiB; the runtime's way)" \
    test "$(echo "$out" | rcs launch)/$(echo "$out" | opline info | field free)" = "0 /$((1024 * MiB - 2 * MiB - 264 * MiB))"

# --- the quota's edges ---------------------------------------------------------------------------------
fresh
out=$(vg "$RT" free-bogus 2>/dev/null | opline free-bogus); base=$("$RT" free-bogus 2>/dev/null | opline free-bogus)
check "freeing an untracked pointer passes through (driver's own answer)" test "$out" = "$base"
out=$(vg "$RT" memgetinfo-null 2>/dev/null | opline memgetinfo-null)
check "cuMemGetInfo(NULL, NULL) is CUDA_ERROR_INVALID_VALUE, no crash" test "$(echo "$out" | field rc)" = 1
fresh
out=$(CLIENT_PTDS=1 vg "$RT" async 512m async 512m async 1m 2>/dev/null | grep '^op=async' | sed 's/.* rc=\([0-9]*\).*/\1/' | tr '\n' ' ')
check "per-thread-stream (_ptsz) entry points are hooked too" test "$out" = "0 0 2 "

# --- several processes share one quota ---------------------------------------------------------------------
# (each context costs 64 MiB here, measured while the others allocate: 4 x 64 MiB + the data = the quota)
fresh
# (a process whose context no longer fits is refused at context creation)
for i in 1 2 3 4; do (sleep 4 | FAKE_CUDA_CONTEXT_BYTES=64m vg "$RT" info sleep 1 fill 16m wait >"$W/p$i.out" 2>"$W/p$i.err") & done
wait
total=0; ctxs=0
for i in 1 2 3 4; do
    total=$((total + $(opline fill <"$W/p$i.out" | field bytes)))
    grep -q "refused .*(Context)" "$W/p$i.err" || ctxs=$((ctxs + 1))
done
check "4 processes filling at once get exactly the quota together ($total + $ctxs contexts)" \
    test "$((total + ctxs * 64 * MiB))" = "$GiB"
out=$(vg "$LN" info 2>/dev/null | opline info | field free)
check "all of it is back once they exit" test "$out" = "$GiB"

# threads of one process: 8 threads fill at once, then free and refill many times
cat > "$W/threads.c" <<'C'
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#define T 8
static CUcontext ctx;
static pthread_barrier_t bar;
static unsigned long long got[T];
static int bad;
static void *run(void *arg) {
    long t = (long)arg;
    CUdeviceptr p[64];
    cuCtxSetCurrent(ctx);
    for (int round = 0; round < 20; round++) {
        int n = 0;
        pthread_barrier_wait(&bar);
        while (n < 64 && cuMemAlloc(&p[n], 8 << 20) == CUDA_SUCCESS) n++;
        if (round == 19) got[t] = (unsigned long long)n << 23;
        pthread_barrier_wait(&bar);
        for (int i = 0; i < n; i++) if (cuMemFree(p[i]) != CUDA_SUCCESS) bad = 1;
    }
    return NULL;
}
int main(void) {
    CUdevice d; pthread_t th[T]; size_t fr, to;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&ctx, d)) return 2;
    pthread_barrier_init(&bar, NULL, T);
    for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, run, (void *)t);
    unsigned long long sum = 0;
    for (int t = 0; t < T; t++) { pthread_join(th[t], NULL); sum += got[t]; }
    cuCtxSetCurrent(ctx);
    cuMemGetInfo(&fr, &to);
    printf("threads sum=%llu free=%zu total=%zu bad=%d\n", sum, fr, to, bad);
    return 0;
}
C
gcc -O1 -pthread -I"$ROOT/.deps/cuda/include" -o "$W/threads" "$W/threads.c" -L"$ROOT/target/fake" -lcuda
fresh
out=$(vg "$W/threads" 2>/dev/null)
check "8 threads filling at once share the quota exactly, 20 rounds, all refunded ($out)" \
    test "$(echo "$out" | field sum)/$(echo "$out" | field free)/$(echo "$out" | field bad)" = "$GiB/$GiB/0"

# a SIGKILLed process's usage is reclaimed
fresh
(sleep 30 | vg "$RT" alloc 768m wait >"$W/k.out" 2>/dev/null) &
for _ in $(seq 50); do grep -q ready "$W/k.out" 2>/dev/null && break; sleep 0.1; done
during=$(vg "$RT" info 2>/dev/null | opline info | field free)
kill -KILL "$(opline init <"$W/k.out" | field pid)"   # the client's own pid, from its first line
sleep 0.3
after=$(vg "$RT" info 2>/dev/null | opline info | field free)
check "SIGKILLed holder: free $during while alive, $after after" test "$during/$after" = "$((256 * MiB))/$GiB"
wait 2>/dev/null

# fork: the child gets its own slot; the parent's usage stays the parent's
fresh
out=$(vg "$RT" alloc 256m fork alloc 256m info 2>/dev/null)
check "fork child charges its own slot (sees parent + own usage)" test "$(echo "$out" | opline info | field free)" = "$((512 * MiB))"
check "fork child and parent both exit cleanly" test "$(echo "$out" | opline fork 2 | field child_status)" = 0
out=$(vg "$RT" info 2>/dev/null | opline info | field free)
check "after both exit the ledger is empty" test "$out" = "$GiB"

# An application that closes every descriptor from 3 up (daemon-style cleanup) and reuses the numbers for its
# own pipes keeps its slot: another process's refused allocation does not reclaim its live usage, its own
# refused allocation takes nothing from live processes, and no pipe of it is closed (nor in a fork child).
fresh
(sleep 8 | vg "$RT" alloc 256m wait >"$W/cf-b.out" 2>/dev/null) &        # another live process: 256 MiB
for _ in $(seq 100); do grep -q ready "$W/cf-b.out" 2>/dev/null && break; sleep 0.1; done
(sleep 3 | vg "$RT" alloc 512m closefds wait alloc 1g pipes fork pipes >"$W/cf.out" 2>/dev/null) &
cf=$!
for _ in $(seq 100); do grep -q ready "$W/cf.out" 2>/dev/null && break; sleep 0.1; done
third=$(vg "$RT" alloc 512m 2>/dev/null | opline alloc | field rc)
check "closefds: the live process's 512 MiB stay charged (another 512 MiB is refused: rc=$third)" test "$third" = 2
wait "$cf"
own=$(opline alloc 2 <"$W/cf.out" | field rc)
check "closefds: the process's own refused allocation reclaims nothing live (rc=$own)" test "$own" = 2
free=$(vg "$RT" info 2>/dev/null | opline info | field free)
check "closefds: the other live process's 256 MiB stay charged (free $free)" test "$free" = "$((768 * MiB))"
check "closefds: the application's pipes still work ($(opline pipes <"$W/cf.out"))" \
    test "$(opline pipes <"$W/cf.out" | field bad)" = 0
check "closefds: the fork child's pipes still work ($(opline pipes 2 <"$W/cf.out"))" \
    test "$(opline pipes 2 <"$W/cf.out" | field bad)" = 0
wait 2>/dev/null

# --- configuration ------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES reorder: a limits file names each physical GPU by UUID; wherever it appears, its quota
# follows it
fresh; export FAKE_CUDA_DEVICES=2
mkdir -p "$W/state$n/ledgers"
cat >"$W/state$n/limits.json" <<J
{"version":1,"container_id":"t$n","devices":[{"index":0,"uuid":"$UUID1","memory_limit":$((512 * MiB)),"ledger":"ledgers/$UUID1.ledger"},
 {"index":1,"uuid":"$UUID0","memory_limit":$GiB,"ledger":"ledgers/$UUID0.ledger"}]}
J
for cvd in "0,1" "1,0"; do
    out=$(CUDA_VISIBLE_DEVICES=$cvd VGPU_LIMITS_FILE=$W/state$n/limits.json LD_PRELOAD=$LIB "$RT" device 0 info device 1 info 2>/dev/null)
    t0=$(echo "$out" | opline info 1 | field total); u0=$(echo "$out" | opline info 1 | field uuid)
    t1=$(echo "$out" | opline info 2 | field total); u1=$(echo "$out" | opline info 2 | field uuid)
    lim=$([ "$u0" = "$UUID1" ] && echo "$t0/$t1" || echo "$t1/$t0")
    check "CUDA_VISIBLE_DEVICES=$cvd: the quota follows GPU $UUID1 ($lim)" test "$lim" = "$((512 * MiB))/$GiB"
done
# a GPU the limits file does not list is refused, never unlimited (the listed one still works)
fresh; export FAKE_CUDA_DEVICES=2; mkdir -p "$W/state$n/ledgers"
cat >"$W/state$n/limits.json" <<J
{"version":1,"container_id":"t$n","devices":[{"index":0,"uuid":"$UUID1","memory_limit":$((512 * MiB)),"ledger":"ledgers/$UUID1.ledger"}]}
J
VGPU_LIMITS_FILE=$W/state$n/limits.json LD_PRELOAD=$LIB "$RT" device 1 info device 0 info >"$W/o" 2>"$W/e"
check "a GPU missing from limits.json: CUDA_ERROR_NOT_INITIALIZED on it ($(opline device 2 <"$W/o" | field rc)/$(opline info 2 <"$W/o" | field rc)), the listed one keeps its quota" \
    test "$(opline info 1 <"$W/o" | field total)/$(opline device 2 <"$W/o" | field rc)/$(opline info 2 <"$W/o" | field rc)" = "$((512 * MiB))/3/3"
check "a GPU missing from limits.json: one line naming it" test "$(wc -l <"$W/e")/$(grep -c "$UUID0" "$W/e")" = "1/1"
# per-index env limits follow the GPU: index i is the GPU NVML (and the container) sees as i, as in HAMi-core
for cvd in "0,1" "1,0"; do
    out=$(CUDA_VISIBLE_DEVICES=$cvd LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT_0=2g \
          CUDA_DEVICE_MEMORY_LIMIT_1=3g "$RT" device 0 info device 1 info 2>/dev/null)
    got=$(for i in 1 2; do l=$(echo "$out" | opline info $i); echo "$(echo "$l" | field uuid)=$(echo "$l" | field total)"; done | sort | tr '\n' ' ')
    check "CUDA_VISIBLE_DEVICES=$cvd: CUDA_DEVICE_MEMORY_LIMIT_<i> stays on NVML GPU i ($got)" \
        test "$got" = "$UUID0=$((2 * GiB)) $UUID1=$((3 * GiB)) "
done
export FAKE_CUDA_DEVICES=1

# a MIG instance (CUDA reports its MIG- UUID) is charged to its GPU's quota, never unlimited
fresh; mkdir -p "$W/state$n/ledgers"
cat >"$W/state$n/limits.json" <<J
{"version":1,"container_id":"t$n","devices":[{"index":0,"uuid":"$UUID0","memory_limit":$((512 * MiB)),"ledger":"ledgers/$UUID0.ledger"}]}
J
out=$(FAKE_CUDA_MIG=0 VGPU_LIMITS_FILE=$W/state$n/limits.json LD_PRELOAD=$LIB "$RT" info alloc 400m alloc 400m 2>/dev/null)
check "MIG instance: the GPU's quota applies ($(echo "$out" | opline info | field total), 2nd alloc rc $(echo "$out" | opline alloc 2 | field rc))" \
    test "$(echo "$out" | opline info | field total)/$(echo "$out" | opline alloc 2 | field rc)" = "$((512 * MiB))/2"

# an NVML-only query never initialises CUDA (per-index limits included): a later CUDA_VISIBLE_DEVICES still counts
cat > "$W/nvml_then_cuda.c" <<'C'
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
typedef struct { unsigned long long total, free, used; } mem_t;
int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = dlsym(h, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(void *, mem_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
    void *d; mem_t m0 = {0}, m1 = {0};
    if (init() || byidx(0, &d) || info(d, &m0) || byidx(1, &d) || info(d, &m1)) return 3;
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    int n = -1;
    CUresult r = cuInit(0);
    cuDeviceGetCount(&n);
    printf("nvml total0=%llu total1=%llu rc=%d count=%d\n", m0.total, m1.total, r, n);
    return 0;
}
C
gcc -O1 -I"$ROOT/.deps/cuda/include" -o "$W/nvml_then_cuda" "$W/nvml_then_cuda.c" -L"$ROOT/target/fake" -lcuda -ldl
fresh
out=$(FAKE_CUDA_DEVICES=2 LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT_1=512m "$W/nvml_then_cuda")
check "NVML with per-index limits needs no CUDA: CUDA_VISIBLE_DEVICES set afterwards still applies ($out)" \
    test "$(echo "$out" | field total0)/$(echo "$out" | field total1)/$(echo "$out" | field count)" = "$((16 * GiB))/$((512 * MiB))/1"

# --- the measurement lock and the environment mode's ledger files ------------------------------------------
# a process stopped while holding the measurement lock delays a context creation by seconds, never forever.
# The lock is an OFD lock on the ledger's header bytes [0, 256) (ledger/src/region/format.rs); a POSIX
# record lock on that range conflicts with it, so lockf stands in for a stuck holder.
fresh
vg "$RT" info >/dev/null 2>&1
python3 - "$CACHE.$UUID0" >"$W/lockholder.out" <<'P' &
import fcntl, sys, time
f = open(sys.argv[1], "r+b"); fcntl.lockf(f, fcntl.LOCK_EX, 256, 0); print("locked", flush=True); time.sleep(30)
P
holder=$!
for _ in $(seq 50); do grep -q locked "$W/lockholder.out" 2>/dev/null && break; sleep 0.1; done
t0=$(date +%s)
out=$(FAKE_CUDA_CONTEXT_BYTES=64m LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=1g \
      timeout 20 "$RT" info 2>"$W/e" | opline info | field free)
t=$(($(date +%s) - t0)); kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
check "measurement lock held by a stuck process: the context is still created and charged ($out) within ${t}s" \
    test "$out/$((t < 12))" = "$((960 * MiB))/1"
check "measurement lock held: one warning line" test "$(grep -c 'measure' "$W/e")" = 1
# the measurement lock is a byte range of the ledger: no file of its own is made beside it
fresh
out=$(FAKE_CUDA_CONTEXT_BYTES=64m vg "$RT" ctx info 2>/dev/null | opline info | field free)
check "contexts measured under the lock ($out); nothing but the ledger beside it ($(ls "$W" | grep -c "^cache$n"))" \
    test "$out/$(ls "$W" | grep -c "^cache$n")" = "$((896 * MiB))/1"
# environment mode: a ledger that is a symlink, or owned by another non-root user, is refused
fresh
vg "$RT" info >/dev/null 2>&1; mv "$CACHE.$UUID0" "$W/moved.ledger"; ln -s "$W/moved.ledger" "$CACHE.$UUID0"
vg "$RT" info >"$W/o" 2>"$W/e"
check "environment mode: a symlinked ledger is refused (cuInit rc $(opline init <"$W/o" | field rc), $(wc -l <"$W/e") line)" \
    test "$(opline init <"$W/o" | field rc)/$(wc -l <"$W/e")" = "3/1"
if [ "$(id -u)" = 0 ]; then
    fresh
    vg "$RT" info >/dev/null 2>&1; chown 65534 "$CACHE.$UUID0"
    vg "$RT" info >"$W/o" 2>"$W/e"
    check "environment mode: a ledger owned by another user is refused (cuInit rc $(opline init <"$W/o" | field rc), $(wc -l <"$W/e") line)" \
        test "$(opline init <"$W/o" | field rc)/$(wc -l <"$W/e")" = "3/1"
fi

# a failure at first use is retried: cuInit fails while the ledger cannot be created, then succeeds
cat > "$W/retry.c" <<'C'
#include <cuda.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    CUresult r1 = cuInit(0);
    mkdir(argv[1], 0755);
    usleep(300000);
    CUresult r2 = cuInit(0);
    CUdevice d; size_t t = 0;
    cuDeviceGet(&d, 0);
    CUresult r3 = cuDeviceTotalMem(&t, d);
    printf("retry rc1=%d rc2=%d rc3=%d total=%zu\n", r1, r2, r3, t);
    return 0;
}
C
gcc -O1 -I"$ROOT/.deps/cuda/include" -o "$W/retry" "$W/retry.c" -L"$ROOT/target/fake" -lcuda
fresh
out=$(LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/later$n/cache CUDA_DEVICE_MEMORY_LIMIT=1g "$W/retry" "$W/later$n" 2>/dev/null)
check "a failed first use is retried, not cached forever ($out)" \
    test "$(echo "$out" | field rc1)/$(echo "$out" | field rc2)/$(echo "$out" | field rc3)/$(echo "$out" | field total)" = "3/0/0/$GiB"

# the limits file wins over the environment
fresh; mkdir -p "$W/state$n"
cat >"$W/state$n/limits.json" <<J
{"version":1,"container_id":"t$n","devices":[{"index":0,"uuid":"$UUID0","memory_limit":$((512 * MiB)),"ledger":"ledgers/$UUID0.ledger"}]}
J
mkdir -p "$W/state$n/ledgers"
out=$(VGPU_LIMITS_FILE=$W/state$n/limits.json vg "$RT" info 2>/dev/null | opline info | field total)
check "limits.json (512 MiB) wins over CUDA_DEVICE_MEMORY_LIMIT=1g" test "$out" = "$((512 * MiB))"

# bad configuration: one line on stderr, CUDA refuses to start
fresh
echo '{"version":1,"devices":[' >"$W/corrupt.json"
VGPU_LIMITS_FILE=$W/corrupt.json LD_PRELOAD=$LIB "$RT" info >"$W/o" 2>"$W/e"
check "corrupt limits file: cuInit fails ($(opline init <"$W/o" | field err))" grep -q "^op=init.* rc=3 " "$W/o"
check "corrupt limits file: exactly one line naming the file" test "$(wc -l <"$W/e")/$(grep -c corrupt.json "$W/e")" = "1/1"
LIMIT=lots vg "$RT" info >"$W/o" 2>"$W/e"
check "bad CUDA_DEVICE_MEMORY_LIMIT: cuInit fails" grep -q "^op=init.* rc=3 " "$W/o"
check "bad CUDA_DEVICE_MEMORY_LIMIT: one line naming the variable" test "$(wc -l <"$W/e")/$(grep -c 'CUDA_DEVICE_MEMORY_LIMIT="lots"' "$W/e")" = "1/1"

# --- no limit: identical to the bare driver; nothing on stdout; non-CUDA programs untouched -----------------
ops="info alloc 64m pitch 1000 10 async 4m pool 4m vmm 4m graph 64m array 100 100 free-bogus free-all trim info"
fresh; bare=$("$RT" $ops 2>&1 | sed 's/pid=[0-9]*//; s/ptr=[0-9a-fx]*//')
fresh; pre=$(LD_PRELOAD=$LIB "$RT" $ops 2>&1 | sed 's/pid=[0-9]*//; s/ptr=[0-9a-fx]*//')
check "no limit: output identical to the bare fake driver" test "$bare" = "$pre"
fresh
out=$(LIBCUDA_LOG_LEVEL=4 vg "$RT" info fill 256m 2>/dev/null | grep -vc '^op=\|^fatal')
check "the library writes nothing to stdout (log level 4)" test "$out" = 0
fresh
LD_PRELOAD=$LIB LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE /bin/true 2>"$W/e"
check "/bin/true under the preload: exit 0, no output, no ledger created" \
    test "$?/$(wc -c <"$W/e")/$(ls "$CACHE"* 2>/dev/null | wc -l)" = "0/0/0"
check "ls output unchanged under the preload" test "$(LD_PRELOAD=$LIB ls /)" = "$(ls /)"

# RTLD_NEXT keeps its meaning for another interposer preloaded after us (a plain dlsym wrapper would make
# "next" mean "after libvgpu", find the other interposer's own getpid and recurse forever)
cat > "$W/next.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/types.h>
static int calls;
pid_t getpid(void) {
    pid_t (*real)(void) = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
    if (++calls > 1) return -1;
    pid_t p = real ? real() : -2;
    calls--;
    return p;
}
C
cat > "$W/pid.c" <<'C'
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("pid=%d\n", (int)getpid()); return 0; }
C
gcc -shared -fPIC -o "$W/libnext.so" "$W/next.c" -ldl && gcc -o "$W/pid" "$W/pid.c"
out=$(LD_PRELOAD="$LIB $W/libnext.so" "$W/pid" | field pid)
check "dlsym(RTLD_NEXT) from another interposer still finds the next object (pid=$out)" test "$out" -gt 0

# A second interposer preloaded after us whose cuMemAlloc_v2 forwards through dlsym(RTLD_NEXT, ...) must be
# handed our hook, not the driver's function: allocations through it stop at the quota.
cat > "$W/other.c" <<'C'
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
int other_calls;
static CUresult (*next)(CUdeviceptr *, size_t);
#ifdef EARLY
/* resolved while the process starts, before any CUDA call (the engine is not loaded yet) */
__attribute__((constructor)) static void early(void) {
    next = (CUresult (*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
}
#endif
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!next) next = (CUresult (*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    other_calls++;
    return next ? next(p, n) : CUDA_ERROR_NOT_FOUND;
}
C
cat > "$W/viaother.c" <<'C'
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    CUdevice d; CUcontext c; CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    CUresult (*alloc)(CUdeviceptr *, size_t) = h ? (CUresult (*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2") : 0;
    int *calls = h ? (int *)dlsym(h, "other_calls") : 0;
    if (!alloc || !calls) return 3;
    printf("viaother rc=");
    for (int i = 0; i < 4; i++) printf("%d%s", alloc(&p, 512u << 20), i < 3 ? "," : "");
    printf(" calls=%d\n", *calls);
    return 0;
}
C
gcc -shared -fPIC -I"$ROOT/.deps/cuda/include" -o "$W/libother.so" "$W/other.c" -ldl &&
    gcc -shared -fPIC -DEARLY -I"$ROOT/.deps/cuda/include" -o "$W/libearly.so" "$W/other.c" -ldl &&
    gcc -O1 -I"$ROOT/.deps/cuda/include" -o "$W/viaother" "$W/viaother.c" -L"$ROOT/target/fake" -lcuda -ldl
for o in other early; do
    fresh
    out=$(LD_PRELOAD="$LIB $W/lib$o.so" CUDA_DEVICE_MEMORY_SHARED_CACHE=$CACHE CUDA_DEVICE_MEMORY_LIMIT=1g \
          "$W/viaother" "$W/lib$o.so" 2>/dev/null)
    check "another interposer's dlsym(RTLD_NEXT, cuMemAlloc_v2) ($o) gets the hook: 2 x 512 MiB fit, then OOM ($out)" \
        test "$(echo "$out" | field rc)/$(echo "$out" | field calls)" = "0,0,2,2/4"
done

# --- the shipped binary ---------------------------------------------------------------------------------------
# (the shipped interposer is two files: the preload front libvgpu.so and the engine libvgpu_core.so)
CORE=$(dirname "$LIB")/libvgpu_core.so
for f in "$LIB" "$CORE"; do
    [ -e "$f" ] || { bad "$f missing"; continue; }
    b=$(basename "$f")
    newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    check "$b needs no glibc newer than 2.17 (newest: $newest)" \
        test "$(printf '%s\n' "$newest" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17
    extra=$(nm -D --defined-only "$f" | awk '{print $3}' | grep -v '^\(cu[A-Za-z0-9_]*\|nvml[A-Za-z0-9_]*\|dlsym\|vgpu_dlsym_route\)$' | tr '\n' ' ')
    check "$b exports only hook symbols (extra: '${extra}')" test -z "$extra"
done
# Every process of a container loads the front: it must have no constructor at all. (The engine is loaded
# only by CUDA processes; its only initialisers are Rust's runtime bookkeeping, no work of ours.)
inits=$(readelf -d "$LIB" | grep -c '(INIT\|(INIT_ARRAY\|(PREINIT_ARRAY')
check "libvgpu.so has no constructor (INIT / INIT_ARRAY entries: $inits)" test "$inits" = 0

echo "libvgpu: $pass passed, $fail failed"
((fail == 0))
