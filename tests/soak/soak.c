/* The soak's mixed program (issue 47): one seeded random sequence of what real programs do to a GPU, so that
 * a run that fails can be replayed with its seed.
 *   soak SEED [STEPS]
 * Each step is one of: launches of a spin kernel (vgpu_spin: SOAK_KERNEL_US of clock64 cycles on a GPU; on
 * the fake driver FAKE_CUDA_KERNEL_US) on a context's stream, the legacy or the per-thread default stream;
 * events (create, record, query, synchronise, elapsed time, destroy, or kept); streams (kept or destroyed,
 * waits between them); graphs (stream capture in the three modes, or explicit kernel nodes with a graph
 * memory alloc/free pair; instantiated, launched, destroyed or kept); stream-ordered memory (cuMemAllocAsync /
 * cuMemFreeAsync, pool trims); VMM (cuMemCreate, reserve, map, access; released in either order); plain and
 * managed allocations and their frees; cuMemGetInfo and NVML's memory info; threads launching on streams of
 * their own (and one reading the memory figures meanwhile); fork (the child exits at once or after a little
 * CUDA-free work, possibly with work in flight in the parent); contexts created (cuCtxCreate) and destroyed
 * with what they hold; the primary context retained and released, fully released and retained again, and
 * reset (cuDevicePrimaryCtxReset) with allocations, events, streams, graphs and a module in it, sometimes with
 * launches still in flight, then retained again as the CUDA runtime does after cudaDeviceReset.
 * At the end it frees everything it still holds, releases every context, and, when it can find its ledger
 * (SOAK_LEDGER, else CUDA_DEVICE_MEMORY_SHARED_CACHE + "." + the GPU's UUID), checks that its own slot holds
 * no charge before it exits: a charge left behind by a path the library lost track of shows there, before
 * the exit handler's refund could hide it.
 * Every CUDA error but an out-of-memory from an allocating call (a quota's answer, counted) is printed to
 * stderr with the seed, the step and the call, and the program exits 3; a leak exits 4, a fork child that
 * did not exit cleanly 5. Prints one closing line "soak seed=S steps=N ... ok" on success.
 * Environment: SOAK_STEPS (default 100), SOAK_KERNEL_US (GPU spin per kernel, default 50), SOAK_LEDGER,
 * SOAK_LEAK_CHECK=0 (skip the slot check), SOAK_VERBOSE=1 (each step on stderr). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../clients/spin_ptx.h"

static unsigned long long seed;
static int step_no = -1, verbose;
static const char *step_name = "init";
static long n_oom, n_launch, n_reset, n_ctx_created, n_ctx_destroyed, n_fork, n_threads, n_graph, n_reads;
static unsigned long long cycles;
static CUdevice dev;
static size_t vmm_gran;

/* ---- random numbers: splitmix64, one state per thread ---------------------------------------------- */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rng;
static unsigned rn(unsigned n) { return n ? (unsigned)(mix(&rng) % n) : 0; }

/* ---- errors ------------------------------------------------------------------------------------------ */
/* Returns 0 on success, 1 on an allowed out-of-memory (counted); any other error ends the program. */
static int ck(CUresult r, const char *what, int line, int oom_ok) {
    if (r == CUDA_SUCCESS) return 0;
    if (oom_ok && r == CUDA_ERROR_OUT_OF_MEMORY) {
        __atomic_add_fetch(&n_oom, 1, __ATOMIC_RELAXED);
        return 1;
    }
    const char *name = "?";
    cuGetErrorName(r, &name);
    fprintf(stderr, "soak: FAIL seed=%llu step=%d op=%s: %s = %d %s (soak.c:%d)\n", seed, step_no, step_name,
            what, (int)r, name, line);
    fflush(stderr);
    exit(3);
}
#define CK(x) ck((x), #x, __LINE__, 0)
#define CKO(x) ck((x), #x, __LINE__, 1)

