/* The compute share's test client: the ways a program may launch work, each in a loop, so a test can read
 * which of them the share holds back. Linked with -lcuda (the fake driver, or the real one on a GPU).
 *   compute_client MODE SECONDS [ARG]
 * Every mode launches a spin kernel (`vgpu_spin`: CLIENT_KERNEL_MS of clock64 cycles on a GPU; in the fake
 * driver FAKE_CUDA_KERNEL_US) for SECONDS of wall time, synchronising every 16 launches, and prints one line
 * "mode=M launched=N seconds=S unit_ms=U share=P rc=R err=NAME": U is one launch's own GPU time (timed with
 * events before the loop), P = N x U / S in percent.
 *   plain      cuLaunchKernel on a stream of the current context
 *   noctx      the same with no context current (the launch runs in its stream's context)
 *   kernel     a CUkernel of cuLibraryGetKernel, no context current
 *   otherctx   a function and stream of context A while context B (same device) is current
 *   ex         cuLaunchKernelEx, no context current
 *   coop       cuLaunchCooperativeKernel, no context current
 *   multi      cuLaunchCooperativeKernelMultiDevice, one entry
 *   graph      a graph of one kernel node, launched with no context current
 *   memset     cuMemsetD8Async of ARG MiB (default 64) on the stream
 *   memcpy     cuMemcpyDtoDAsync of ARG MiB (default 64) on the stream
 *   batch      cuMemcpyBatchAsync of ARG MiB (default 64) as 4 copies on the stream
 *   batch3d    cuMemcpy3DBatchAsync of ARG MiB (default 64) as 4 pointer-to-pointer copies on the stream
 *   memset32   the unversioned 32-bit-pointer cuMemsetD8 (CUDA 2.x's, from cuGetProcAddress at version 2000)
 *              of ARG MiB (default 64) on memory mapped below 4 GiB (cuMemAddressReserve at 1 GiB)
 *   memcpy32   the unversioned cuMemcpyDtoD the same way
 *   cheap      one launch of the kernel at 1x, then the loop at ARGx (default 10) the work: same function
 *              and grid, longer arguments (on the fake, the block's height)
 *   short      ARG launches (default 40) queued at once, then cuCtxSynchronize and exit (SECONDS unused)
 *   fork       ARG launches (default 16) queued, then a fork whose child sleeps SECONDS and exits (its exit
 *              handlers run), then the parent synchronises and exits
 *   forksync   ARG launches (default 16) queued and synchronised, then a fork whose child synchronises the
 *              stream too (an error in a child: its CUDA is the parent's), sleeps SECONDS and exits
 *   gap        plain launches each followed by ARG us (default 3 x the kernel's time) of host work: a loop
 *              bound by its launch rate, the GPU idle when the next launch comes
 *   pairs      as gap, but the launches alternate a long one (7 kernels' time: on the fake the block's height)
 *              and a short one, each followed by ARG us of host work: a loop the GPU keeps nearly up with,
 *              each launch finding at most the one before it still running (torch.compile's matmul and
 *              the Triton kernel after it)
 *   firstcheap as gap, but after each synchronisation (every 16 launches) the first launch is short (the
 *              kernel at 1x) and the other 15 long (30x the work: same function and grid, on the fake the
 *              block's height): a program that makes the launches the share always times cheap
 *   steps      16 launches, then cuStreamSynchronize, then ARG us (default 0) of sleep, in a loop: also prints
 *              "step_us=MEDIAN", how long a step (launches and synchronisation) took: its kernels' time,
 *              and whatever time the GPU waited for the CPU
 *   poll       as steps, but waits for each step by polling cuStreamQuery (no synchronisation), then
 *              sleeps ARG us: an application that polls and launches again long after
 *   frames     a paced frame loop: each frame queues a burst of plain launches and sleeps until the next, no
 *              query, no synchronisation; ARG PERIOD_US[:BURST[:DEAR]] (10000:4); with DEAR, each launch
 *              after a frame's first runs DEAR times as long (same kernel and grid); prints frames= late=
 *   tick       one launch and a synchronisation every ARG ms (default 500) for SECONDS: a process that is
 *              busy by NVML's per-process reading (it had SM activity in the last second) and uses
 *              next to nothing of the GPU
 *   capture    a launch on stream B, then a global-mode capture of stream A with a launch, a launch on B
 *              meanwhile, and the end of the capture: rc is the capture's (SECONDS unused)
 *   capgroup   8 launches queued on the stream (the share groups those deep in the queue under one end event),
 *              then a relaxed-mode capture of the stream begun, a second stream queried (the share's query
 *              hook closes open groups) and the capture ended (its graph dropped), in a loop, synchronised
 *              every 32 launches: a tenant that makes the share record a group's end into its capture,
 *              where the end is never timed
 *   streams    a multi-stream pipeline: each round queues N launches on each of K streams (one on each in
 *              turn), then cuCtxSynchronize; ARG K:N[:serial] (4:16); with serial each stream's launches
 *              wait for the previous stream's (cuStreamWaitEvent), so the streams run one after another
 *   reset      ARG phases (default 4) of SECONDS / ARG each, launching in batches of 16 synchronised; each
 *              phase ends with its context torn down, leaving launches in flight: the even ones run in
 *              the primary context and end with cuDevicePrimaryCtxReset (what cudaDeviceReset does;
 *              the primary context is then retained again), the odd ones in a context of cuCtxCreate
 *              that cuCtxDestroy ends. Also prints "phase_ms=A,B,..." (the wall time of each phase's
 *              first 64 launches, synchronised: the cost of a launch after a reset against before)
 * CLIENT_DELAY_US=PERIOD:SPIN (any mode): a SIGALRM every PERIOD us whose handler spins SPIN us, so the
 * launching thread is held up at random points, inside the interposer and the driver's calls too: a
 * tenant that delays its own thread around its launches to make them read short */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spin_ptx.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static CUcontext ctx;
