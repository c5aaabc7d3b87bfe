/* tests/gpu/handles.sh, issue 48 items 2-4 (and the known gaps 48.2): what keeps device memory alive after
 * its handle or pointer is released. One case per run (argv[1]); each prints `stage=NAME` lines and sleeps
 * two seconds after each, so the caller samples the device's used memory and NVML's per-process figures
 * (nvidia-smi), and prints the quota view at each stage (cuMemGetInfo: under the library, the container's
 * quota and use). Sizes in MiB (argv[2], default 1024). Driver API only: gcc handles_probe.c -lcuda -ldl.
 *   export     three rounds of cuMemCreate, export to a POSIX descriptor (kept open), cuMemRelease; then
 *              the descriptors closed. Prints each descriptor's identity (st_dev, st_ino, the link)
 *   windows    a forked child imports the parent's export (passed over a socket) and maps it in 64 MiB
 *              windows at every offset; then the parent releases its handle
 *   sparse     a 1-tile map of a tile-pool allocation into a sparse array, the allocation released, another
 *              allocated, the tile unmapped, the array destroyed
 *   multicast  an allocation bound to a multicast object, released, another allocated, unbound
 *   ipc        (gap 48.2) cuMemAlloc, cuIpcGetMemHandle, a forked child opens it, the parent frees it
 *   ipc-other  the same, the child in another container (a ledger of its own): its open is charged to it;
 *              it then allocates MiB more (refused at a quota below twice MiB plus its context)
 *   ipc-outlive the child opens, the parent ends without freeing, the child then allocates MiB more (the
 *              open is charged to it once its exporter ended) and closes
 *   pool       a pool made exportable (POSIX descriptors), MiB allocated from it, the pool and the pointer
 *              exported; a forked child imports both; the parent frees the pointer, trims and destroys
 *              the pool (its reservation printed at each), the child frees its imported pointer
 *   pool-other the same, the child in another container
 *   dmabuf     (gap 48.2) cuMemAlloc, cuMemGetHandleForAddressRange (a dma-buf descriptor), cuMemFree,
 *              the descriptor closed */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Entry points some drivers (and the fake one) lack, found at run time: NOT_FOUND where missing. */
#define XSTR(x) STR(x)
#define STR(x) #x
#define DYN(fn) ((__typeof__(&fn))dlsym(RTLD_DEFAULT, XSTR(fn)))
#define CALL_DYN(fn, ...) (DYN(fn) ? DYN(fn)(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

static CUdevice dev;
static CUcontext ctx;
static const char *who = "parent";
static size_t mib = 1024;

static const char *name(CUresult r) {
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

#define TRY(call) report(#call, (call))
static CUresult report(const char *what, CUresult r) {
    printf("%s: %s rc=%d %s\n", who, what, (int)r, name(r));
    fflush(stdout);
    return r;
}

/* The quota view (the device's own without the library), then a pause for the caller's sampling. */
static void stage(const char *s) {
    size_t fr = 0, tot = 0;
    if (ctx) cuMemGetInfo(&fr, &tot);
    printf("%s: view used_mib=%zu total_mib=%zu\n", who, (tot - fr) >> 20, tot >> 20);
    printf("stage=%s\n", s);
    fflush(stdout);
    sleep(2);
}

static void init(void) {
    cuInit(0);
    cuDeviceGet(&dev, 0);
    if (TRY(cuDevicePrimaryCtxRetain(&ctx, dev)) == CUDA_SUCCESS) cuCtxSetCurrent(ctx);
}

static int attr(CUdevice_attribute a) {
    int v = -1;
    if (cuDeviceGetAttribute(&v, a, dev) != CUDA_SUCCESS) v = -1;
    return v;
}

static CUmemAllocationProp props(int exportable, int tile_pool) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    if (exportable) p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (tile_pool) p.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    return p;
}