/* ---- what the program holds, per context -------------------------------------------------------------- */
enum { A_PLAIN, A_MANAGED, A_ASYNC, A_VMM };
struct alloc {
    int kind;
    CUdeviceptr p;
    size_t n;
    CUmemGenericAllocationHandle h;
};
#define MAXA 32
#define MAXE 8
#define MAXS 4
#define MAXG 4
struct actx {
    int live, primary;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    struct alloc a[MAXA];
    int na;
    CUevent ev[MAXE];
    int nev;
    CUstream xs[MAXS];
    int nxs;
    CUgraph g[MAXG];
    CUgraphExec gx[MAXG];
    int ng;
};
/* C[0]: the primary context; C[1], C[2]: created ones. */
static struct actx C[3];
static int prim_refs; /* our retains of the primary context */

static void use(struct actx *c) { CK(cuCtxSetCurrent(c->ctx)); }

/* The stream a launch goes to: mostly the context's own, sometimes the legacy or the per-thread default. */
static CUstream pick_stream(struct actx *c) {
    unsigned k = rn(10);
    if (k == 0) return NULL;
    if (k == 1) return CU_STREAM_PER_THREAD;
    if (k == 2 && c->nxs) return c->xs[rn(c->nxs)];
    return c->s;
}

static void launch_n(CUfunction fn, CUstream s, int n) {
    if (!fn) return;
    for (int i = 0; i < n; i++) {
        unsigned long long cy = cycles;
        void *args[] = {&cy};
        CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    }
    __atomic_add_fetch(&n_launch, n, __ATOMIC_RELAXED);
}

/* A context's module, function and stream (the context current). */
static void ctx_setup(struct actx *c) {
    c->mod = NULL;
    c->fn = NULL;
    if (CKO(cuModuleLoadData(&c->mod, ptx)) == 0) CK(cuModuleGetFunction(&c->fn, c->mod, "vgpu_spin"));
    else c->mod = NULL;
    CK(cuStreamCreate(&c->s, rn(2) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT));
    c->live = 1;
}

/* Forget every handle of a context the driver destroyed (reset, cuCtxDestroy). */
static void ctx_forget(struct actx *c) {
    int primary = c->primary;
    memset(c, 0, sizeof *c);
    c->primary = primary;
}

static void free_alloc(struct actx *c, int i) {
    struct alloc a = c->a[i];
    c->a[i] = c->a[--c->na];
    /* A memset may still be queued on the context's stream: a correct program waits for it before memory
     * goes (an H200 faulted with CUDA_ERROR_ILLEGAL_ADDRESS, without the library too, when a VMM range was
     * unmapped under one; the stream-ordered free is ordered on the stream itself). */
    if (a.kind != A_ASYNC) CK(cuStreamSynchronize(c->s));
    switch (a.kind) {
    case A_PLAIN:
    case A_MANAGED:
        CK(cuMemFree(a.p));
        break;
    case A_ASYNC:
        CK(cuMemFreeAsync(a.p, c->s));
        if (rn(2)) CK(cuStreamSynchronize(c->s));
        break;
    case A_VMM:
        if (rn(2)) {
            CK(cuMemUnmap(a.p, a.n));
            CK(cuMemRelease(a.h));
        } else {
            CK(cuMemRelease(a.h)); /* released while mapped: freed at the unmap */
            CK(cuMemUnmap(a.p, a.n));
        }
        CK(cuMemAddressFree(a.p, a.n));
        break;
    }
}

/* Frees the allocations of the kinds a context's end does not take with it everywhere (stream-ordered and VMM
 * memory): what a careful program does before a reset. */
static void free_kind(struct actx *c, int kind) {
    for (int i = c->na - 1; i >= 0; i--)
        if (c->a[i].kind == kind) free_alloc(c, i);
}

/* Everything the context holds, freed and destroyed in order; then the context itself. */
static void ctx_teardown(struct actx *c) {
    use(c);
    CK(cuCtxSynchronize());
    while (c->na) free_alloc(c, rn(c->na));
    CK(cuCtxSynchronize());
    for (int i = 0; i < c->nev; i++) CK(cuEventDestroy(c->ev[i]));
    for (int i = 0; i < c->ng; i++) {
        CK(cuGraphExecDestroy(c->gx[i]));
        CK(cuGraphDestroy(c->g[i]));
    }
    for (int i = 0; i < c->nxs; i++) CK(cuStreamDestroy(c->xs[i]));
    CK(cuStreamDestroy(c->s));
    if (c->mod) CK(cuModuleUnload(c->mod));
    if (c->primary) {
        CK(cuCtxSetCurrent(NULL));
        while (prim_refs) {
            CK(cuDevicePrimaryCtxRelease(dev));
            prim_refs--;
        }
    } else {
        CK(cuCtxDestroy(c->ctx));
    }
    ctx_forget(c);
}

