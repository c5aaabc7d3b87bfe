// tests/gpu/surface.sh: a library with 1.5 GiB of device data: loaded into a context, its globals take that much device memory.
__device__ char big[3ull << 29];
extern "C" __global__ void noop() { if (threadIdx.x == 1024) big[0] = 1; }
