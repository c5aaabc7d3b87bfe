// Issue 47 on a real GPU: a benchmark-shaped program that resets its device between phases. Each of
// ROUNDS rounds (argv[1], default 5): cudaMalloc 256 MiB, ITERS iterations (argv[2], default 20) of 100
// short kernels timed with events, a driver context made with cuCtxCreate, used for one launch and
// destroyed, cudaFree, and cudaDeviceReset (cuDevicePrimaryCtxReset) with kernels still queued.
// Prints per round: "round=R iter_ms=MEDIAN launch_us=MEAN primary=HANDLE", where iter_ms is an
// iteration's wall time (its 100 kernels and the synchronisation), launch_us the host time of one
// cudaLaunchKernel, and HANDLE the primary context's CUcontext (the same after a reset?); then
// "done rounds=R". Under a share the library once charged every launch after the first reset 1 ms
// unmeasured (iter_ms ~150x bare) and the driver crashed on events it had freed (SIGSEGV in libcuda).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <algorithm>
#include <vector>

__global__ void spin(long long cycles, float *out) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    if (out && threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)
#define CU(x)                                                                  \
    do {                                                                       \
        CUresult r_ = (x);                                                     \
        if (r_ != CUDA_SUCCESS) {                                              \
            fprintf(stderr, "%s:%d %s: rc %d\n", __FILE__, __LINE__, #x, r_); \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, iters = argc > 2 ? atoi(argv[2]) : 20;
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    long long cycles = (long long)khz * 10 / 1000;  // ~10 us a kernel
    for (int r = 0; r < rounds; r++) {
        CK(cudaSetDevice(0));
        float *buf = nullptr;
        CK(cudaMalloc(&buf, 256 << 20));
        CUcontext primary = nullptr;
        CU(cuCtxGetCurrent(&primary));
        cudaStream_t s;
        CK(cudaStreamCreate(&s));
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        std::vector<double> iter_ms;
        double launch_s = 0;
        long launches = 0;
        for (int i = 0; i < iters; i++) {
            double t0 = now();
            CK(cudaEventRecord(a, s));
            for (int k = 0; k < 100; k++) {
                double l0 = now();
                spin<<<1, 32, 0, s>>>(cycles, buf);
                launch_s += now() - l0;
                launches++;
            }
            CK(cudaGetLastError());
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            iter_ms.push_back((now() - t0) * 1e3);
        }
        // A context of its own, made, used and destroyed while the primary one lives.
        CUdevice dev;
        CUcontext own;
        CU(cuDeviceGet(&dev, 0));
#if CUDA_VERSION >= 13000
        CU(cuCtxCreate(&own, NULL, 0, dev));
#else
        CU(cuCtxCreate(&own, 0, dev));
#endif
        CK(cudaStreamCreate(&s));  // a stream of the new context (the runtime follows the current one)
        spin<<<1, 32, 0, s>>>(cycles, nullptr);
        CU(cuCtxDestroy(own));
        CU(cuCtxSetCurrent(NULL));
        CK(cudaSetDevice(0));
        // Kernels still queued when the device is reset.
        for (int k = 0; k < 8; k++) spin<<<1, 32>>>(cycles, buf);
        CK(cudaFree(buf));
        std::sort(iter_ms.begin(), iter_ms.end());
        printf("round=%d iter_ms=%.3f launch_us=%.2f primary=%p\n", r, iter_ms[iter_ms.size() / 2],
               launch_s / launches * 1e6, (void *)primary);
        fflush(stdout);
        CK(cudaDeviceReset());
    }
    printf("done rounds=%d\n", rounds);
    return 0;
}