static void retain_primary(void) {
    struct actx *c = &C[0];
    CUcontext h;
    if (CKO(cuDevicePrimaryCtxRetain(&h, dev))) return;
    prim_refs++;
    if (!c->live) {
        c->ctx = h;
        c->primary = 1;
        use(c);
        ctx_setup(c);
    } else if (h != c->ctx) {
        fprintf(stderr, "soak: FAIL seed=%llu step=%d: cuDevicePrimaryCtxRetain gave %p, the primary is %p\n", seed,
                step_no, (void *)h, (void *)c->ctx);
        exit(3);
    }
}

/* A live context, chosen at random (the primary retained again when none is). */
static struct actx *pick_ctx(void) {
    int live[3], n = 0;
    for (int i = 0; i < 3; i++)
        if (C[i].live) live[n++] = i;
    if (!n) {
        retain_primary();
        if (!C[0].live) return NULL;
        return &C[0];
    }
    struct actx *c = &C[live[rn(n)]];
    use(c);
    return c;
}

static void push_alloc(struct actx *c, int kind, CUdeviceptr p, size_t n, CUmemGenericAllocationHandle h) {
    c->a[c->na++] = (struct alloc){.kind = kind, .p = p, .n = n, .h = h};
}

/* ---- NVML, through dlopen as nvidia-smi and pynvml reach it -------------------------------------------- */
typedef struct { unsigned long long total, free, used; } nvml_mem_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvml_proc_t;
static int (*nvml_info)(void *, nvml_mem_t *);
static int (*nvml_procs)(void *, unsigned *, nvml_proc_t *);
static void *nvml_dev;
static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_info = (int (*)(void *, nvml_mem_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvml_procs = (int (*)(void *, unsigned *, nvml_proc_t *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!init || !byidx || !nvml_info || init() || byidx(0, &nvml_dev)) nvml_info = NULL;
}

/* This process's memory on the device as the driver itself says (NVML's process list, which the library
 * does not change), -1 when NVML cannot say. */
static long long driver_own_used(void) {
    nvml_proc_t list[256];
    unsigned n = 256;
    if (!nvml_info || !nvml_procs || nvml_procs(nvml_dev, &n, list)) return -1;
    long long used = 0;
    for (unsigned k = 0; k < n; k++)
        if (list[k].pid == (unsigned)getpid()) used += (long long)list[k].used;
    return used;
}

/* The memory figures: cuMemGetInfo (a context current) and NVML's; both must be sane. */
static void read_figures(void) {
    size_t fr = 0, tot = 0;
    CK(cuMemGetInfo(&fr, &tot));
    if (fr > tot) {
        fprintf(stderr, "soak: FAIL seed=%llu step=%d: cuMemGetInfo free %zu > total %zu\n", seed, step_no, fr, tot);
        exit(3);
    }
    if (nvml_info) {
        nvml_mem_t m;
        int r = nvml_info(nvml_dev, &m);
        if (r != 0) {
            fprintf(stderr, "soak: FAIL seed=%llu step=%d: nvmlDeviceGetMemoryInfo = %d\n", seed, step_no, r);
            exit(3);
        }
    }
    __atomic_add_fetch(&n_reads, 1, __ATOMIC_RELAXED);
}

/* ---- steps ---------------------------------------------------------------------------------------------- */
static void op_launch(struct actx *c) {
    CUstream s = pick_stream(c);
    launch_n(c->fn, s, 1 + rn(32));
    switch (rn(4)) {
    case 0:
        CK(cuStreamSynchronize(s));
        break;
    case 1: {
        CUresult q;
        while ((q = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) usleep(100);
        CK(q);
        break;
    }
    default: /* left in flight */
        break;
    }
}

static void op_events(struct actx *c) {
    static const unsigned flags[] = {CU_EVENT_DEFAULT, CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING};
    CUevent a, b;
    unsigned fa = flags[rn(2)], fb = flags[rn(3)];
    CK(cuEventCreate(&a, fa));
    CK(cuEventCreate(&b, fb));
    CK(cuEventRecord(a, c->s));
    launch_n(c->fn, c->s, 1 + rn(8));
    CK(cuEventRecord(b, c->s));
    if (rn(2)) {
        CK(cuEventSynchronize(b));
    } else {
        CUresult q;
        while ((q = cuEventQuery(b)) == CUDA_ERROR_NOT_READY) usleep(100);
        CK(q);
    }
    if (!(fb & CU_EVENT_DISABLE_TIMING)) {
        float ms;
        CK(cuEventElapsedTime(&ms, a, b));
    }
    if (c->nxs && rn(2)) { /* another stream waits for it */
        CK(cuStreamWaitEvent(c->xs[rn(c->nxs)], b, 0));
    }
    CK(cuEventDestroy(a));
    if (c->nev < MAXE && rn(2)) {
        c->ev[c->nev++] = b; /* kept: recorded again later, or lost to a reset */
        if (rn(2)) CK(cuEventRecord(b, c->s));
    } else {
        CK(cuEventDestroy(b));
    }
}

static void op_streams(struct actx *c) {
    CUstream s;
    if (rn(2)) CK(cuStreamCreate(&s, rn(2) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT));
    else CK(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -(int)rn(2)));
    launch_n(c->fn, s, 1 + rn(8));
    if (c->nev && rn(2)) CK(cuStreamWaitEvent(c->s, c->ev[rn(c->nev)], 0));
    if (c->nxs < MAXS && rn(2)) {
        c->xs[c->nxs++] = s;
    } else {
        if (rn(2)) CK(cuStreamSynchronize(s));
        CK(cuStreamDestroy(s)); /* work still queued finishes on its own */
    }
}

static void keep_or_destroy_graph(struct actx *c, CUgraph g, CUgraphExec x) {
    if (c->ng < MAXG && rn(2)) {
        c->g[c->ng] = g;
        c->gx[c->ng++] = x;
    } else {
        CK(cuGraphExecDestroy(x));
        CK(cuGraphDestroy(g));
    }
}

static void op_graph_capture(struct actx *c) {
    static const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                                CU_STREAM_CAPTURE_MODE_RELAXED};
    if (!c->fn) return;
    CUstream cs;
    CUgraph g;
    CUgraphExec x;
    CK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    CK(cuStreamBeginCapture(cs, modes[rn(3)]));
    launch_n(c->fn, cs, 1 + rn(6));
    CK(cuStreamEndCapture(cs, &g));
    CK(cuGraphInstantiate(&x, g, 0));
    int m = 1 + rn(4);
    for (int i = 0; i < m; i++) CK(cuGraphLaunch(x, rn(2) ? c->s : cs));
    if (rn(2)) CK(cuStreamSynchronize(c->s));
    CK(cuStreamSynchronize(cs));
    CK(cuStreamDestroy(cs));
    keep_or_destroy_graph(c, g, x);
    n_graph++;
}

static void op_graph_explicit(struct actx *c) {
    if (!c->fn) return;
    CUgraph g;
    CUgraphExec x;
    CUgraphNode prev = NULL, node;
    CK(cuGraphCreate(&g, 0));
    int k = 1 + rn(5), memnode = rn(3) == 0;
    CUdeviceptr gp = 0;
    if (memnode) { /* graph memory: an alloc node first, its free node last */
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        prm.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prm.poolProps.location.id = dev;
        prm.bytesize = (size_t)(1 + rn(16)) << 20;
        CK(cuGraphAddMemAllocNode(&node, g, NULL, 0, &prm));
        gp = prm.dptr;
        prev = node;
    }
    for (int i = 0; i < k; i++) {
        unsigned long long cy = cycles;
        void *args[] = {&cy};
        CUDA_KERNEL_NODE_PARAMS kp;
        memset(&kp, 0, sizeof kp);
        kp.func = c->fn;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = 32;
        kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = args;
        CK(cuGraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &kp));
        prev = node;
    }
    if (memnode) CK(cuGraphAddMemFreeNode(&node, g, &prev, 1, gp));
    if (CKO(cuGraphInstantiate(&x, g, 0))) {
        CK(cuGraphDestroy(g));
        return;
    }
    int m = 1 + rn(3), oom = 0;
    for (int i = 0; i < m && !oom; i++) oom = CKO(cuGraphLaunch(x, c->s));
    CK(cuStreamSynchronize(c->s));
    if (memnode && rn(2)) CK(cuDeviceGraphMemTrim(dev));
    keep_or_destroy_graph(c, g, x);
    n_graph++;
}

