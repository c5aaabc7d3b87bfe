// tests/gpu/surface.sh, issue 23 item 9: does this GPU reach pageable (malloc) memory (HMM, or ATS on
// Grace), and does the driver then move such memory into device memory with no cuMem* allocation?
// Prints the attributes; with pageable access, writes 1 GiB of malloc'd memory from a kernel and
// prefetches it to the device (the caller samples the device's used memory and NVML's per-process figure
// at each "stage=" line). Without it, the prefetch is only asked (the driver refuses pageable memory).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <unistd.h>

__global__ void touch(char *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = 1;
}

int main() {
    int pageable = 0, host_tables = 0, concurrent = 0;
    cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
    cudaDeviceGetAttribute(&host_tables, cudaDevAttrPageableMemoryAccessUsesHostPageTables, 0);
    cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
    printf("pageable_memory_access=%d uses_host_page_tables=%d concurrent_managed=%d\n", pageable, host_tables,
           concurrent);
    const size_t n = 1ull << 30;
    char *p = (char *)malloc(n);
    memset(p, 0, n);
    cudaFree(0);
    printf("stage=context\n"); fflush(stdout); sleep(2);
    if (pageable) {
        touch<<<264, 1024>>>(p, n);
        printf("kernel_on_malloc=%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
        printf("stage=touched\n"); fflush(stdout); sleep(2);
    }
    cudaMemLocation dev = {cudaMemLocationTypeDevice, 0};
    cudaError_t e = cudaMemPrefetchAsync(p, n, dev, 0, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    printf("prefetch_malloc_to_device=%s\n", cudaGetErrorName(e));
    cudaGetLastError();
    printf("stage=prefetched\n"); fflush(stdout); sleep(2);
    return 0;
}
