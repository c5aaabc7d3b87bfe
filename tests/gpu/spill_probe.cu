// How host-preferred managed memory behaves on this GPU (docs/libvgpu.md, "Unified memory"): for each way of
// placing a buffer the device reads and writes, the bandwidth kernels get and how much of it NVML then
// counts as this process's device memory. Spill mode must keep spilled pages off the device.
//
//   nvcc -O2 -o spill_probe tests/gpu/spill_probe.cu -ldl && ./spill_probe [MiB]
//
// Placements: device (cudaMalloc, the reference); managed + preferred location CPU + accessed-by the
// device (what the library does today); the same and prefetched to the CPU before first use; managed with
// only the preferred location; pinned host memory mapped into the device (cudaHostAlloc, never migrated).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>

// The driver's legacy entry points, as libvgpu calls them (cuda.h of CUDA 13 renames the API to the
// CUmemLocation forms): cuMemAdvise(ptr, bytes, advice, device or -1) and cuMemPrefetchAsync(ptr, bytes,
// device or -1, stream).
typedef CUresult (*advise_t)(CUdeviceptr, size_t, int, int);
typedef CUresult (*prefetch_t)(CUdeviceptr, size_t, int, CUstream);

__global__ void readk(const float4 *p, size_t n, float *out) {
    float s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += p[i].x + p[i].y + p[i].z + p[i].w;
    if (s == 1234.5f) *out = s;  // keeps the loads
}
__global__ void writek(float4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_float4(1, 2, 3, 4);
}

static long long nvml_used_mib(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits");
    FILE *f = popen(cmd, "r");
    long long pid, mib, got = -1;
    while (f && fscanf(f, "%lld, %lld", &pid, &mib) == 2)
        if (pid == getpid()) got = mib;
    if (f) pclose(f);
    return got;
}

static float timed(int what, void *p, size_t bytes, float *out) {
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a);
    if (what == 0) readk<<<1024, 256>>>((const float4 *)p, bytes / 16, out);
    else writek<<<1024, 256>>>((float4 *)p, bytes / 16);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 1024, bytes = mib << 20;
    const char *names[] = {"device", "managed-advised", "managed-advised-prefetched", "managed-preferred-only",
                           "host-mapped"};
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    advise_t advise = (advise_t)dlsym(h, "cuMemAdvise");
    prefetch_t prefetch = (prefetch_t)dlsym(h, "cuMemPrefetchAsync");
    float *out;
    cudaMalloc(&out, 4);
    long long base = nvml_used_mib();
    printf("{\"probe\":\"base\",\"nvml_mib\":%lld,\"buffer_mib\":%zu}\n", base, mib);
    for (int m = 0; m < 5; m++) {
        void *p = 0;
        cudaError_t e;
        if (m == 0) e = cudaMalloc(&p, bytes);
        else if (m == 4) e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        else e = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
        CUresult a = CUDA_SUCCESS, b = CUDA_SUCCESS, c = CUDA_SUCCESS;
        if (m >= 1 && m <= 3) {
            a = advise((CUdeviceptr)p, bytes, 3 /* SET_PREFERRED_LOCATION */, -1 /* CPU */);
            if (m != 3) b = advise((CUdeviceptr)p, bytes, 5 /* SET_ACCESSED_BY */, 0);
            if (m == 2) { c = prefetch((CUdeviceptr)p, bytes, -1, 0); cudaDeviceSynchronize(); }
        }
        if (e != cudaSuccess) { printf("{\"probe\":\"%s\",\"error\":\"%s\"}\n", names[m], cudaGetErrorString(e)); continue; }
        float w = timed(1, p, bytes, out);
        float r1 = timed(0, p, bytes, out), r2 = timed(0, p, bytes, out), r3 = timed(0, p, bytes, out);
        float w2 = timed(1, p, bytes, out);
        cudaDeviceSynchronize();
        long long used = nvml_used_mib();
        double gb = bytes / 1e9;
        printf("{\"probe\":\"%s\",\"advise\":[%d,%d,%d],\"first_write_ms\":%.2f,\"read_ms\":[%.2f,%.2f,%.2f],"
               "\"write_ms\":%.2f,\"read_gbps\":%.1f,\"nvml_mib\":%lld,\"nvml_delta_mib\":%lld,\"err\":\"%s\"}\n",
               names[m], a, b, c, w, r1, r2, r3, w2, gb / (r3 / 1e3), used, used - base,
               cudaGetErrorString(cudaGetLastError()));
        fflush(stdout);
        if (m == 4) cudaFreeHost(p); else cudaFree(p);
        cudaDeviceSynchronize();
    }
    return 0;
}