static void op_pool(struct actx *c) {
    CUdeviceptr p;
    size_t n = (size_t)(1 + rn(48)) << 20;
    if (CKO(cuMemAllocAsync(&p, n, c->s))) return;
    if (rn(2)) CK(cuMemsetD8Async(p, 1, n, c->s));
    launch_n(c->fn, c->s, rn(4));
    if (c->na < MAXA && rn(2)) {
        push_alloc(c, A_ASYNC, p, n, 0);
    } else {
        CK(cuMemFreeAsync(p, c->s));
        if (rn(2)) CK(cuStreamSynchronize(c->s));
    }
    if (rn(4) == 0) {
        CUmemoryPool pool;
        CK(cuStreamSynchronize(c->s));
        CK(cuDeviceGetDefaultMemPool(&pool, dev));
        CK(cuMemPoolTrimTo(pool, 0));
    }
}

static void op_vmm(struct actx *c) {
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    if (!vmm_gran) CK(cuMemGetAllocationGranularity(&vmm_gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t n = vmm_gran * (1 + rn(16));
    if (CKO(cuMemCreate(&h, n, &prop, 0))) return;
    CK(cuMemAddressReserve(&va, n, 0, 0, 0));
    CK(cuMemMap(va, n, 0, h, 0));
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(va, n, &acc, 1));
    if (rn(2)) CK(cuMemsetD8Async(va, 2, n, c->s));
    push_alloc(c, A_VMM, va, n, h);
    if (c->na >= MAXA || rn(3) == 0) free_alloc(c, c->na - 1);
}

static void op_alloc(struct actx *c) {
    CUdeviceptr p;
    size_t n = rn(4) ? (size_t)(1 + rn(64)) << 16 : (size_t)(1 + rn(48)) << 20;
    int managed = rn(5) == 0;
    if (managed ? CKO(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL)) : CKO(cuMemAlloc(&p, n))) return;
    if (rn(2)) CK(cuMemsetD8Async(p, 3, n, c->s));
    push_alloc(c, managed ? A_MANAGED : A_PLAIN, p, n, 0);
    if (c->na >= MAXA) free_alloc(c, rn(c->na));
}

