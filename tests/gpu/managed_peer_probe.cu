// tests/gpu/managed_peer.sh, issue 48 item 5 (two GPUs): managed memory allocated on GPU 0, then faulted
// into GPU 1 by a kernel there, then read-mostly copies on both, then plain memory on GPU 1 up to its quota.
// Prints return codes and, at each "stage=" line, the library's view of both devices (cudaMemGetInfo);
// the caller samples each GPU's used memory (nvidia-smi). Usage: managed_peer_probe MANAGED_MIB PLAIN_MIB
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>

__global__ void touch(char *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1;
}

__global__ void readall(const char *p, size_t n, int *sink) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) acc += p[i];
    if (acc == 12345) *sink = acc;
}

// view: the library's view of devices 0..ndev-1 (a query on a device makes its context: GPU 1 only once made).
static void view(const char *stage, int ndev = 2) {
    int cur = 0;
    cudaGetDevice(&cur);
    for (int d = 0; d < ndev; d++) {
        size_t f = 0, t = 0;
        cudaSetDevice(d);
        cudaError_t e = cudaMemGetInfo(&f, &t);
        printf("view dev%d used_mib=%zu total_mib=%zu rc=%d\n", d, (t - f) >> 20, t >> 20, (int)e);
    }
    cudaSetDevice(cur);
    printf("stage=%s\n", stage);
    fflush(stdout);
    sleep(2);
}

static int rc(const char *what, cudaError_t e) {
    printf("%s rc=%d %s\n", what, (int)e, cudaGetErrorName(e));
    fflush(stdout);
    return e == cudaSuccess;
}

int main(int argc, char **argv) {
    size_t mm = (size_t)atoi(argc > 1 ? argv[1] : "2048") << 20, pm = (size_t)atoi(argc > 2 ? argv[2] : "3072") << 20;
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n < 2) { printf("skipped: %d device(s)\n", n); return 0; }
    int access = 0;
    cudaDeviceGetAttribute(&access, cudaDevAttrConcurrentManagedAccess, 1);
    printf("devices=%d concurrent_managed_access_gpu1=%d\n", n, access);
    cudaSetDevice(0);
    rc("context on GPU 0 (cudaFree(0))", cudaFree(0));
    char *p = nullptr;
    if (!rc("cudaMallocManaged on GPU 0", cudaMallocManaged(&p, mm))) { view("refused", 1); return 0; }
    touch<<<264, 256>>>(p, mm);
    rc("kernel on GPU 0", cudaDeviceSynchronize());
    view("managed-on-gpu0", 1);
    cudaSetDevice(1);
    if (!rc("context on GPU 1 (cudaFree(0))", cudaFree(0))) { view("gpu1-context-refused", 1); return 0; }
    view("gpu1-context");
    touch<<<264, 256>>>(p, mm);
    rc("kernel on GPU 1 writing all of it", cudaDeviceSynchronize());
    view("faulted-into-gpu1");
    rc("cudaMemAdvise read-mostly", cudaMemAdvise(p, mm, cudaMemAdviseSetReadMostly, cudaMemLocation{cudaMemLocationTypeDevice, 0}));
    // Reads on each device: read-mostly memory is copied to each reader, the pages on GPU 1 stay.
    for (int d = 0; d < 2; d++) {
        cudaSetDevice(d);
        int *sink = nullptr;
        cudaMalloc(&sink, 4);
        readall<<<264, 256>>>(p, mm, sink);
        rc(d == 0 ? "kernel on GPU 0 reading all of it" : "kernel on GPU 1 reading all of it", cudaDeviceSynchronize());
        cudaFree(sink);
    }
    view("read-mostly-copies");
    cudaSetDevice(1);
    char *q = nullptr;
    cudaError_t e = cudaMalloc(&q, pm);
    rc("cudaMalloc plain on GPU 1", e);
    view("plain-on-gpu1");
    if (e == cudaSuccess) cudaFree(q);
    cudaFree(p);
    view("freed");
    return 0;
}
