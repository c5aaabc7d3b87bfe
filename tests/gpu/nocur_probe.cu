// Issue 23 leftovers on a real GPU (tests/gpu/nocur.sh): (1) a CUkernel (what the CUDA runtime launches;
// cudaGetKernel) with 16 KiB of local memory per thread, launched through the driver API while no
// context is current, on its stream (the driver grows the stream's context's stack for every resident
// thread) and on the legacy default stream (no context: the driver refuses it); (2) a green context of
// all the device's SMs, created and destroyed. One "stage=" line per step; each state held a second so
// that nocur.sh's sample (the device's used memory, NVML's per-process figure) sees it.
#include <cstdio>
#include <unistd.h>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void deep(int *out, int n) {
    volatile char buf[16384];
    for (int i = threadIdx.x; i < 16384; i += 97) buf[i] = (char)(i + n);
    if (threadIdx.x == 0) out[blockIdx.x] = buf[(n * 131) % 16384];
}

static size_t free_mib() {
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f >> 20;
}

static void stage(const char *name, int rc) {
    printf("stage=%s rc=%d free_mib=%zu\n", name, rc, free_mib());
    fflush(stdout);
    sleep(1);
}

int main() {
    int *out = nullptr;
    int n = 5;
    cudaStream_t s;
    cudaKernel_t k;
    cudaMalloc(&out, 4096 * sizeof(int));
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int e = (int)cudaGetKernel(&k, deep);
    stage("ready", e);
    CUcontext cur = nullptr;
    cuCtxGetCurrent(&cur);
    void *args[] = {&out, &n};
    cuCtxSetCurrent(nullptr);
    CUresult r = cuLaunchKernel((CUfunction)k, 1024, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr);
    cuCtxSetCurrent(cur);
    cudaStreamSynchronize(s);
    stage("launched-nocur", (int)r);
    cuCtxSetCurrent(nullptr);
    r = cuLaunchKernel((CUfunction)k, 1024, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr);
    cuCtxSetCurrent(cur);
    cudaDeviceSynchronize();
    stage("launched-default-nocur", (int)r);
    CUdevResource res;
    CUdevResourceDesc desc;
    CUgreenCtx g = nullptr;
    r = cuDeviceGetDevResource(0, &res, CU_DEV_RESOURCE_TYPE_SM);
    if (r == CUDA_SUCCESS) r = cuDevResourceGenerateDesc(&desc, &res, 1);
    if (r == CUDA_SUCCESS) r = cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM);
    stage("green", (int)r);
    if (g) stage("green-destroyed", (int)cuGreenCtxDestroy(g));
    return 0;
}