static void op_free(struct actx *c) {
    if (c->na) free_alloc(c, rn(c->na));
}

/* ---- threads --------------------------------------------------------------------------------------------- */
struct worker {
    pthread_t t;
    struct actx *c;
    uint64_t rng;
    int reader;
    volatile int *stop;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    CK(cuCtxSetCurrent(w->c->ctx));
    if (w->reader) { /* reads the memory figures (the ledger, under the library) while the others launch */
        while (!__atomic_load_n(w->stop, __ATOMIC_ACQUIRE)) read_figures();
        return NULL;
    }
    CUstream s;
    CUevent e;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&e, (mix(&w->rng) & 1) ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT));
    int rounds = 2 + (int)(mix(&w->rng) % 6);
    for (int r = 0; r < rounds; r++) {
        int use_ptds = mix(&w->rng) % 4 == 0;
        CUstream ls = use_ptds ? CU_STREAM_PER_THREAD : s;
        launch_n(w->c->fn, ls, 1 + (int)(mix(&w->rng) % 8));
        CK(cuEventRecord(e, ls));
        if (mix(&w->rng) & 1) {
            CUresult q;
            while ((q = cuEventQuery(e)) == CUDA_ERROR_NOT_READY) usleep(100);
            CK(q);
        } else {
            CK(cuEventSynchronize(e));
        }
        if (mix(&w->rng) % 3 == 0) {
            CUdeviceptr p;
            if (CKO(cuMemAlloc(&p, (size_t)(1 + mix(&w->rng) % 16) << 20)) == 0) CK(cuMemFree(p));
        }
    }
    CK(cuStreamSynchronize(s));
    CK(cuEventDestroy(e));
    CK(cuStreamDestroy(s));
    return NULL;
}

