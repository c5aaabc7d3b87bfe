// Issue 23 item 3 on a real GPU: a kernel with 16 KiB of local memory per thread makes the driver grow the
// context's stack for every resident thread at its launch (~4.4 GB on an H100), with no allocation call.
// Prints one "stage=" line per step (tests/gpu/stack.sh samples the device's used memory at each) and
// holds each state for a second so that the sample sees it.
#include <cstdio>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void deep(int *out, int n) {
    volatile char buf[16384];
    for (int i = threadIdx.x; i < 16384; i += 97) buf[i] = (char)(i + n);
    if (threadIdx.x == 0) out[blockIdx.x] = buf[(n * 131) % 16384];
}

int main() {
    int *out = nullptr;
    cudaError_t e = cudaMalloc(&out, 4096 * sizeof(int));
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    cudaFuncAttributes a;
    cudaFuncGetAttributes(&a, deep);
    printf("stage=ready alloc_rc=%d local_bytes=%zu free_mib=%zu total_mib=%zu\n", (int)e, a.localSizeBytes,
           f >> 20, t >> 20);
    fflush(stdout);
    sleep(1);
    deep<<<1024, 256>>>(out, 5);
    cudaError_t le = cudaGetLastError();
    cudaError_t se = cudaDeviceSynchronize();
    cudaMemGetInfo(&f, &t);
    printf("stage=launched launch_rc=%d(%s) sync_rc=%d free_mib=%zu\n", (int)le, cudaGetErrorName(le), (int)se,
           f >> 20);
    fflush(stdout);
    sleep(1);
    return 0;
}