static CUstream stream;
static CUfunction fn;
static CUkernel kern;
static unsigned long long cycles, cycles_x;
static unsigned mult = 1;
static CUdeviceptr buf_a, buf_b;
static size_t bytes;
/* The unversioned 32-bit-pointer entry points (memset32, memcpy32). */
static CUresult (*memset_v1)(unsigned, unsigned char, unsigned);
static CUresult (*memcpy_v1)(unsigned, unsigned, unsigned);

#define TRY(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) return r_; } while (0)

/* One launch of the loop's kind; `x`: the long variant (cheap mode). */
static CUresult launch_one(const char *mode, CUgraphExec ex, int x) {
    unsigned long long c = x ? cycles_x : cycles;
    void *args[] = {&c};
    unsigned by = x ? mult : 1;
    if (!strcmp(mode, "kernel"))
        return cuLaunchKernel((CUfunction)kern, 1, 1, 1, 32, by, 1, 0, stream, args, NULL);
    if (!strcmp(mode, "ex")) {
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 32; cfg.blockDimY = by; cfg.blockDimZ = 1;
        cfg.hStream = stream;
        return cuLaunchKernelEx(&cfg, fn, args, NULL);
    }
    if (!strcmp(mode, "coop")) return cuLaunchCooperativeKernel(fn, 1, 1, 1, 32, by, 1, 0, stream, args);
    if (!strcmp(mode, "multi")) {
        CUDA_LAUNCH_PARAMS p;
        memset(&p, 0, sizeof p);
        p.function = fn;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32; p.blockDimY = by; p.blockDimZ = 1;
        p.hStream = stream;
        p.kernelParams = args;
        return cuLaunchCooperativeKernelMultiDevice(&p, 1, 0);
    }
    if (!strcmp(mode, "graph")) return cuGraphLaunch(ex, stream);
    if (!strcmp(mode, "memset")) return cuMemsetD8Async(buf_a, 7, bytes, stream);
    if (!strcmp(mode, "memcpy")) return cuMemcpyDtoDAsync(buf_b, buf_a, bytes, stream);
    if (!strcmp(mode, "memset32")) return memset_v1((unsigned)buf_a, 7, (unsigned)bytes);
    if (!strcmp(mode, "memcpy32")) return memcpy_v1((unsigned)buf_b, (unsigned)buf_a, (unsigned)bytes);
    if (!strcmp(mode, "batch")) {
        size_t q = bytes / 4, sizes[4] = {q, q, q, q};
        CUdeviceptr dsts[4], srcs[4];
        CUmemcpyAttributes attr;
        size_t idx = 0;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        for (int i = 0; i < 4; i++) dsts[i] = buf_b + i * q, srcs[i] = buf_a + i * q;
#if CUDA_VERSION >= 13000
        return cuMemcpyBatchAsync(dsts, srcs, sizes, 4, &attr, &idx, 1, stream);
#else
        size_t fail = 0;
        return cuMemcpyBatchAsync(dsts, srcs, sizes, 4, &attr, &idx, 1, &fail, stream);
#endif
    }
    if (!strcmp(mode, "batch3d")) {
        size_t q = bytes / 4;
        CUDA_MEMCPY3D_BATCH_OP ops[4];
        memset(ops, 0, sizeof ops);
        for (int i = 0; i < 4; i++) {
            ops[i].src.type = ops[i].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
            ops[i].src.op.ptr.ptr = buf_a + i * q;
            ops[i].dst.op.ptr.ptr = buf_b + i * q;
            ops[i].extent.width = q;
            ops[i].extent.height = ops[i].extent.depth = 1;
            ops[i].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        }
#if CUDA_VERSION >= 13000
        return cuMemcpy3DBatchAsync(4, ops, 0, stream);
#else
        size_t fail = 0;
        return cuMemcpy3DBatchAsync(4, ops, &fail, 0, stream);
#endif
    }
    return cuLaunchKernel(fn, 1, 1, 1, 32, by, 1, 0, stream, args, NULL);
}

