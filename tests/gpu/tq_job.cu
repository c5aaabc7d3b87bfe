// A job for tests/gpu/time_quanta.sh (issue 29): allocates GIB GiB with cudaMalloc (managed memory when the
// library's oversubscribe mode serves it), then for SECONDS of wall time passes over all of it with a
// kernel (one read and one write of every word), synchronising after each pass. Prints one line:
// `RESULT gib= passes= seconds= gib_per_s=` and writes each pass's start and end (CLOCK_MONOTONIC ns) to
// TIMELINE (from the launch's return, after any wait for the turn, to the end), one "start end" line each, so the script can find the gaps where neither job ran (hand-offs).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>
#include <cuda_runtime.h>

__global__ void pass(unsigned *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1;
}

static long long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: tq_job GIB SECONDS TIMELINE\n");
        return 2;
    }
    double gib = atof(argv[1]), secs = atof(argv[2]);
    size_t bytes = (size_t)(gib * (1ULL << 30));
    size_t n = bytes / sizeof(unsigned);
    unsigned *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMalloc %zu: %s\n", bytes, cudaGetErrorString(e));
        return 1;
    }
    cudaMemset(p, 0, bytes);
    cudaDeviceSynchronize();
    std::vector<long long> tl;
    tl.reserve(1 << 20);
    long long t0 = now_ns(), end = t0 + (long long)(secs * 1e9);
    long passes = 0;
    while (now_ns() < end) {
        // The launch waits for the turn inside the library (its gate): the pass starts when it returns.
        pass<<<1024, 512>>>(p, n);
        long long a = now_ns();
        e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "pass %ld: %s\n", passes, cudaGetErrorString(e));
            return 1;
        }
        tl.push_back(a);
        tl.push_back(now_ns());
        passes++;
    }
    double took = (now_ns() - t0) / 1e9;
    FILE *f = fopen(argv[3], "w");
    for (size_t i = 0; f && i + 1 < tl.size(); i += 2) fprintf(f, "%lld %lld\n", tl[i], tl[i + 1]);
    if (f) fclose(f);
    printf("RESULT gib=%.1f passes=%ld seconds=%.3f gib_per_s=%.1f\n", gib, passes, took, passes * gib / took);
    cudaFree(p);
    return 0;
}