static void op_threads(struct actx *c) {
    struct worker w[5];
    volatile int stop = 0;
    int n = 2 + rn(3), reader = rn(2);
    for (int i = 0; i < n + reader; i++) {
        w[i] = (struct worker){.c = c, .rng = seed * 1000003u + step_no * 31u + i, .reader = i == n, .stop = &stop};
        if (pthread_create(&w[i].t, NULL, worker_main, &w[i])) {
            fprintf(stderr, "soak: FAIL seed=%llu step=%d: pthread_create\n", seed, step_no);
            exit(3);
        }
    }
    launch_n(c->fn, c->s, rn(8)); /* this thread too */
    for (int i = 0; i < n; i++) pthread_join(w[i].t, NULL);
    if (reader) {
        __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
        pthread_join(w[n].t, NULL);
    }
    n_threads += n + reader;
}

/* ---- fork ------------------------------------------------------------------------------------------------ */
static void op_fork(struct actx *c) {
    if (rn(2)) launch_n(c->fn, c->s, 1 + rn(16)); /* work in flight across the fork */
    int how = rn(3);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "soak: FAIL seed=%llu step=%d: fork\n", seed, step_no);
        exit(3);
    }
    if (pid == 0) {
        /* On a real driver a child that runs the exit handlers of the CUDA state it inherited dies in the
         * driver's own (SIGSEGV in 3 of 8 runs on an H200 without the library: CUDA does not support a
         * forked child using its parent's CUDA): there children leave with _exit, as Python's do. */
        if (how == 0 || getenv("SOAK_REAL_DRIVER")) _exit(0); /* at once, no exit handlers */
        volatile unsigned long x = 0;
        for (unsigned long i = 0; i < 200000ul * (1 + how); i++) x += i * i;
        if (how == 2) usleep(1000 + (useconds_t)(x % 3000));
        exit(0); /* exit handlers run (the library's among them) */
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "soak: FAIL seed=%llu step=%d: fork child (exit %s) ended with status 0x%x%s%s\n", seed,
                step_no, how == 0 ? "_exit" : "exit", st, WIFSIGNALED(st) ? ", signal " : "",
                WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "");
        exit(5);
    }
    n_fork++;
}

/* ---- contexts -------------------------------------------------------------------------------------------- */
static void op_ctx_create(void) {
    int i = !C[1].live ? 1 : !C[2].live ? 2 : 0;
    if (!i) return;
    CUcontext h;
    static const unsigned flags[] = {CU_CTX_SCHED_AUTO, CU_CTX_SCHED_SPIN, CU_CTX_SCHED_YIELD, CU_CTX_SCHED_BLOCKING_SYNC};
#if CUDA_VERSION >= 13000
    if (CKO(cuCtxCreate(&h, NULL, flags[rn(4)], dev))) return;
#else
    if (CKO(cuCtxCreate(&h, flags[rn(4)], dev))) return;
#endif
    C[i].ctx = h;
    C[i].primary = 0;
    use(&C[i]);
    ctx_setup(&C[i]);
    launch_n(C[i].fn, C[i].s, rn(8));
    n_ctx_created++;
}

static void op_ctx_destroy(void) {
    int i = C[1].live && C[2].live ? 1 + rn(2) : C[1].live ? 1 : C[2].live ? 2 : 0;
    if (!i) return;
    struct actx *c = &C[i];
    if (rn(2)) {
        ctx_teardown(c); /* everything freed first */
    } else { /* with its plain memory, events, streams, graphs and module still in it, maybe work in flight */
        use(c);
        free_kind(c, A_VMM);
        free_kind(c, A_ASYNC);
        launch_n(c->fn, c->s, rn(8));
        CK(cuCtxDestroy(c->ctx));
        ctx_forget(c);
    }
    n_ctx_destroyed++;
}

/* cuDevicePrimaryCtxReset with what the primary holds, then retained again as the CUDA runtime does after
 * cudaDeviceReset (or, one time in four, left until a later step needs it). */