/* One launch's own time, by events around it (the context current). */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void CUDA_CB nothing(void *data) { (void)data; }

/* CLIENT_GATE=1: an empty host function first, as the compute share's gate (libvgpu compute/gate.rs).
 * CLIENT_SAMPLES=N: the median of N such pairs, each on the idle stream (default 1). */
static CUresult unit_ms(const char *mode, CUgraphExec ex, int x, float *ms) {
    CUevent a, b;
    TRY(cuEventCreate(&a, 0));
    TRY(cuEventCreate(&b, 0));
    int n = getenv("CLIENT_SAMPLES") ? atoi(getenv("CLIENT_SAMPLES")) : 1;
    int gate = getenv("CLIENT_GATE") && !strcmp(getenv("CLIENT_GATE"), "1");
    if (n < 1) n = 1;
    double *got = calloc((size_t)n, sizeof *got);
    if (!got) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        float one;
        if (gate) TRY(cuLaunchHostFunc(stream, nothing, NULL));
        TRY(cuEventRecord(a, stream));
        TRY(launch_one(mode, ex, x));
        TRY(cuEventRecord(b, stream));
        TRY(cuEventSynchronize(b));
        TRY(cuEventElapsedTime(&one, a, b));
        got[i] = one;
    }
    qsort(got, (size_t)n, sizeof got[0], cmp_double);
    *ms = (float)got[n / 2];
    free(got);
    cuEventDestroy(a);
    cuEventDestroy(b);
    return CUDA_SUCCESS;
}

