/* A tenant that adapts to the compute share (issue 41, attack 1, and the host-timing one): each launch is of a
 * kernel whose work is fixed after the launch returns. The kernel (one thread) spins until a host-mapped flag
 * is set, or for at most LONG_US; the host times its own cuLaunchKernel call, and where the call was slow (the
 * library recorded events around it: a timed launch) sets the flag at once, so the timed launch runs short;
 * where it was fast (untimed) it lets the kernel run LONG_US first. Each kernel writes when it started and
 * ended (%globaltimer) into host-mapped memory, so the GPU time it used is known whatever the library charged.
 *   seal_probe SECONDS [LONG_US]
 * prints "launched=N seconds=S gpu_s=G share=P slow=K threshold_ns=T": P = G / S in percent, K launches read
 * as timed. Bare, P is ~100 (one kernel at a time, back to back); under a 10% share a sealed library keeps
 * P near 10 whatever the kernel does. Linked with -lcuda (the machine's driver). */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *ptx =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry vgpu_latch(.param .u64 flag, .param .u64 out, .param .u64 max_ns)\n"
    "{\n"
    "\t.reg .pred %p;\n"
    "\t.reg .b32 %r1;\n"
    "\t.reg .b64 %rd<9>;\n"
    "\tld.param.u64 %rd1, [flag];\n"
    "\tld.param.u64 %rd2, [out];\n"
    "\tld.param.u64 %rd3, [max_ns];\n"
    "\tmov.u64 %rd4, %globaltimer;\n"
    "LOOP:\n"
    "\tld.volatile.global.u32 %r1, [%rd1];\n"
    "\tsetp.ne.u32 %p, %r1, 0;\n"
    "\t@%p bra DONE;\n"
    "\tmov.u64 %rd5, %globaltimer;\n"
    "\tsub.u64 %rd6, %rd5, %rd4;\n"
    "\tsetp.lt.u64 %p, %rd6, %rd3;\n"
    "\t@%p bra LOOP;\n"
    "DONE:\n"
    "\tmov.u64 %rd7, %globaltimer;\n"
    "\tst.volatile.global.u64 [%rd2], %rd4;\n"
    "\tst.volatile.global.u64 [%rd2+8], %rd7;\n"
    "\tret;\n"
    "}\n";

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#define TRY(x)                                                                 \
    do {                                                                       \
        CUresult r_ = (x);                                                     \
        if (r_ != CUDA_SUCCESS) {                                              \
            const char *n_ = "?";                                              \
            cuGetErrorName(r_, &n_);                                           \
            fprintf(stderr, "seal_probe: %s: %s (%d)\n", #x, n_, (int)r_);     \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: seal_probe SECONDS [LONG_US]\n");
        return 2;
    }
    double secs = atof(argv[1]);
    uint64_t long_ns = (uint64_t)((argc > 2 ? atof(argv[2]) : 2000) * 1000);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    TRY(cuInit(0));
    TRY(cuDeviceGet(&dev, 0));
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
    TRY(cuCtxSetCurrent(ctx));
    TRY(cuModuleLoadData(&mod, ptx));
    TRY(cuModuleGetFunction(&fn, mod, "vgpu_latch"));
    TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    volatile uint32_t *flag;
    volatile uint64_t *out;
    CUdeviceptr dflag, dout;
    TRY(cuMemHostAlloc((void **)&flag, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    TRY(cuMemHostAlloc((void **)&out, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    TRY(cuMemHostGetDevicePointer(&dflag, (void *)flag, 0));
    TRY(cuMemHostGetDevicePointer(&dout, (void *)out, 0));

    /* One launch: the call timed; then the flag set at once (slow call) or after long_ns (fast call); then
     * waited for (a spin on the kernel's end stamp: no synchronisation the library sees). Returns the
     * call's duration, or 0 on error. */
    uint64_t gpu_ns = 0;
    int slow_calls = 0;
#define ONE(threshold, count)                                                               \
    do {                                                                                    \
        *flag = 0;                                                                          \
        out[0] = out[1] = 0;                                                                \
        __sync_synchronize();                                                               \
        void *args[] = {&dflag, &dout, &long_ns};                                           \
        uint64_t c0 = now_ns();                                                             \
        TRY(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));                        \
        call = now_ns() - c0;                                                               \
        if ((threshold) && call > (threshold)) {                                            \
            *flag = 1;                                                                      \
            slow_calls += (count);                                                          \
        }                                                                                   \
        while (out[1] == 0) {                                                               \
        }                                                                                   \
        *flag = 1;                                                                          \
        if (count) gpu_ns += out[1] - out[0];                                               \
    } while (0)

    /* Learn the call's duration: 64 launches, their median and the fast quartile; a call 1.5x the fast
     * quartile's duration + 0.5 µs reads as timed. */
    uint64_t calls[64], call = 0;
    for (int i = 0; i < 64; i++) {
        ONE(0, 0);
        calls[i] = call;
    }
    qsort(calls, 64, sizeof calls[0], cmp_u64);
    uint64_t threshold = calls[16] + calls[16] / 2 + 500;
    long launched = 0;
    uint64_t t0 = now_ns();
    while ((now_ns() - t0) / 1e9 < secs) {
        ONE(threshold, 1);
        launched++;
    }
    double took = (now_ns() - t0) / 1e9;
    printf("launched=%ld seconds=%.3f gpu_s=%.3f share=%.1f slow=%d threshold_ns=%llu median_call_ns=%llu\n", launched,
           took, gpu_ns / 1e9, 100.0 * gpu_ns / 1e9 / took, slow_calls, (unsigned long long)threshold,
           (unsigned long long)calls[32]);
    return 0;
}