static void op_reset(void) {
    struct actx *c = &C[0];
    if (!c->live) {
        retain_primary();
        return;
    }
    use(c);
    free_kind(c, A_VMM);
    free_kind(c, A_ASYNC);
    if (rn(2)) launch_n(c->fn, c->s, 1 + rn(16)); /* in flight at the reset */
    else CK(cuCtxSynchronize());
    CK(cuDevicePrimaryCtxReset(dev));
    ctx_forget(c);
    prim_refs = 0; /* the reset ends our retains */
    CK(cuCtxSetCurrent(NULL));
    n_reset++;
    if (rn(4)) {
        retain_primary();
        if (C[0].live) launch_n(C[0].fn, C[0].s, rn(8));
    }
}

static void op_primary(void) {
    struct actx *c = &C[0];
    if (!c->live) {
        retain_primary();
        return;
    }
    if (rn(2)) { /* a second retain and its release: the context lives on */
        retain_primary();
        if (prim_refs > 1) {
            CK(cuDevicePrimaryCtxRelease(dev));
            prim_refs--;
        }
    } else { /* released for good with everything freed, then (mostly) retained afresh */
        ctx_teardown(c);
        if (rn(3)) retain_primary();
    }
}

/* ---- the leak check: this process's own slot in its ledger ------------------------------------------------ */
static char ledger_path[4096];

