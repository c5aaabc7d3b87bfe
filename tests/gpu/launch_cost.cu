// Where a launch's time goes under a compute share (issue 24): tests/gpu/launch_cost.sh runs this bare and
// under the library. `calls`: what each driver call the share's launch path makes costs on this driver
// (cuStreamGetCtx, cuStreamIsCapturing, cuThreadExchangeStreamCaptureMode, cuEventRecord, cuEventQuery of a
// completed event, cuEventElapsedTime, a launch of an empty kernel, NVML's per-process utilisation), ns per
// call, the median of 5 rounds. `loop`: the CPU time of a launch (cudaLaunchKernel, which reaches the hooked
// cuLaunchKernel through cuGetProcAddress) in batches of 48 with a synchronisation after each, as the
// precision matrix's loops run: `idle` kernels that end before the next is launched (a launch-bound loop:
// the GPU keeps up), `queued` kernels of ~20 us (each launch queued behind the one before). One line each:
// `RESULT what ns`. `queued`, `idle`: one loop only. `pattern`: the share's driver calls around each launch made by hand (`pattern_loop`).
// `init` only starts CUDA.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void empty() {}

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

static double now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

template <class F> static double per_call(int n, F f) {
    std::vector<double> r;
    for (int round = 0; round < 5; round++) {
        double t0 = now_ns();
        for (int i = 0; i < n; i++) f(i);
        r.push_back((now_ns() - t0) / n);
    }
    std::sort(r.begin(), r.end());
    return r[2];
}

static void result(const char *what, double ns) {
    printf("RESULT %s %.0f\n", what, ns);
    fflush(stdout);
}

// CPU ns per launch in batches of 48, a stream synchronisation after each batch (not counted).
static double launch_loop(cudaStream_t s, long long cycles, int batches) {
    std::vector<double> per;
    for (int round = 0; round < 5; round++) {
        double spent = 0;
        for (int b = 0; b < batches; b++) {
            double t0 = now_ns();
            for (int i = 0; i < 48; i++) {
                if (cycles) spin<<<1, 32, 0, s>>>(cycles);
                else empty<<<1, 32, 0, s>>>();
            }
            spent += now_ns() - t0;
            cudaStreamSynchronize(s);
        }
        per.push_back(spent / (48.0 * batches));
    }
    std::sort(per.begin(), per.end());
    return per[2];
}

// The share's driver calls around each launch made by hand, no library (`pattern`): after each launch an
// event record (a queued launch's end; its start is the launch before's end), then a query of the oldest
// end not yet seen complete and, while complete, its elapsed time from the one before; CPU ns per launch as
// `launch_loop` counts them. Against `loop`, bare: what the driver calls cost in a loop; against the
// library's `loop` under a share: what the library's own work costs.
static double pattern_loop(cudaStream_t s, long long cycles, int batches) {
    CUstream cs = (CUstream)s;
    std::vector<CUevent> ev(49);
    for (auto &e : ev) cuEventCreate(&e, CU_EVENT_DEFAULT);
    std::vector<double> per;
    float ms;
    for (int round = 0; round < 5; round++) {
        double spent = 0;
        for (int b = 0; b < batches; b++) {
            double t0 = now_ns();
            cuEventRecord(ev[0], cs);
            int seen = 0;
            for (int i = 0; i < 48; i++) {
                if (cycles) spin<<<1, 32, 0, s>>>(cycles);
                else empty<<<1, 32, 0, s>>>();
                cuEventRecord(ev[i + 1], cs);
                while (seen < i + 1 && cuEventQuery(ev[seen + 1]) == CUDA_SUCCESS) {
                    cuEventElapsedTime(&ms, ev[seen], ev[seen + 1]);
                    seen++;
                }
            }
            spent += now_ns() - t0;
            cudaStreamSynchronize(s);
            for (; seen < 48; seen++) cuEventElapsedTime(&ms, ev[seen], ev[seen + 1]);
        }
        per.push_back(spent / (48.0 * batches));
    }
    std::sort(per.begin(), per.end());
    return per[2];
}

