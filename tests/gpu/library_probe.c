/* tests/gpu/surface.sh, issue 23 item 6: cuLibraryLoadFromFile with no context current, then its first use in the
 * primary context (cuLibraryGetModule, then cuLibraryGetKernel + cuKernelGetFunction). Prints the return
 * codes; the caller samples the device's used memory (nvidia-smi) at "stage=" lines. */
#include <cuda.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    CUlibrary lib;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUkernel k;
    CUfunction f;
    const char *n = "";
    cuInit(0);
    CUresult r = cuLibraryLoadFromFile(&lib, argv[1], NULL, NULL, 0, NULL, NULL, 0);
    printf("load rc=%d\n", r);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    printf("stage=context\n"); fflush(stdout); sleep(2);
    r = cuLibraryGetModule(&mod, lib);
    cuGetErrorName(r, &n);
    printf("getmodule rc=%d %s\n", r, n);
    r = cuLibraryGetKernel(&k, lib, "noop");
    if (r == CUDA_SUCCESS) r = cuKernelGetFunction(&f, k);
    cuGetErrorName(r, &n);
    printf("kernel rc=%d %s\n", r, n);
    size_t fr, tot;
    cuMemGetInfo(&fr, &tot);
    printf("view free_mib=%zu total_mib=%zu\n", fr >> 20, tot >> 20);
    printf("stage=used\n"); fflush(stdout); sleep(3);
    return 0;
}
