// tests/gpu/surface.sh, issue 23 item 4: spill mode, the quota full, the rest spilled; then cudaMemPrefetchAsync
// and cudaMemAdvise(SetPreferredLocation = device) of every spilled chunk and a kernel writing all of it.
// Prints the return codes; the caller samples the device's used memory (nvidia-smi) at "stage=" lines.
#include <cstdio>
#include <cuda_runtime.h>
#include <unistd.h>

__global__ void touch(char *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = 1;
}

int main() {
    const size_t chunk = 256ull << 20;
    char *ptrs[24], *spill[24];
    int nspill = 0, ndev = 0;
    cudaFree(0);
    for (int i = 0; i < 20; i++) {
        if (cudaMalloc(&ptrs[i], chunk) != cudaSuccess) { printf("alloc %d failed\n", i); return 1; }
        cudaPointerAttributes a;
        cudaPointerGetAttributes(&a, ptrs[i]);
        if (a.type == cudaMemoryTypeManaged) spill[nspill++] = ptrs[i]; else ndev++;
    }
    printf("device_chunks=%d spilled_chunks=%d chunk_mib=256\n", ndev, nspill);
    printf("stage=filled\n"); fflush(stdout); sleep(3);
    int pre_ok = 0, adv_ok = 0;
    cudaMemLocation dev = {cudaMemLocationTypeDevice, 0};
    for (int i = 0; i < nspill; i++) {
        cudaError_t e = cudaMemPrefetchAsync(spill[i], chunk, dev, 0, 0);
        if (e == cudaSuccess) pre_ok++; else if (i == 0) printf("prefetch rc=%d %s\n", (int)e, cudaGetErrorName(e));
        cudaGetLastError();
        e = cudaMemAdvise(spill[i], chunk, cudaMemAdviseSetPreferredLocation, dev);
        if (e == cudaSuccess) adv_ok++; else if (i == 0) printf("advise rc=%d %s\n", (int)e, cudaGetErrorName(e));
        cudaGetLastError();
        touch<<<264, 1024>>>(spill[i], chunk);
    }
    cudaError_t s = cudaDeviceSynchronize();
    printf("prefetch_ok=%d advise_ok=%d of=%d sync=%s\n", pre_ok, adv_ok, nspill, cudaGetErrorName(s));
    printf("stage=moved\n"); fflush(stdout); sleep(3);
    return 0;
}