int main(int argc, char **argv) {
    bool calls = argc > 1 && !strcmp(argv[1], "calls");
    cudaStream_t s;
    cudaFree(0);
    // `init`: only start CUDA (under the library: its ledgers exist after; tests/gpu/time_quanta_lib.sh).
    if (argc > 1 && !strcmp(argv[1], "init")) return 0;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    // Warm up (module load, the library's first share, its least times).
    for (int i = 0; i < 200; i++) empty<<<1, 32, 0, s>>>();
    cudaStreamSynchronize(s);
    if (argc > 1 && !strcmp(argv[1], "pattern")) {
        result("pattern-idle", pattern_loop(s, 0, 200));
        result("pattern-queued", pattern_loop(s, 40000, 100));
        return cudaGetLastError() == cudaSuccess ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "queued")) {
        result("loop-queued", launch_loop(s, 40000, 100));
        return cudaGetLastError() == cudaSuccess ? 0 : 1;
    }
    if (argc > 1 && !strcmp(argv[1], "idle")) {
        result("loop-idle", launch_loop(s, 0, 200));
        return cudaGetLastError() == cudaSuccess ? 0 : 1;
    }
    if (!calls) {
        result("loop-idle", launch_loop(s, 0, 200));
        result("loop-queued", launch_loop(s, 40000, 100));  // ~20 us at ~2 GHz
        return cudaGetLastError() == cudaSuccess ? 0 : 1;
    }
    CUstream cs = (CUstream)s;
    CUcontext ctx;
    result("cuStreamGetCtx", per_call(100000, [&](int) { cuStreamGetCtx(cs, &ctx); }));
    unsigned st;
    result("cuStreamIsCapturing", per_call(100000, [&](int) { cuStreamIsCapturing(cs, (CUstreamCaptureStatus *)&st); }));
    result("cuThreadExchangeStreamCaptureMode", per_call(100000, [&](int) {
               CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
               cuThreadExchangeStreamCaptureMode(&m);
               cuThreadExchangeStreamCaptureMode(&m);
           }) / 2);
    const int N = 20000;
    float ms0;
    std::vector<CUevent> ev(N);
    for (auto &e : ev) cuEventCreate(&e, CU_EVENT_DEFAULT);
    result("cuEventRecord", per_call(N, [&](int i) { cuEventRecord(ev[i], cs); }));
    cuStreamSynchronize(cs);
    // Elapsed time of events that completed but were never queried (what a charge after a synchronisation
    // reads without asking first): 5 rounds of 2,000, the median.
    {
        std::vector<double> r;
        for (int round = 0; round < 5; round++) {
            for (int k = 0; k < 2001; k++) cuEventRecord(ev[k], cs);
            cuStreamSynchronize(cs);
            double t0 = now_ns();
            for (int k = 0; k < 2000; k++) cuEventElapsedTime(&ms0, ev[k], ev[k + 1]);
            r.push_back((now_ns() - t0) / 2000);
        }
        std::sort(r.begin(), r.end());
        result("cuEventElapsedTime-unqueried", r[2]);
    }
    // The same while the stream runs a long kernel (a charge made between launches, the GPU busy).
    {
        std::vector<double> r;
        for (int round = 0; round < 5; round++) {
            for (int k = 0; k < 2001; k++) cuEventRecord(ev[k], cs);
            cuStreamSynchronize(cs);
            spin<<<1, 32, 0, s>>>(200000000LL);
            double t0 = now_ns();
            for (int k = 0; k < 2000; k++) cuEventElapsedTime(&ms0, ev[k], ev[k + 1]);
            r.push_back((now_ns() - t0) / 2000);
            cuStreamSynchronize(cs);
        }
        std::sort(r.begin(), r.end());
        result("cuEventElapsedTime-busy-stream", r[2]);
    }
    // The unversioned cuEventElapsedTime (what a library resolving the name with dlsym gets; cuda.h 13
    // maps the name to _v2), and a query and an elapsed time in relaxed capture mode (as the share reads
    // its events), on completed events.
    {
        auto v1 = (CUresult(*)(float *, CUevent, CUevent))dlsym(RTLD_DEFAULT, "cuEventElapsedTime");
        for (int k = 0; k < 2001; k++) cuEventRecord(ev[k], cs);
        cuStreamSynchronize(cs);
        if (v1) result("cuEventElapsedTime-v1", per_call(2000, [&](int k) { v1(&ms0, ev[k], ev[k + 1]); }));
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        cuThreadExchangeStreamCaptureMode(&m);
        result("cuEventQuery-relaxed", per_call(2000, [&](int k) { cuEventQuery(ev[k]); }));
        result("cuEventElapsedTime-relaxed", per_call(2000, [&](int k) { cuEventElapsedTime(&ms0, ev[k], ev[k + 1]); }));
        cuThreadExchangeStreamCaptureMode(&m);
    }
    // A query of an event still pending (behind a ~1 s kernel), and records behind that queued work.
    spin<<<1, 32, 0, s>>>(2000000000LL);
    cuEventRecord(ev[N - 1], cs);
    result("cuEventQuery-pending", per_call(N, [&](int) { cuEventQuery(ev[N - 1]); }));
    result("cuEventRecord-queued", per_call(N / 5, [&](int i) { cuEventRecord(ev[i], cs); }));
    cuStreamSynchronize(cs);
    for (int i = 0; i < N; i++) cuEventRecord(ev[i], cs);
    cuStreamSynchronize(cs);
    result("cuEventQuery-done", per_call(N, [&](int i) { cuEventQuery(ev[i]); }));
    float ms;
    result("cuEventElapsedTime", per_call(N - 1, [&](int i) { cuEventElapsedTime(&ms, ev[i], ev[i + 1]); }));
    CUfunction f;
    cudaGetFuncBySymbol(&f, (const void *)empty);
    result("cuLaunchKernel-empty", per_call(N, [&](int i) {
               cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, cs, nullptr, nullptr);
               if (i % 48 == 47) cuStreamSynchronize(cs);
           }));
    cuStreamSynchronize(cs);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nvml) {
        auto init = (int (*)())dlsym(nvml, "nvmlInit_v2");
        auto byidx = (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        auto util = (int (*)(void *, void *, unsigned *, unsigned long long))dlsym(nvml, "nvmlDeviceGetProcessUtilization");
        void *dev = nullptr;
        if (init && byidx && util && init() == 0 && byidx(0, &dev) == 0) {
            static char buf[256 * 32];
            result("nvmlDeviceGetProcessUtilization", per_call(20, [&](int) {
                       unsigned n = 256;
                       util(dev, buf, &n, (unsigned long long)(time(nullptr) - 1) * 1000000ULL);
                   }));
        }
    }
    return 0;
}