static size_t rounded(size_t n, const CUmemAllocationProp *p) {
    size_t g = 2 << 20;
    cuMemGetAllocationGranularity(&g, p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    return (n + g - 1) / g * g;
}

static CUresult create(CUmemGenericAllocationHandle *h, size_t n, int exportable, int tile_pool) {
    CUmemAllocationProp p = props(exportable, tile_pool);
    return cuMemCreate(h, rounded(n, &p), &p, 0);
}

static void identity(int fd) {
    struct stat st;
    char link[256] = "", path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0) link[n] = 0;
    if (fstat(fd, &st) == 0)
        printf("%s: fd=%d st_dev=%llu st_ino=%llu mode=%o size=%lld link=%s\n", who, fd,
               (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, st.st_mode & S_IFMT,
               (long long)st.st_size, link);
    fflush(stdout);
}

static int send_fd(int sock, int fd) {
    char b = 0, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&b, 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock) {
    char b, ctl[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&b, 1};
    struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    int fd = -1;
    if (recvmsg(sock, &m, 0) != 1) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void say(int sock) { char b = 1; if (write(sock, &b, 1) != 1) perror("write"); }
static void hear(int sock) { char b; if (read(sock, &b, 1) != 1) perror("read"); }

static int case_export(void) {
    int fds[3] = {-1, -1, -1};
    init();
    printf("%s: posix_fd_supported=%d\n", who, attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED));
    stage("context");
    for (int k = 0; k < 3; k++) {
        CUmemGenericAllocationHandle h = 0;
        char s[32];
        if (TRY(create(&h, mib << 20, 1, 0)) == CUDA_SUCCESS) {
            if (TRY(cuMemExportToShareableHandle(&fds[k], h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) ==
                CUDA_SUCCESS)
                identity(fds[k]);
            TRY(cuMemRelease(h));
        }
        snprintf(s, sizeof s, "round%d-released", k + 1);
        stage(s);
    }
    for (int k = 0; k < 3; k++)
        if (fds[k] >= 0) close(fds[k]);
    stage("descriptors-closed");
    CUmemGenericAllocationHandle h = 0;
    TRY(create(&h, mib << 20, 0, 0));
    stage("after-another");
    return 0;
}

static int case_windows(void) {
    int sv[2];
    const size_t win = 64 << 20;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
    pid_t child = fork(); /* before any CUDA call: each process initialises its own */
    if (child == 0) {
        who = "child";
        close(sv[0]);
        int fd = recv_fd(sv[1]);
        init();
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        size_t n = (mib << 20) / win * win, k = 0;
        printf("%s: received fd=%d\n", who, fd);
        if (TRY(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) ==
                CUDA_SUCCESS &&
            TRY(cuMemAddressReserve(&va, n, 0, 0, 0)) == CUDA_SUCCESS) {
            CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
                                   .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            CUresult r = CUDA_SUCCESS;
            for (; k < n / win && r == CUDA_SUCCESS; k++) {
                r = cuMemMap(va + k * win, win, k * win, h, 0);
                if (r == CUDA_SUCCESS) r = cuMemSetAccess(va + k * win, win, &acc, 1);
            }
            printf("%s: windows of %zu MiB mapped=%zu of %zu last rc=%d %s\n", who, win >> 20,
                   r == CUDA_SUCCESS ? k : k - 1, n / win, (int)r, name(r));
        }
        close(fd);
        stage("child-mapped-windows");
        say(sv[1]);
        hear(sv[1]); /* the parent released its handle */
        stage("child-after-parent-released");
        say(sv[1]);
        hear(sv[1]);
        return 0;
    }
    close(sv[1]);
    init();
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    stage("context");
    if (TRY(create(&h, mib << 20, 1, 0)) != CUDA_SUCCESS) return 1;
    TRY(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    stage("exported");
    send_fd(sv[0], fd);
    close(fd);
    hear(sv[0]);
    stage("parent-while-child-maps");
    TRY(cuMemRelease(h));
    stage("parent-released");
    say(sv[0]);
    hear(sv[0]);
    say(sv[0]);
    waitpid(child, NULL, 0);
    stage("child-gone");
    return 0;
}

static int case_sparse(void) {
    init();
    printf("%s: sparse_supported=%d\n", who, attr(CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED));
    CUstream s = NULL;
    CUarray a = NULL;
    CUDA_ARRAY3D_DESCRIPTOR d;
    CUDA_ARRAY_SPARSE_PROPERTIES sp;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    memset(&d, 0, sizeof d);
    memset(&sp, 0, sizeof sp);
    d.Width = 4096;
    d.Height = 4096;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 1;
    d.Flags = CUDA_ARRAY3D_SPARSE;
    TRY(cuStreamCreate(&s, 0));
    if (TRY(cuArray3DCreate(&a, &d)) != CUDA_SUCCESS) return 1;
    if (TRY(CALL_DYN(cuArrayGetSparseProperties, &sp, a)) != CUDA_SUCCESS) {
        sp.tileExtent.width = 64;
        sp.tileExtent.height = 64;
        sp.tileExtent.depth = 1;
    }
    printf("%s: tile %ux%ux%u\n", who, sp.tileExtent.width, sp.tileExtent.height, sp.tileExtent.depth);
    stage("array");
    if (TRY(create(&h, mib << 20, 0, 1)) != CUDA_SUCCESS) return 1;
    CUarrayMapInfo m;
    memset(&m, 0, sizeof m);
    m.resourceType = CU_RESOURCE_TYPE_ARRAY;
    m.resource.array = a;
    m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    m.subresource.sparseLevel.extentWidth = sp.tileExtent.width;
    m.subresource.sparseLevel.extentHeight = sp.tileExtent.height;
    m.subresource.sparseLevel.extentDepth = sp.tileExtent.depth ? sp.tileExtent.depth : 1;
    m.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
    m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    m.memHandle.memHandle = h;
    m.deviceBitMask = 1u << dev;
    TRY(CALL_DYN(cuMemMapArrayAsync, &m, 1, s));
    TRY(cuStreamSynchronize(s));
    stage("tile-mapped");
    TRY(cuMemRelease(h));
    stage("pool-released");
    TRY(create(&h2, mib << 20, 0, 0));
    stage("another-allocated");
    m.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
    m.memHandle.memHandle = 0;
    TRY(CALL_DYN(cuMemMapArrayAsync, &m, 1, s));
    TRY(cuStreamSynchronize(s));
    stage("tile-unmapped");
    TRY(cuArrayDestroy(a));
    stage("array-destroyed");
    return 0;
}

static int case_multicast(void) {
    init();
    int sup = attr(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED);
    printf("%s: multicast_supported=%d\n", who, sup);
    if (sup == 0) {
        printf("%s: multicast not supported here (needs NVLink switches): skipped\n", who);
        return 0;
    }
    CUmulticastObjectProp p;
    CUmemGenericAllocationHandle mc = 0, h = 0, h2 = 0;
    size_t g = 2 << 20;
    memset(&p, 0, sizeof p);
    p.numDevices = 1;
    p.size = mib << 20;
    TRY(CALL_DYN(cuMulticastGetGranularity, &g, &p, CU_MULTICAST_GRANULARITY_RECOMMENDED));
    p.size = (p.size + g - 1) / g * g;
    if (TRY(CALL_DYN(cuMulticastCreate, &mc, &p)) != CUDA_SUCCESS) return 1;
    TRY(CALL_DYN(cuMulticastAddDevice, mc, dev));
    stage("multicast-object");
    if (TRY(create(&h, p.size, 0, 0)) != CUDA_SUCCESS) return 1;
    TRY(CALL_DYN(cuMulticastBindMem, mc, 0, h, 0, p.size, 0));
    stage("bound");
    TRY(cuMemRelease(h));
    stage("memory-released");
    TRY(create(&h2, mib << 20, 0, 0));
    stage("another-allocated");
    TRY(CALL_DYN(cuMulticastUnbind, mc, dev, 0, p.size));
    stage("unbound");
    TRY(cuMemRelease(mc));
    stage("object-released");
    return 0;
}

static int case_ipc(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
    pid_t child = fork();
    if (child == 0) {
        who = "child";
        CUipcMemHandle ih;
        CUdeviceptr p = 0;
        if (read(sv[1], &ih, sizeof ih) != sizeof ih) return 1;
        init();
        TRY(CALL_DYN(cuIpcOpenMemHandle, &p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        stage("child-opened");
        say(sv[1]);
        hear(sv[1]); /* the parent freed it */
        stage("child-after-parent-freed");
        TRY(CALL_DYN(cuIpcCloseMemHandle, p));
        stage("child-closed");
        say(sv[1]);
        return 0;
    }
    init();
    CUdeviceptr p = 0;
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    stage("context");
    if (TRY(cuMemAlloc(&p, mib << 20)) != CUDA_SUCCESS) return 1;
    TRY(CALL_DYN(cuIpcGetMemHandle, &ih, p));
    if (write(sv[0], &ih, sizeof ih) != sizeof ih) perror("write");
    hear(sv[0]);
    TRY(cuMemFree(p));
    stage("parent-freed-while-open");
    say(sv[0]);
    hear(sv[0]);
    waitpid(child, NULL, 0);
    stage("child-gone");
    return 0;
}

/* In the child of a two-process case, `other`: another container (a ledger of its own, before any CUDA call). */
static void child_ledger(int other) {
    const char *l = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    static char buf[4096];
    if (!other || !l) return;
    snprintf(buf, sizeof buf, "%s-child", l);
    setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", buf, 1);
}

/* ipc-other (`other`: the child in another container) and ipc-outlive (`outlive`: the parent ends first). */
static int case_ipc_two(int other, int outlive) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
    pid_t parent = getpid(), child = fork();
    if (child == 0) {
        who = "child";
        child_ledger(other);
        CUipcMemHandle ih;
        CUdeviceptr p = 0, more = 0;
        if (read(sv[1], &ih, sizeof ih) != sizeof ih) return 1;
        init();
        TRY(CALL_DYN(cuIpcOpenMemHandle, &p, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        stage("child-opened");
        say(sv[1]);
        if (outlive) {
            while (kill(parent, 0) == 0) usleep(100000);
            stage("child-after-parent-ended");
        }
        TRY(cuMemAlloc(&more, mib << 20));
        stage("child-allocated-more");
        if (more) cuMemFree(more);
        TRY(CALL_DYN(cuIpcCloseMemHandle, p));
        stage("child-closed");
        return 0;
    }
    init();
    CUdeviceptr p = 0;
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    stage("context");
    if (TRY(cuMemAlloc(&p, mib << 20)) != CUDA_SUCCESS) return 1;
    TRY(CALL_DYN(cuIpcGetMemHandle, &ih, p));
    if (write(sv[0], &ih, sizeof ih) != sizeof ih) perror("write");
    hear(sv[0]);
    if (outlive) {
        stage("parent-ending");
        return 0; /* the child waits for this process to end */
    }
    waitpid(child, NULL, 0);
    stage("child-gone");
    return 0;
}

static unsigned long long reserved(CUmemoryPool pool) {
    unsigned long long v = 0;
    cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
    return v >> 20;
}

/* pool and pool-other (`other`: the child in another container). */
static int case_pool(int other) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return perror("socketpair"), 1;
    pid_t child = fork();
    if (child == 0) {
        who = "child";
        child_ledger(other);
        CUmemPoolPtrExportData data;
        CUmemoryPool pool = NULL;
        CUdeviceptr p = 0, more = 0;
        int fd = recv_fd(sv[1]);
        if (read(sv[1], &data, sizeof data) != sizeof data) return 1;
        init();
        TRY(CALL_DYN(cuMemPoolImportFromShareableHandle, &pool, (void *)(uintptr_t)fd,
                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        TRY(CALL_DYN(cuMemPoolImportPointer, &p, pool, &data));
        stage("child-imported");
        TRY(cuMemAlloc(&more, mib << 20));
        stage("child-allocated-more");
        if (more) cuMemFree(more);
        say(sv[1]);
        hear(sv[1]); /* the parent freed its pointer and destroyed the pool */
        stage("child-after-parent-destroyed");
        TRY(CALL_DYN(cuMemFreeAsync, p, NULL));
        cuCtxSynchronize();
        stage("child-freed");
        return 0;
    }
    init();
    CUmemPoolProps props;
    CUmemoryPool pool = NULL;
    CUmemPoolPtrExportData data;
    CUdeviceptr p = 0;
    int fd = -1;
    memset(&props, 0, sizeof props);
    memset(&data, 0, sizeof data);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    stage("context");
    if (TRY(cuMemPoolCreate(&pool, &props)) != CUDA_SUCCESS) return 1;
    if (TRY(cuMemAllocFromPoolAsync(&p, mib << 20, pool, NULL)) != CUDA_SUCCESS) return 1;
    cuCtxSynchronize();
    TRY(CALL_DYN(cuMemPoolExportToShareableHandle, &fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    TRY(CALL_DYN(cuMemPoolExportPointer, &data, p));
    if (send_fd(sv[0], fd) || write(sv[0], &data, sizeof data) != sizeof data) perror("send");
    hear(sv[0]);
    TRY(cuMemFreeAsync(p, NULL));
    cuCtxSynchronize();
    printf("%s: reserved_mib=%llu\n", who, reserved(pool));
    stage("parent-freed-while-imported");
    TRY(cuMemPoolTrimTo(pool, 0));
    printf("%s: reserved_mib=%llu\n", who, reserved(pool));
    stage("parent-trimmed");
    TRY(cuMemPoolDestroy(pool));
    stage("parent-destroyed-pool");
    say(sv[0]);
    waitpid(child, NULL, 0);
    stage("child-gone");
    return 0;
}

static int case_dmabuf(void) {
    init();
    printf("%s: dma_buf_supported=%d\n", who, attr(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED));
    CUdeviceptr p = 0;
    int fd = -1;
    stage("context");
    if (TRY(cuMemAlloc(&p, mib << 20)) != CUDA_SUCCESS) return 1;
    if (TRY(CALL_DYN(cuMemGetHandleForAddressRange, &fd, p, mib << 20, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)) ==
        CUDA_SUCCESS)
        identity(fd);
    stage("dmabuf");
    TRY(cuMemFree(p));
    stage("freed-while-open");
    if (fd >= 0) close(fd);
    stage("descriptor-closed");
    return 0;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (argc > 2) mib = strtoul(argv[2], NULL, 10);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(c, "export")) return case_export();
    if (!strcmp(c, "windows")) return case_windows();
    if (!strcmp(c, "sparse")) return case_sparse();
    if (!strcmp(c, "multicast")) return case_multicast();
    if (!strcmp(c, "ipc")) return case_ipc();
    if (!strcmp(c, "dmabuf")) return case_dmabuf();
    if (!strcmp(c, "ipc-other")) return case_ipc_two(1, 0);
    if (!strcmp(c, "ipc-outlive")) return case_ipc_two(0, 1);
    if (!strcmp(c, "pool")) return case_pool(0);
    if (!strcmp(c, "pool-other")) return case_pool(1);
    fprintf(stderr, "usage: %s export|windows|sparse|multicast|ipc|ipc-other|ipc-outlive|pool|pool-other|dmabuf [MiB]\n",
            argv[0]);
    return 2;
}