static CUresult run(const char *mode, double secs, const char *arg, long *launched, double *took, float *unit) {
    CUdevice dev;
    CUmodule mod;
    CUlibrary lib;
    int khz = 0;
    TRY(cuInit(0));
    TRY(cuDeviceGet(&dev, 0));
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
    TRY(cuCtxSetCurrent(ctx));
    if (cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) != CUDA_SUCCESS || khz <= 0) khz = 1500000;
    double ms = getenv("CLIENT_KERNEL_MS") ? atof(getenv("CLIENT_KERNEL_MS")) : 2.0;
    cycles = (unsigned long long)(ms * khz);
    TRY(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    TRY(cuModuleLoadData(&mod, ptx));
    TRY(cuModuleGetFunction(&fn, mod, "vgpu_spin"));
    if (!strcmp(mode, "kernel")) {
        TRY(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
        TRY(cuLibraryGetKernel(&kern, lib, "vgpu_spin"));
    }
    if (!strcmp(mode, "memset") || !strcmp(mode, "memcpy") || !strncmp(mode, "batch", 5)) {
        bytes = (size_t)(arg ? atof(arg) : 64) * (1 << 20);
        TRY(cuMemAlloc(&buf_a, bytes));
        TRY(cuMemAlloc(&buf_b, bytes));
    }
    if (!strcmp(mode, "memset32") || !strcmp(mode, "memcpy32")) {
        /* Device memory at 1 GiB of the address space, where 32-bit pointers reach. */
        CUmemAllocationProp prop;
        CUmemAccessDesc acc;
        CUmemGenericAllocationHandle h;
        size_t gran = 0, size;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        TRY(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        bytes = (size_t)(arg ? atof(arg) : 64) * (1 << 20);
        size = (2 * bytes + gran - 1) / gran * gran;
        TRY(cuMemAddressReserve(&buf_a, size, 0, (CUdeviceptr)1 << 30, 0));
        if (buf_a + size > ((CUdeviceptr)1 << 32)) return CUDA_ERROR_NOT_SUPPORTED;
        TRY(cuMemCreate(&h, size, &prop, 0));
        TRY(cuMemMap(buf_a, size, 0, h, 0));
        memset(&acc, 0, sizeof acc);
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        TRY(cuMemSetAccess(buf_a, size, &acc, 1));
        buf_b = buf_a + bytes;
        TRY(cuGetProcAddress("cuMemsetD8", (void **)&memset_v1, 2000, CU_GET_PROC_ADDRESS_DEFAULT, NULL));
        TRY(cuGetProcAddress("cuMemcpyDtoD", (void **)&memcpy_v1, 2000, CU_GET_PROC_ADDRESS_DEFAULT, NULL));
    }
    mult = !strcmp(mode, "cheap") ? (arg ? (unsigned)atoi(arg) : 10) : !strcmp(mode, "pairs") ? 7 : !strcmp(mode, "firstcheap") ? 30 : 1;
    cycles_x = cycles * mult;
    CUgraphExec ex = NULL;
    if (!strcmp(mode, "graph")) {
        CUgraph g;
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS kp;
        void *args[] = {&cycles};
        memset(&kp, 0, sizeof kp);
        kp.func = fn;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = 32; kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = args;
        TRY(cuGraphCreate(&g, 0));
        TRY(cuGraphAddKernelNode(&node, g, NULL, 0, &kp));
        TRY(cuGraphInstantiateWithFlags(&ex, g, 0));
    }
    int x = !strcmp(mode, "cheap");
    /* cheap: the one short launch first (its own time is what the loop's key first learns) */
    if (x) { float u; TRY(unit_ms(mode, ex, 0, &u)); }
    TRY(unit_ms(mode, ex, x, unit));
    if (!strcmp(mode, "short")) {
        long n = arg ? atol(arg) : 40;
        double t0 = now();
        for (*launched = 0; *launched < n; (*launched)++) TRY(launch_one(mode, ex, 0));
        TRY(cuCtxSynchronize());
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "fork")) {
        long n = arg ? atol(arg) : 16;
        double t0 = now();
        for (*launched = 0; *launched < n; (*launched)++) TRY(launch_one("plain", ex, 0));
        pid_t child = fork();
        if (child == 0) {
            usleep((useconds_t)(secs * 1e6));
            exit(0);
        }
        if (child > 0) waitpid(child, NULL, 0);
        TRY(cuCtxSynchronize());
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "forksync")) {
        long n = arg ? atol(arg) : 16;
        double t0 = now();
        for (*launched = 0; *launched < n; (*launched)++) TRY(launch_one("plain", ex, 0));
        TRY(cuStreamSynchronize(stream));
        pid_t child = fork();
        if (child == 0) {
            cuStreamSynchronize(stream);
            usleep((useconds_t)(secs * 1e6));
            exit(0);
        }
        if (child > 0) waitpid(child, NULL, 0);
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "capture")) {
        CUstream a;
        CUgraph g;
        TRY(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
        TRY(launch_one("plain", ex, 0));
        TRY(cuStreamBeginCapture(a, CU_STREAM_CAPTURE_MODE_GLOBAL));
        void *args[] = {&cycles};
        CUresult r = cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, a, args, NULL);
        if (r == CUDA_SUCCESS) r = launch_one("plain", ex, 0);
        CUresult e = cuStreamEndCapture(a, &g);
        *launched = 3;
        *took = 0;
        TRY(r);
        return e;
    }
    if (!strcmp(mode, "capgroup")) {
        CUstream b;
        TRY(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
        /* Launches the share measured first: its estimate of one launch is then the kernel's time. */
        for (int i = 0; i < 256; i++) {
            TRY(launch_one("plain", ex, 0));
            if (i % 4 == 3) TRY(cuStreamSynchronize(stream));
        }
        double t0 = now();
        for (*launched = 0; now() - t0 < secs;) {
            for (int i = 0; i < 8; i++, (*launched)++) TRY(launch_one("plain", ex, 0));
            CUgraph g;
            TRY(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
            CUresult q = cuStreamQuery(b);
            CUresult e = cuStreamEndCapture(stream, &g);
            if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) return q;
            TRY(e);
            TRY(cuGraphDestroy(g));
            if (*launched % 32 == 0) TRY(cuStreamSynchronize(stream));
        }
        TRY(cuStreamSynchronize(stream));
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "tick")) {
        double t0 = now();
        for (*launched = 0; now() - t0 < secs; (*launched)++) {
            TRY(launch_one("plain", ex, 0));
            TRY(cuStreamSynchronize(stream));
            usleep((useconds_t)((arg ? atof(arg) : 500) * 1000));
        }
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "frames")) {
        /* A paced frame loop (issue 41, attack 4): each frame queues a burst of launches and sleeps until
           the next frame, with no query and no synchronisation. ARG: PERIOD_US[:BURST] (10000:4). A frame
           is late when its burst was queued after the frame's deadline. */
        double period = (arg ? atof(arg) : 10000) / 1e6;
        const char *colon = arg ? strchr(arg, ':') : NULL;
        int burst = colon ? atoi(colon + 1) : 4;
        const char *dear = colon ? strchr(colon + 1, ':') : NULL;
        if (dear) { mult = (unsigned)atoi(dear + 1); cycles_x = cycles * mult; }
        long frames = 0, late = 0;
        double t0 = now();
        for (*launched = 0; now() - t0 < secs; frames++) {
            double due = t0 + frames * period;
            for (int i = 0; i < burst; i++, (*launched)++) TRY(launch_one("plain", ex, dear && i > 0));
            if (now() > due + period) late++;
            double left = t0 + (frames + 1) * period - now();
            if (left > 0) usleep((useconds_t)(left * 1e6));
        }
        *took = now() - t0;
        TRY(cuStreamSynchronize(stream));
        printf("frames=%ld late=%ld\n", frames, late);
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "steps") || !strcmp(mode, "poll")) {
        static double step[100000];
        double t0 = now();
        long steps = 0;
        for (*launched = 0; now() - t0 < secs && steps < 100000; steps++) {
            double s0 = now();
            for (int i = 0; i < 16; i++, (*launched)++) TRY(launch_one("plain", ex, 0));
            if (mode[0] == 'p') {
                CUresult q;
                while ((q = cuStreamQuery(stream)) == CUDA_ERROR_NOT_READY) usleep(50);
                TRY(q);
            } else {
                TRY(cuStreamSynchronize(stream));
            }
            step[steps] = now() - s0;
            if (arg) usleep((useconds_t)atol(arg));
        }
        *took = now() - t0;
        qsort(step, steps, sizeof step[0], cmp_double);
        printf("step_us=%.0f\n", steps ? step[steps / 2] * 1e6 : 0.0);
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "streams")) {
        /* A multi-stream pipeline (issue 41, attack 3): each round queues N launches on each of K streams
           (interleaved: one on each in turn), then cuCtxSynchronize. ARG K:N[:serial] (4:16); with
           serial, each stream's launches wait for the stream before it (cuStreamWaitEvent on an event
           recorded after its last), so the streams run one after another. */
        int k = arg ? atoi(arg) : 4, n = 16, serial = 0;
        const char *c1 = arg ? strchr(arg, ':') : NULL;
        if (c1) { n = atoi(c1 + 1); serial = strstr(c1 + 1, ":serial") != NULL; }
        if (k < 1 || k > 16 || n < 1) return CUDA_ERROR_INVALID_VALUE;
        CUstream st[16];
        CUevent ev[16];
        void *args[] = {&cycles};
        for (int i = 0; i < k; i++) {
            TRY(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
            TRY(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
        }
        double t0 = now();
        for (*launched = 0; now() - t0 < secs;) {
            for (int j = 0; j < (serial ? k : n); j++)
                for (int i = 0; i < (serial ? n : k); i++, (*launched)++) {
                    CUstream s = st[serial ? j : i];
                    if (serial && i == 0 && j > 0) TRY(cuStreamWaitEvent(s, ev[j - 1], 0));
                    TRY(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
                    if (serial && i == n - 1) TRY(cuEventRecord(ev[j], s));
                }
            TRY(cuCtxSynchronize());
        }
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    if (!strcmp(mode, "reset")) {
        long phases = arg ? atol(arg) : 4;
        double t0 = now();
        *launched = 0;
        printf("phase_ms=");
        for (long p = 0; p < phases; p++) {
            CUcontext own = NULL;
            if (p % 2) {
#if CUDA_VERSION >= 13000
                TRY(cuCtxCreate(&own, NULL, 0, dev));
#else
                TRY(cuCtxCreate(&own, 0, dev));
#endif
            } else if (p > 0) {
                TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
                TRY(cuCtxSetCurrent(ctx));
            }
            if (p > 0) {
                /* The module and stream died with the context: made again in this phase's. */
                TRY(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
                TRY(cuModuleLoadData(&mod, ptx));
                TRY(cuModuleGetFunction(&fn, mod, "vgpu_spin"));
            }
            double p0 = now();
            for (long i = 0; i < 64; i++, (*launched)++) {
                TRY(launch_one("plain", ex, 0));
                if (i % 16 == 15) TRY(cuStreamSynchronize(stream));
            }
            printf("%s%.1f", p ? "," : "", (now() - p0) * 1e3);
            while (now() - t0 < secs * (p + 1) / phases) {
                for (int i = 0; i < 16; i++, (*launched)++) TRY(launch_one("plain", ex, 0));
                TRY(cuStreamSynchronize(stream));
            }
            /* Launches left in flight when the context goes. */
            for (int i = 0; i < 4; i++, (*launched)++) TRY(launch_one("plain", ex, 0));
            if (own) {
                TRY(cuCtxDestroy(own));
                TRY(cuCtxSetCurrent(NULL));
            } else {
                TRY(cuDevicePrimaryCtxReset(dev));
            }
        }
        printf("\n");
        *took = now() - t0;
        return CUDA_SUCCESS;
    }
    CUcontext other = NULL;
#if CUDA_VERSION >= 13000
    if (!strcmp(mode, "otherctx")) TRY(cuCtxCreate(&other, NULL, 0, dev));
#else
    if (!strcmp(mode, "otherctx")) TRY(cuCtxCreate(&other, 0, dev));
#endif
    else if (strcmp(mode, "plain") && strncmp(mode, "memset", 6) && strncmp(mode, "memcpy", 6) && strncmp(mode, "batch", 5) &&
             strcmp(mode, "cheap"))
        TRY(cuCtxSetCurrent(NULL));
    int pairs = !strcmp(mode, "pairs"), firstcheap = !strcmp(mode, "firstcheap");
    double gap = !strcmp(mode, "gap") || pairs || firstcheap ? (arg ? atof(arg) / 1e6 : 3 * *unit / 1e3) : 0;
    double t0 = now();
    for (*launched = 0; now() - t0 < secs;) {
        TRY(launch_one(mode, ex, pairs ? *launched % 2 == 0 : firstcheap ? *launched % 16 != 0 : x));
        for (double g0 = now(); gap > 0 && now() - g0 < gap;) {
        }
        if (++*launched % 16 == 0) TRY(cuStreamSynchronize(stream));
    }
    TRY(cuStreamSynchronize(stream));
    *took = now() - t0;
    return CUDA_SUCCESS;
}

static double delay_spin;

static void delayed(int sig) {
    (void)sig;
    for (double t0 = now(); now() - t0 < delay_spin;) {
    }
}

/* CLIENT_DELAY_US=PERIOD:SPIN: see the top. */
static void delay_thread(void) {
    const char *v = getenv("CLIENT_DELAY_US");
    double period, spin;
    if (!v || sscanf(v, "%lf:%lf", &period, &spin) != 2 || period <= 0) return;
    delay_spin = spin / 1e6;
    struct sigaction sa = {0};
    sa.sa_handler = delayed;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, (long)period}, {0, (long)period}};
    setitimer(ITIMER_REAL, &it, NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: compute_client MODE SECONDS [ARG]\n");
        return 2;
    }
    delay_thread();
    long launched = 0;
    double took = 0;
    float unit = 0;
    CUresult r = run(argv[1], atof(argv[2]), argc > 3 ? argv[3] : NULL, &launched, &took, &unit);
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("mode=%s launched=%ld seconds=%.3f unit_ms=%.3f share=%.1f rc=%d err=%s\n", argv[1], launched, took,
           unit, took > 0 ? launched * unit / 10.0 / took : 0.0, (int)r, name);
    return r == CUDA_SUCCESS ? 0 : 1;
}