static void find_ledger(void) {
    const char *p = getenv("SOAK_LEDGER"), *prefix = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (p) {
        snprintf(ledger_path, sizeof ledger_path, "%s", p);
        return;
    }
    if (!prefix) return;
    CUuuid u;
    if (cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS) return;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(ledger_path, sizeof ledger_path,
             "%s.GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* Format version 1 (ledger/src/region/format.rs): slots from byte 384, 256 bytes each; a slot's pid at 0,
 * its spilled bytes at 32, its eight (usage, applied) counter pairs from 64. Read with pread, never mapped. */
static int own_slot_charges(unsigned long long usage[9], int *slot) {
    static const char *kinds[] = {"context", "module", "data", "array", "async_pool", "vmm", "managed", "graph"};
    (void)kinds;
    int fd = open(ledger_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    unsigned char rec[256];
    *slot = -1;
    for (int i = 0; i < 1024; i++) {
        if (pread(fd, rec, sizeof rec, 384 + 256 * (off_t)i) != (ssize_t)sizeof rec) break;
        uint32_t pid;
        memcpy(&pid, rec, 4);
        if (pid != (uint32_t)getpid()) continue;
        *slot = i;
        for (int k = 0; k < 8; k++) memcpy(&usage[k], rec + 64 + 16 * k, 8);
        memcpy(&usage[8], rec + 32, 8);
        break;
    }
    close(fd);
    return *slot >= 0;
}

static void leak_check(void) {
    static const char *kinds[] = {"context", "module", "data", "array", "async_pool", "vmm", "managed", "graph",
                                  "spilled"};
    const char *e = getenv("SOAK_LEAK_CHECK");
    if ((e && !strcmp(e, "0")) || !ledger_path[0]) return;
    unsigned long long u[9] = {0};
    int slot;
    if (own_slot_charges(u, &slot) <= 0) return; /* no ledger, or no slot of ours (no quota on it) */
    unsigned long long sum = 0;
    for (int k = 0; k < 9; k++) sum += u[k];
    if (!sum) return;
    /* What the driver still holds for the process (graph memory stays reserved until cuDeviceGraphMemTrim) is
     * rightly charged; more than that is a charge left behind. */
    long long truth = driver_own_used();
    /* Beside memory the driver still holds for the process (its context's, which NVML can show after the last
     * release), module memory is charged by the truth-up (hooks/truth.rs) from NVML's figure, which moves in
     * 2 MiB steps and can fall after it was read: a few MiB above NVML there is that precision, not a charge
     * left behind (SOAK_TRUTH_SLACK_MIB, 16). With nothing held by the driver, any charge is a leak. */
    const char *sl = getenv("SOAK_TRUTH_SLACK_MIB");
    unsigned long long slack = truth > 0 ? (sl ? strtoull(sl, NULL, 10) : 16) << 20 : 0;
    int leak = truth < 0 || sum - u[8] > (unsigned long long)truth + slack || u[8];
    fprintf(stderr, "soak: %s seed=%llu: with every context released and nothing held, slot %d of %s still holds",
            leak ? "LEAK" : "note", seed, slot, ledger_path);
    for (int k = 0; k < 9; k++)
        if (u[k]) fprintf(stderr, " %s=%llu", kinds[k], u[k]);
    fprintf(stderr, "; the driver says the process uses %lld\n", truth);
    if (leak) exit(4);
}

/* ---- main ------------------------------------------------------------------------------------------------ */
int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: soak SEED [STEPS]\n");
        return 2;
    }
    seed = strtoull(argv[1], NULL, 0);
    rng = seed * 0x2545f4914f6cdd1dull + 1;
    int steps = argc > 2 ? atoi(argv[2]) : getenv("SOAK_STEPS") ? atoi(getenv("SOAK_STEPS")) : 100;
    verbose = getenv("SOAK_VERBOSE") && atoi(getenv("SOAK_VERBOSE"));
    int khz = 0;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    if (cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) != CUDA_SUCCESS || khz <= 0) khz = 1500000;
    double us = getenv("SOAK_KERNEL_US") ? atof(getenv("SOAK_KERNEL_US")) : 50;
    cycles = (unsigned long long)(us * khz / 1000);
    find_ledger();
    nvml_open();
    C[0].primary = 1;
    /* Under a quota the other processes fill, the first retain may be refused for a while: wait up to 10 s. */
    for (int tries = 0; !C[0].live && tries < 1000; tries++) {
        retain_primary();
        if (!C[0].live) usleep(10000);
    }
    if (!C[0].live) {
        fprintf(stderr, "soak: FAIL seed=%llu: the primary context could not be retained in 10 s (out of memory)\n", seed);
        return 3;
    }
    static const char *names[] = {"launch",  "launch",  "launch",     "events",     "events",   "streams",
                                  "capture", "graph",   "pool",       "vmm",        "alloc",    "alloc",
                                  "free",    "meminfo", "sync",       "threads",    "fork",     "ctx-create",
                                  "ctx-destroy", "reset", "primary"};
    const int nops = sizeof names / sizeof names[0];
    for (step_no = 0; step_no < steps; step_no++) {
        int op = rn(nops);
        step_name = names[op];
        if (verbose) fprintf(stderr, "soak: seed=%llu step=%d %s\n", seed, step_no, step_name);
        if (!strcmp(step_name, "ctx-create")) { op_ctx_create(); continue; }
        if (!strcmp(step_name, "ctx-destroy")) { op_ctx_destroy(); continue; }
        if (!strcmp(step_name, "reset")) { op_reset(); continue; }
        if (!strcmp(step_name, "primary")) { op_primary(); continue; }
        struct actx *c = pick_ctx();
        if (!c) continue; /* nothing could be retained (out of memory): try the next step */
        if (!strcmp(step_name, "launch")) op_launch(c);
        else if (!strcmp(step_name, "events")) op_events(c);
        else if (!strcmp(step_name, "streams")) op_streams(c);
        else if (!strcmp(step_name, "capture")) op_graph_capture(c);
        else if (!strcmp(step_name, "graph")) op_graph_explicit(c);
        else if (!strcmp(step_name, "pool")) op_pool(c);
        else if (!strcmp(step_name, "vmm")) op_vmm(c);
        else if (!strcmp(step_name, "alloc")) op_alloc(c);
        else if (!strcmp(step_name, "free")) op_free(c);
        else if (!strcmp(step_name, "meminfo")) read_figures();
        else if (!strcmp(step_name, "sync")) CK(rn(2) ? cuCtxSynchronize() : cuStreamSynchronize(c->s));
        else if (!strcmp(step_name, "threads")) op_threads(c);
        else if (!strcmp(step_name, "fork")) op_fork(c);
    }
    step_name = "teardown";
    for (int i = 2; i >= 0; i--)
        if (C[i].live) ctx_teardown(&C[i]);
    leak_check();
    printf("soak seed=%llu steps=%d launches=%ld graphs=%ld threads=%ld forks=%ld ctx_created=%ld ctx_destroyed=%ld "
           "resets=%ld reads=%ld oom=%ld ok\n",
           seed, steps, n_launch, n_graph, n_threads, n_fork, n_ctx_created, n_ctx_destroyed, n_reset, n_reads, n_oom);
    return 0;
}
