/* Test client for the fake (and the real) CUDA driver. Built twice by build.sh:
 *   rt_client      reaches the driver like the CUDA runtime: dlopen("libcuda.so.1"), dlsym of
 *                  cuGetProcAddress_v2 (or cuGetProcAddress) only, every other entry point through it
 *                  (CLIENT_CUDA_VERSION, default 13000; CLIENT_PTDS=1 for per-thread default stream).
 *   linked_client  linked with -lcuda, calls the exported symbols.
 * Arguments are operations; each prints one line "op=NAME key=value ... rc=N err=NAME".
 * A leading '!' makes an operation required: if it fails the client prints "fatal op=NAME" and
 * exits 1 at once. '?' (or nothing) lets it fail. See tests/fake-driver.md for the list. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every driver function the client uses: (name as cuda.h spells it, name cuGetProcAddress knows). */
#define API(X)                                                                     \
    X(cuInit, "cuInit")                                                            \
    X(cuGraphAddEmptyNode, "cuGraphAddEmptyNode")                                  \
    X(cuGraphAddKernelNode, "cuGraphAddKernelNode")                                \
    X(cuGraphAddMemsetNode, "cuGraphAddMemsetNode")                                \
    X(cuDriverGetVersion, "cuDriverGetVersion")                                    \
    X(cuGetErrorName, "cuGetErrorName")                                            \
    X(cuDeviceGet, "cuDeviceGet")                                                  \
    X(cuDeviceGetCount, "cuDeviceGetCount")                                        \
    X(cuDeviceGetName, "cuDeviceGetName")                                          \
    X(cuDeviceGetUuid, "cuDeviceGetUuid")                                          \
    X(cuDeviceTotalMem, "cuDeviceTotalMem")                                        \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                        \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease")                      \
    X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset")                          \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                                          \
    X(cuDeviceGetDevResource, "cuDeviceGetDevResource")                            \
    X(cuDevResourceGenerateDesc, "cuDevResourceGenerateDesc")                      \
    X(cuGreenCtxCreate, "cuGreenCtxCreate")                                        \
    X(cuGreenCtxDestroy, "cuGreenCtxDestroy")                                      \
    X(cuCtxFromGreenCtx, "cuCtxFromGreenCtx")                                      \
    X(cuCtxSynchronize, "cuCtxSynchronize")                                        \
    X(cuCtxDestroy, "cuCtxDestroy")                                                \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute")                              \
    X(cuMemGetInfo, "cuMemGetInfo")                                                \
    X(cuMemAlloc, "cuMemAlloc")                                                    \
    X(cuMemAllocPitch, "cuMemAllocPitch")                                          \
    X(cuMemAllocManaged, "cuMemAllocManaged")                                      \
    X(cuMemAdvise_v2, "cuMemAdvise")                                               \
    X(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync")                                 \
    X(cuMemFree, "cuMemFree")                                                      \
    X(cuMemGetAddressRange, "cuMemGetAddressRange")                                \
    X(cuPointerGetAttribute, "cuPointerGetAttribute")                              \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                                      \
    X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange")              \
    X(cuMemcpyHtoD, "cuMemcpyHtoD")                                                \
    X(cuMemcpyDtoH, "cuMemcpyDtoH")                                                \
    X(cuMemcpyDtoD, "cuMemcpyDtoD")                                                \
    X(cuMemsetD8, "cuMemsetD8")                                                    \
    X(cuArrayCreate, "cuArrayCreate")                                              \
    X(cuArray3DCreate, "cuArray3DCreate")                                          \
    X(cuArrayDestroy, "cuArrayDestroy")                                            \
    X(cuArrayGetMemoryRequirements, "cuArrayGetMemoryRequirements")                \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate")                            \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy")                          \
    X(cuMipmappedArrayGetMemoryRequirements, "cuMipmappedArrayGetMemoryRequirements") \
    X(cuMemAllocHost, "cuMemAllocHost")                                            \
    X(cuMemFreeHost, "cuMemFreeHost")                                              \
    X(cuStreamCreate, "cuStreamCreate")                                            \
    X(cuStreamSynchronize, "cuStreamSynchronize")                                  \
    X(cuMemAllocAsync, "cuMemAllocAsync")                                          \
    X(cuMemFreeAsync, "cuMemFreeAsync")                                            \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync")                          \
    X(cuMemPoolCreate, "cuMemPoolCreate")                                          \
    X(cuMemPoolDestroy, "cuMemPoolDestroy")                                        \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo")                                          \
    X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute")                              \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool")                                    \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")              \
    X(cuMemCreate, "cuMemCreate")                                                  \
    X(cuMemRelease, "cuMemRelease")                                                \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle")                  \
    X(cuMemAddressReserve, "cuMemAddressReserve")                                  \
    X(cuMemAddressFree, "cuMemAddressFree")                                        \
    X(cuMemMap, "cuMemMap")                                                        \
    X(cuMemUnmap, "cuMemUnmap")                                                    \
    X(cuMemSetAccess, "cuMemSetAccess")                                            \
    X(cuGraphCreate, "cuGraphCreate")                                              \
    X(cuGraphDestroy, "cuGraphDestroy")                                            \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode")                            \
    X(cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode")                              \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")                  \
    X(cuGraphLaunch, "cuGraphLaunch")                                              \
    X(cuGraphExecDestroy, "cuGraphExecDestroy")                                    \
    X(cuDeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute")                \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim")                                \
    X(cuModuleLoadData, "cuModuleLoadData")                                        \
    X(cuModuleUnload, "cuModuleUnload")                                            \
    X(cuModuleGetFunction, "cuModuleGetFunction")                                  \
    X(cuLibraryLoadData, "cuLibraryLoadData")                                      \
    X(cuLibraryUnload, "cuLibraryUnload")                                          \
    X(cuLibraryGetModule, "cuLibraryGetModule")                                    \
    X(cuLibraryGetKernel, "cuLibraryGetKernel")                                    \
    X(cuKernelGetFunction, "cuKernelGetFunction")                                  \
    X(cuCtxSetLimit, "cuCtxSetLimit")                                              \
    X(cuCtxGetLimit, "cuCtxGetLimit")                                              \
    X(cuLaunchKernel, "cuLaunchKernel")

#define DECLARE(fn, name) static __typeof__(fn) *p_##fn;
API(DECLARE)

typedef CUresult (*getproc2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc1_t)(const char *, void **, int, cuuint64_t);
static getproc2_t getproc2;
static getproc1_t getproc1;
static int cuda_version = 13000;
static cuuint64_t proc_flags = CU_GET_PROC_ADDRESS_DEFAULT;

/* Calls a driver function; CUDA_ERROR_NOT_FOUND if it could not be resolved. */
#define CALL(fn, ...) (p_##fn ? p_##fn(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

static CUresult resolve(const char *name, void **pfn, int version, cuuint64_t flags, int *status) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult rc;
    *pfn = NULL;
    if (getproc2)
        rc = getproc2(name, pfn, version, flags, &st);
    else if (getproc1)
        rc = getproc1(name, pfn, version, flags);
    else
        rc = CUDA_ERROR_NOT_FOUND;
    if (status) *status = (int)st;
    return rc;
}

#ifdef RT_CLIENT
static int load_driver(void) {
    const char *lib = getenv("CLIENT_LIB");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("op=load rc=-1 err=%s\n", dlerror()); return -1; }
    getproc2 = (getproc2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!getproc2) getproc1 = (getproc1_t)dlsym(h, "cuGetProcAddress");
    if (!getproc2 && !getproc1) { printf("op=load rc=-1 err=no_cuGetProcAddress\n"); return -1; }
    int unresolved = 0;
#define RESOLVE(fn, name) if (resolve(name, (void **)&p_##fn, cuda_version, proc_flags, NULL) != CUDA_SUCCESS) unresolved++;
    API(RESOLVE)
    printf("op=load mode=runtime getproc=%s version=%d flags=%d unresolved=%d rc=0\n",
           getproc2 ? "cuGetProcAddress_v2" : "cuGetProcAddress", cuda_version, (int)proc_flags, unresolved);
    return 0;
}
#else
static int load_driver(void) {
#define LINK(fn, name) p_##fn = &fn;
    API(LINK)
    getproc2 = (getproc2_t)&cuGetProcAddress_v2;
    printf("op=load mode=linked rc=0\n");
    return 0;
}
#endif

/* ---- what the client holds ---- */
enum kind { K_DEV, K_ARRAY, K_MIPMAP, K_ASYNC, K_VMM, K_GRAPH, K_MODULE, K_CTX, K_HOST, K_LIBRARY, K_GREEN };
struct held {
    enum kind kind;
    CUdeviceptr ptr;
    size_t size;
    void *handle;                        /* array, mipmap, graph exec, module */
    void *handle2;                       /* graph */
    CUmemGenericAllocationHandle phys;   /* vmm */
};
static struct held *held;
static int nheld, capheld;
static int dev_ord = -1;
static CUdevice dev;
static CUcontext ctx;
static CUstream stream;
static CUmemoryPool pool;
static CUfunction kernel;
static int hold_at_exit;

static void push(struct held h) {
    if (nheld == capheld) {
        capheld = capheld ? capheld * 2 : 64;
        held = realloc(held, capheld * sizeof *held);
        if (!held) { perror("realloc"); exit(3); }
    }
    held[nheld++] = h;
}

static const char *errname(CUresult rc) {
    const char *s = NULL;
    if (rc == CUDA_ERROR_NOT_FOUND && !p_cuGetErrorName) return "CUDA_ERROR_NOT_FOUND";
    if (CALL(cuGetErrorName, rc, &s) != CUDA_SUCCESS || !s) return "UNKNOWN_CODE";
    return s;
}

/* Prints the end of an op line: rc and err. */
static void endline(CUresult rc) {
    if (rc == CUDA_SUCCESS) printf(" rc=0\n");
    else printf(" rc=%d err=%s\n", (int)rc, errname(rc));
    fflush(stdout);
}

static unsigned long long parse_size(const char *s) {
    char *end;
    unsigned long long n = strtoull(s, &end, 10);
    if (end == s) { fprintf(stderr, "client: bad size '%s'\n", s); exit(2); }
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    case 0: break;
    default: fprintf(stderr, "client: bad size '%s'\n", s); exit(2);
    }
    return n << shift;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static CUresult select_device(int ord) {
    CUresult rc = CALL(cuDeviceGet, &dev, ord);
    if (rc == CUDA_SUCCESS) rc = CALL(cuDevicePrimaryCtxRetain, &ctx, dev);
    if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, ctx);
    if (rc == CUDA_SUCCESS) { dev_ord = ord; stream = NULL; pool = NULL; kernel = NULL; }
    return rc;
}

/* Ops that need a context get device 0's primary context when none was chosen. */
static CUresult need_ctx(void) { return dev_ord >= 0 ? CUDA_SUCCESS : select_device(0); }

static CUresult need_stream(void) {
    CUresult rc = need_ctx();
    if (rc == CUDA_SUCCESS && !stream) rc = CALL(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
    return rc;
}

static unsigned long long pool_reserved(CUmemoryPool p) {
    cuuint64_t v = 0;
    if (p) CALL(cuMemPoolGetAttribute, p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
    return v;
}

static CUmemoryPool default_pool(void) {
    CUmemoryPool p = NULL;
    CALL(cuDeviceGetMemPool, &p, dev);
    return p;
}

static unsigned long long graph_reserved(void) {
    cuuint64_t v = 0;
    CALL(cuDeviceGetGraphMemAttribute, dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
    return v;
}

static CUresult free_one(struct held *h) {
    CUresult rc = CUDA_SUCCESS;
    switch (h->kind) {
    case K_DEV: rc = CALL(cuMemFree, h->ptr); break;
    case K_ARRAY: rc = CALL(cuArrayDestroy, (CUarray)h->handle); break;
    case K_MIPMAP: rc = CALL(cuMipmappedArrayDestroy, (CUmipmappedArray)h->handle); break;
    case K_ASYNC:
        rc = CALL(cuMemFreeAsync, h->ptr, stream);
        if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
        break;
    case K_VMM:
        rc = CALL(cuMemUnmap, h->ptr, h->size);
        if (rc == CUDA_SUCCESS && h->phys) rc = CALL(cuMemRelease, h->phys);
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemAddressFree, h->ptr, h->size);
        break;
    case K_GRAPH:
        rc = CALL(cuGraphExecDestroy, (CUgraphExec)h->handle);
        if (rc == CUDA_SUCCESS) rc = CALL(cuGraphDestroy, (CUgraph)h->handle2);
        break;
    case K_MODULE: rc = CALL(cuModuleUnload, (CUmodule)h->handle); kernel = NULL; break;
    case K_HOST: rc = CALL(cuMemFreeHost, h->handle); break;
    case K_LIBRARY: rc = CALL(cuLibraryUnload, (CUlibrary)h->handle); break;
    case K_CTX:
        /* Back to the primary context; streams and pools made in the destroyed one are gone. */
        rc = CALL(cuCtxDestroy, (CUcontext)h->handle);
        if (rc == CUDA_SUCCESS && ctx) rc = CALL(cuCtxSetCurrent, ctx);
        stream = NULL; pool = NULL; kernel = NULL;
        break;
    case K_GREEN:
        rc = CALL(cuGreenCtxDestroy, (CUgreenCtx)h->handle);
        if (rc == CUDA_SUCCESS && ctx) rc = CALL(cuCtxSetCurrent, ctx);
        stream = NULL; pool = NULL; kernel = NULL;
        break;
    }
    return rc;
}

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry vgpu_noop()\n"
    "{\n"
    "\tret;\n"
    "}\n";

static const char *kind_name[] = {"dev", "array", "mipmap", "async", "vmm", "graph", "module", "ctx", "host", "library",
                                  "green"};

/* threads op: each thread makes the primary context current and churns alloc/free pairs. */
/* bg-limit: a cuCtxSetLimit in another thread, left running (a fork may come meanwhile). */
struct limit_arg { CUlimit lim; size_t value; };
static void *limit_thread(void *p) {
    struct limit_arg *a = p;
    if (CALL(cuCtxSetCurrent, ctx) == CUDA_SUCCESS) CALL(cuCtxSetLimit, a->lim, a->value);
    return NULL;
}

struct churn_arg { long count; unsigned long long size; long oom; long pairs; CUresult rc; };

static void *churn_thread(void *p) {
    struct churn_arg *a = p;
    a->rc = CALL(cuCtxSetCurrent, ctx);
    for (; a->rc == CUDA_SUCCESS && a->pairs < a->count; a->pairs++) {
        CUdeviceptr d;
        a->rc = CALL(cuMemAlloc, &d, a->size);
        if (a->rc == CUDA_ERROR_OUT_OF_MEMORY) { a->oom++; a->rc = CUDA_SUCCESS; continue; }
        if (a->rc == CUDA_SUCCESS) a->rc = CALL(cuMemFree, d);
    }
    return NULL;
}

#include "appfds.h" /* closefds / pipes ops */
#include "mem_ops.h" /* charges to the object's device: sync2, pool-of, graph-on, vmm-export/import, truth */
#include "hold_ops.h" /* what keeps VMM memory alive: vmm-close-fd, vmm-import-path, vmm-windows, tile-*, mc-* */
#include "ipc_ops.h" /* legacy CUDA IPC, the importer: ipc-open, ipc-close */

/* Runs argv[i..]; returns the number of arguments consumed, or -1 on a required failure. */
static int run_op(int argc, char **argv, int i, int *required_failed) {
    const char *raw = argv[i];
    int required = raw[0] == '!';
    const char *op = (raw[0] == '!' || raw[0] == '?') ? raw + 1 : raw;
    int used = 1;
    int ok;
    CUresult rc = CUDA_SUCCESS;
#define ARG(k) (i + (k) < argc ? argv[i + (k)] : (fprintf(stderr, "client: %s needs %d argument(s)\n", op, k), exit(2), ""))

    if (strcmp(op, "fork")) printf("op=%s", op); /* fork prints its line in parent and child */
    if (!strcmp(op, "device")) {
        int n = atoi(ARG(1)); used = 2;
        rc = select_device(n);
        printf(" ord=%d", n);
    } else if (!strcmp(op, "current")) {
        /* Makes device N's primary context current, keeping the client's stream and pool of the device
         * chosen before (a thread that switches contexts while it keeps using another device's stream). */
        int n = atoi(ARG(1)); used = 2;
        CUdevice d = 0;
        CUcontext c = NULL;
        rc = need_stream();
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGet, &d, n);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDevicePrimaryCtxRetain, &c, d);
        if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, c);
        printf(" ord=%d", n);
    } else if (!strcmp(op, "info")) {
        size_t fr = 0, to = 0, dt = 0;
        char name[128] = "";
        CUuuid u;
        int count = 0;
        memset(&u, 0, sizeof u);
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemGetInfo, &fr, &to);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceTotalMem, &dt, dev);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGetUuid, &u, dev);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGetName, name, sizeof name, dev);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGetCount, &count);
        for (char *c = name; *c; c++) if (*c == ' ') *c = '_';
        unsigned char *b = (unsigned char *)u.bytes;
        printf(" ord=%d free=%zu total=%zu devtotal=%zu count=%d"
               " uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x name=%s",
               dev_ord, fr, to, dt, count, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
               b[12], b[13], b[14], b[15], name);
    } else if (!strcmp(op, "alloc") || !strcmp(op, "managed")) {
        unsigned long long n = parse_size(ARG(1)); used = 2;
        CUdeviceptr p = 0;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS)
            rc = op[0] == 'a' ? CALL(cuMemAlloc, &p, n) : CALL(cuMemAllocManaged, &p, n, CU_MEM_ATTACH_GLOBAL);
        if (rc == CUDA_SUCCESS) push((struct held){.kind = K_DEV, .ptr = p, .size = n});
        printf(" size=%llu ptr=0x%llx", n, (unsigned long long)p);
    } else if (!strcmp(op, "host")) {
        unsigned long long n = parse_size(ARG(1)); used = 2;
        void *p = NULL;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemAllocHost, &p, n);
        if (rc == CUDA_SUCCESS) { memset(p, 0x5a, n < 4096 ? n : 4096); push((struct held){.kind = K_HOST, .handle = p, .size = n}); }
        printf(" size=%llu ptr=%p", n, p);
    } else if (!strcmp(op, "pitch")) {
        unsigned long long w = parse_size(ARG(1)), hgt = parse_size(ARG(2)); used = 3;
        CUdeviceptr p = 0;
        size_t pitch = 0;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemAllocPitch, &p, &pitch, w, hgt, 4);
        if (rc == CUDA_SUCCESS) push((struct held){.kind = K_DEV, .ptr = p, .size = pitch * hgt});
        printf(" width=%llu height=%llu pitch=%zu bytes=%llu ptr=0x%llx", w, hgt, pitch, (unsigned long long)pitch * hgt,
               (unsigned long long)p);
    } else if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap")) {
        int is3d = !strcmp(op, "array3d"), mip = !strcmp(op, "mipmap");
        unsigned long long w = parse_size(ARG(1)), hgt = parse_size(ARG(2));
        unsigned long long d3 = (is3d || mip) ? parse_size(ARG(3)) : 0;
        used = (is3d || mip) ? 4 : 3;
        void *h = NULL;
        CUDA_ARRAY_MEMORY_REQUIREMENTS req;
        memset(&req, 0, sizeof req);
        CUresult rrc = CUDA_SUCCESS;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS && !is3d && !mip) {
            CUDA_ARRAY_DESCRIPTOR d = {.Width = w, .Height = hgt, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = CALL(cuArrayCreate, (CUarray *)&h, &d);
            if (rc == CUDA_SUCCESS) rrc = CALL(cuArrayGetMemoryRequirements, &req, (CUarray)h, dev);
        } else if (rc == CUDA_SUCCESS && is3d) {
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = w, .Height = hgt, .Depth = d3, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = CALL(cuArray3DCreate, (CUarray *)&h, &d);
            if (rc == CUDA_SUCCESS) rrc = CALL(cuArrayGetMemoryRequirements, &req, (CUarray)h, dev);
        } else if (rc == CUDA_SUCCESS) {
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = w, .Height = hgt, .Depth = 0, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = CALL(cuMipmappedArrayCreate, (CUmipmappedArray *)&h, &d, (unsigned)d3);
            if (rc == CUDA_SUCCESS) rrc = CALL(cuMipmappedArrayGetMemoryRequirements, &req, (CUmipmappedArray)h, dev);
        }
        if (rc == CUDA_SUCCESS) push((struct held){.kind = mip ? K_MIPMAP : K_ARRAY, .handle = h});
        printf(" width=%llu height=%llu", w, hgt);
        if (is3d) printf(" depth=%llu", d3);
        if (mip) printf(" levels=%llu", d3);
        printf(" req_size=%zu req_align=%zu req_rc=%d", req.size, req.alignment, (int)rrc);
    } else if (!strcmp(op, "async") || !strcmp(op, "pool")) {
        unsigned long long n = parse_size(ARG(1)); used = 2;
        CUdeviceptr p = 0;
        int own = op[0] == 'p';
        rc = need_stream();
        if (rc == CUDA_SUCCESS && own && !pool) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = dev;
            rc = CALL(cuMemPoolCreate, &pool, &props);
        }
        if (rc == CUDA_SUCCESS)
            rc = own ? CALL(cuMemAllocFromPoolAsync, &p, n, pool, stream) : CALL(cuMemAllocAsync, &p, n, stream);
        if (rc == CUDA_SUCCESS) push((struct held){.kind = K_ASYNC, .ptr = p, .size = n});
        printf(" size=%llu ptr=0x%llx reserved=%llu", n, (unsigned long long)p, pool_reserved(own ? pool : default_pool()));
    } else if (!strcmp(op, "vmm")) {
        unsigned long long n = parse_size(ARG(1)); used = 2;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t gran = 0;
        CUdeviceptr va = 0;
        CUmemGenericAllocationHandle ph = 0;
        rc = need_ctx();
        prop.location.id = dev;
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (rc == CUDA_SUCCESS) {
            n = (n + gran - 1) / gran * gran;
            rc = CALL(cuMemCreate, &ph, n, &prop, 0);
        }
        if (rc == CUDA_SUCCESS) {
            rc = CALL(cuMemAddressReserve, &va, n, 0, 0, 0);
            if (rc != CUDA_SUCCESS) CALL(cuMemRelease, ph);
        }
        if (rc == CUDA_SUCCESS) {
            rc = CALL(cuMemMap, va, n, 0, ph, 0);
            if (rc != CUDA_SUCCESS) { CALL(cuMemRelease, ph); CALL(cuMemAddressFree, va, n); }
        }
        if (rc == CUDA_SUCCESS) {
            CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            rc = CALL(cuMemSetAccess, va, n, &acc, 1);
            push((struct held){.kind = K_VMM, .ptr = va, .size = n, .phys = ph});
        }
        printf(" size=%llu granularity=%zu ptr=0x%llx", n, gran, (unsigned long long)va);
    } else if (!strcmp(op, "graph") || !strcmp(op, "graph-chain")) {
        /* graph SIZE: one alloc node and its free node; graph-chain N SIZE: N such pairs one after the
         * other (each alloc after the previous free), which need SIZE at a time, not N x SIZE. */
        int chain = op[5] == '-';
        unsigned long long pairs = chain ? parse_size(ARG(1)) : 1;
        unsigned long long n = parse_size(ARG(chain ? 2 : 1)); used = chain ? 3 : 2;
        CUgraph g = NULL;
        CUgraphExec ex = NULL;
        CUgraphNode an = NULL, fn = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS prm;
        memset(&prm, 0, sizeof prm);
        rc = need_stream();
        if (rc == CUDA_SUCCESS) rc = CALL(cuGraphCreate, &g, 0);
        for (unsigned long long i = 0; i < pairs && rc == CUDA_SUCCESS; i++) {
            prm.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prm.poolProps.location.id = dev;
            prm.bytesize = n;
            rc = CALL(cuGraphAddMemAllocNode, &an, g, fn ? &fn : NULL, fn ? 1 : 0, &prm);
            if (rc == CUDA_SUCCESS) rc = CALL(cuGraphAddMemFreeNode, &fn, g, &an, 1, prm.dptr);
        }
        if (rc == CUDA_SUCCESS) rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
        if (rc == CUDA_SUCCESS) rc = CALL(cuGraphLaunch, ex, stream);
        if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
        if (ex || g) push((struct held){.kind = K_GRAPH, .handle = ex, .handle2 = g});
        printf(" size=%llu ptr=0x%llx graph_reserved=%llu", n, (unsigned long long)prm.dptr, graph_reserved());
    } else if (!strcmp(op, "module")) {
        CUmodule m = NULL;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuModuleLoadData, &m, ptx);
        if (rc == CUDA_SUCCESS) {
            push((struct held){.kind = K_MODULE, .handle = m});
            rc = CALL(cuModuleGetFunction, &kernel, m, "vgpu_noop");
        }
    } else if (!strcmp(op, "library")) {
        CUlibrary l = NULL;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuLibraryLoadData, &l, ptx, NULL, NULL, 0, NULL, NULL, 0);
        if (rc == CUDA_SUCCESS) push((struct held){.kind = K_LIBRARY, .handle = l});
    } else if (!strcmp(op, "library-early")) {
        /* cuLibraryLoadData with whatever context is current: none before the first op that needs one. */
        CUlibrary l = NULL;
        rc = CALL(cuLibraryLoadData, &l, ptx, NULL, NULL, 0, NULL, NULL, 0);
        if (rc == CUDA_SUCCESS) push((struct held){.kind = K_LIBRARY, .handle = l});
    } else if (!strcmp(op, "library-module") || !strcmp(op, "library-kernel")) {
        /* The last library's first use in the current context: cuLibraryGetModule, or cuLibraryGetKernel
           and cuKernelGetFunction of its kernel. */
        CUlibrary l = NULL;
        for (int k = nheld - 1; k >= 0 && !l; k--)
            if (held[k].kind == K_LIBRARY) l = (CUlibrary)held[k].handle;
        rc = l ? need_ctx() : CUDA_ERROR_INVALID_VALUE;
        if (rc == CUDA_SUCCESS && op[8] == 'm') {
            CUmodule m = NULL;
            rc = CALL(cuLibraryGetModule, &m, l);
        } else if (rc == CUDA_SUCCESS) {
            CUkernel kern = NULL;
            CUfunction f = NULL;
            rc = CALL(cuLibraryGetKernel, &kern, l, "vgpu_noop");
            if (rc == CUDA_SUCCESS) rc = CALL(cuKernelGetFunction, &f, kern);
        }
    } else if (!strcmp(op, "library-launchable")) {
        /* The last library's kernel as the CUDA runtime launches it: the CUkernel handle itself becomes the
           kernel `launch` runs (no cuKernelGetFunction). */
        CUlibrary l = NULL;
        for (int k = nheld - 1; k >= 0 && !l; k--)
            if (held[k].kind == K_LIBRARY) l = (CUlibrary)held[k].handle;
        CUkernel kern = NULL;
        rc = l ? CALL(cuLibraryGetKernel, &kern, l, "vgpu_noop") : CUDA_ERROR_INVALID_VALUE;
        if (rc == CUDA_SUCCESS) kernel = (CUfunction)kern;
    } else if (!strcmp(op, "limit")) {
        const char *name = ARG(1);
        unsigned long long v = parse_size(ARG(2));
        CUlimit lim = !strcmp(name, "stack") ? CU_LIMIT_STACK_SIZE
                      : !strcmp(name, "printf") ? CU_LIMIT_PRINTF_FIFO_SIZE
                      : !strcmp(name, "heap") ? CU_LIMIT_MALLOC_HEAP_SIZE : (CUlimit)-1;
        size_t got = 0;
        used = 3;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetLimit, lim, (size_t)v);
        if (rc == CUDA_SUCCESS) rc = CALL(cuCtxGetLimit, &got, lim);
        printf(" limit=%s value=%llu got=%zu", name, v, got);
    } else if (!strcmp(op, "bg-limit")) {
        static struct limit_arg a;
        const char *name = ARG(1);
        a.value = (size_t)parse_size(ARG(2));
        a.lim = !strcmp(name, "stack") ? CU_LIMIT_STACK_SIZE : !strcmp(name, "printf") ? CU_LIMIT_PRINTF_FIFO_SIZE
                : CU_LIMIT_MALLOC_HEAP_SIZE;
        used = 3;
        pthread_t t;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS && pthread_create(&t, NULL, limit_thread, &a) != 0) rc = CUDA_ERROR_OPERATING_SYSTEM;
        if (rc == CUDA_SUCCESS) pthread_detach(t);
        printf(" limit=%s value=%zu", name, a.value);
    } else if (!strcmp(op, "launch")) {
        long n = atol(ARG(1)); used = 2;
        double t0 = now();
        long k = 0;
        rc = need_stream();
        if (rc == CUDA_SUCCESS && !kernel) rc = CUDA_ERROR_INVALID_HANDLE;
        for (; rc == CUDA_SUCCESS && k < n; k++) rc = CALL(cuLaunchKernel, kernel, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
        printf(" launched=%ld ns_per_launch=%.0f", k, k ? (now() - t0) * 1e9 / k : 0.0);
    } else if (!strcmp(op, "launch-nocur") || !strcmp(op, "launch-nocur-default")) {
        /* One launch of the loaded kernel (a CUkernel after library-launchable) with no context current:
           on the stream (it runs in the stream's context), or on the legacy default stream (which has no
           context then: the driver refuses it). The context is made current again after. */
        int on_default = !strcmp(op, "launch-nocur-default");
        rc = need_stream();
        if (rc == CUDA_SUCCESS && !kernel) rc = CUDA_ERROR_INVALID_HANDLE;
        if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, NULL);
        if (rc == CUDA_SUCCESS) {
            rc = CALL(cuLaunchKernel, kernel, 1, 1, 1, 32, 1, 1, 0, on_default ? NULL : stream, NULL, NULL);
            CALL(cuCtxSetCurrent, ctx);
        }
        if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
    } else if (!strcmp(op, "work") || !strcmp(op, "graph-work") || !strcmp(op, "graph-work-memset")) {
        /* work SECONDS: launch kernels for SECONDS of wall time, synchronising every 16 launches (a
         * saturating loop that never queues far ahead); graph-work SECONDS NODES: the same with a graph of
         * NODES nodes one after the other: kernel nodes of the loaded kernel (`module` first; the same
         * function and grid `launch` and `work` use), else empty nodes (each one kernel's time in the
         * fake); graph-work-memset: each of those nodes after a 4-byte memset node, as cuBLAS captures a
         * matmul. Prints launches, seconds taken, the longest a single launch call took (ms: how
         * long a throttle held the thread back at once) and when the loop started (CLOCK_MONOTONIC ms). */
        int g = op[0] == 'g', with_memset = g && strlen(op) > strlen("graph-work");
        double secs = atof(ARG(1));
        int nodes = g ? atoi(ARG(2)) : 1; used = g ? 3 : 2;
        CUgraph gr = NULL;
        CUgraphExec ex = NULL;
        CUgraphNode prev = NULL, node = NULL;
        CUdeviceptr word = 0;
        rc = need_stream();
        if (rc == CUDA_SUCCESS && !g && !kernel) rc = CUDA_ERROR_INVALID_HANDLE;
        if (rc == CUDA_SUCCESS && g) rc = CALL(cuGraphCreate, &gr, 0);
        if (rc == CUDA_SUCCESS && with_memset) rc = CALL(cuMemAlloc, &word, 4);
        for (int i = 0; g && rc == CUDA_SUCCESS && i < nodes; i++) {
            if (with_memset) {
                CUDA_MEMSET_NODE_PARAMS mp;
                memset(&mp, 0, sizeof mp);
                mp.dst = word;
                mp.elementSize = 1;
                mp.width = 4;
                mp.height = 1;
                rc = CALL(cuGraphAddMemsetNode, &node, gr, prev ? &prev : NULL, prev ? 1 : 0, &mp, ctx);
                if (rc != CUDA_SUCCESS) break;
                prev = node;
            }
            if (kernel) {
                CUDA_KERNEL_NODE_PARAMS kp;
                memset(&kp, 0, sizeof kp);
                kp.func = kernel;
                kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
                kp.blockDimX = 32;
                kp.blockDimY = kp.blockDimZ = 1;
                rc = CALL(cuGraphAddKernelNode, &node, gr, prev ? &prev : NULL, prev ? 1 : 0, &kp);
            } else {
                rc = CALL(cuGraphAddEmptyNode, &node, gr, prev ? &prev : NULL, prev ? 1 : 0);
            }
            prev = node;
        }
        if (rc == CUDA_SUCCESS && g) rc = CALL(cuGraphInstantiateWithFlags, &ex, gr, 0);
        double t0 = now(), longest = 0;
        long k = 0;
        while (rc == CUDA_SUCCESS && now() - t0 < secs) {
            double l0 = now();
            rc = g ? CALL(cuGraphLaunch, ex, stream)
                   : CALL(cuLaunchKernel, kernel, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
            if (now() - l0 > longest) longest = now() - l0;
            if (rc == CUDA_SUCCESS && ++k % 16 == 0) rc = CALL(cuStreamSynchronize, stream);
        }
        if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
        printf(" launched=%ld seconds=%.3f longest_launch_ms=%.1f started_ms=%.0f", k, now() - t0, longest * 1e3,
               t0 * 1e3);
        if (ex) CALL(cuGraphExecDestroy, ex);
        if (gr) CALL(cuGraphDestroy, gr);
        if (word) CALL(cuMemFree, word);
    } else if (!strcmp(op, "free-last")) {
        if (nheld == 0) rc = CUDA_ERROR_INVALID_VALUE;
        else {
            printf(" kind=%s", kind_name[held[nheld - 1].kind]);
            rc = free_one(&held[--nheld]);
        }
    } else if (!strcmp(op, "free-all")) {
        int n = 0;
        for (; nheld > 0; n++) {
            CUresult r = free_one(&held[--nheld]);
            if (r != CUDA_SUCCESS && rc == CUDA_SUCCESS) rc = r;
        }
        printf(" freed=%d", n);
    } else if (!strcmp(op, "free-bogus")) {
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemFree, (CUdeviceptr)0x7ead0000beef00ULL);
    } else if (!strcmp(op, "fill")) {
        unsigned long long n = parse_size(ARG(1)); used = 2;
        long count = 0;
        rc = need_ctx();
        while (rc == CUDA_SUCCESS) {
            CUdeviceptr p;
            rc = CALL(cuMemAlloc, &p, n);
            if (rc == CUDA_SUCCESS) { push((struct held){.kind = K_DEV, .ptr = p, .size = n}); count++; }
        }
        printf(" chunk=%llu count=%ld bytes=%llu", n, count, n * count);
    } else if (!strcmp(op, "churn")) {
        /* N alloc/free pairs of SIZE: the cost of the pair, for benchmarks. */
        long n = atol(ARG(1));
        unsigned long long sz = parse_size(ARG(2)); used = 3;
        long k = 0, oom = 0;
        rc = need_ctx();
        double t0 = now();
        for (; rc == CUDA_SUCCESS && k < n; k++) {
            CUdeviceptr p;
            rc = CALL(cuMemAlloc, &p, sz);
            if (rc == CUDA_ERROR_OUT_OF_MEMORY) { oom++; rc = CUDA_SUCCESS; continue; } /* others hold it: go on */
            if (rc == CUDA_SUCCESS) rc = CALL(cuMemFree, p);
        }
        printf(" pairs=%ld oom=%ld size=%llu ns_per_pair=%.0f", k, oom, sz, k ? (now() - t0) * 1e9 / k : 0.0);
    } else if (!strcmp(op, "threads")) {
        int nt = atoi(ARG(1));
        long count = atol(ARG(2));
        unsigned long long sz = parse_size(ARG(3)); used = 4;
        struct churn_arg args[64];
        pthread_t tids[64];
        if (nt < 1 || nt > 64) { fprintf(stderr, "client: threads: 1..64\n"); exit(2); }
        rc = need_ctx();
        double t0 = now();
        int started = 0;
        for (; rc == CUDA_SUCCESS && started < nt; started++) {
            args[started] = (struct churn_arg){.count = count, .size = sz};
            if (pthread_create(&tids[started], NULL, churn_thread, &args[started]) != 0) rc = CUDA_ERROR_OPERATING_SYSTEM;
        }
        long pairs = 0, oom = 0;
        for (int t = 0; t < started; t++) {
            pthread_join(tids[t], NULL);
            pairs += args[t].pairs; oom += args[t].oom;
            if (rc == CUDA_SUCCESS) rc = args[t].rc;
        }
        printf(" threads=%d pairs=%ld oom=%ld size=%llu ns_per_pair=%.0f", nt, pairs, oom, sz,
               pairs ? (now() - t0) * 1e9 / pairs : 0.0);
    } else if (!strcmp(op, "meminfo-loop")) {
        long n = atol(ARG(1)); used = 2;
        size_t fr, to;
        long k = 0;
        rc = need_ctx();
        double t0 = now();
        for (; rc == CUDA_SUCCESS && k < n; k++) rc = CALL(cuMemGetInfo, &fr, &to);
        printf(" calls=%ld ns_per_call=%.0f", k, k ? (now() - t0) * 1e9 / k : 0.0);
    } else if (!strcmp(op, "ctx")) {
        /* cuCtxCreate with the classic (3.2) signature, resolved the same way in both clients. */
        typedef CUresult (*ctxcreate_t)(CUcontext *, unsigned int, CUdevice);
        ctxcreate_t create = NULL;
        CUcontext c = NULL;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = resolve("cuCtxCreate", (void **)&create, 3020, CU_GET_PROC_ADDRESS_DEFAULT, NULL);
        if (rc == CUDA_SUCCESS) rc = create(&c, 0, dev);
        if (rc == CUDA_SUCCESS) { push((struct held){.kind = K_CTX, .handle = c}); stream = NULL; pool = NULL; kernel = NULL; }
    } else if (!strcmp(op, "green")) {
        /* A green context of all of device N's SMs (the client's device and context stay as they were
           chosen), its CUcontext made current: what follows is made in it. */
        int n = atoi(ARG(1)); used = 2;
        CUdevice d = 0;
        CUdevResource res;
        CUdevResourceDesc desc = NULL;
        CUgreenCtx g = NULL;
        CUcontext c = NULL;
        memset(&res, 0, sizeof res);
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGet, &d, n);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGetDevResource, d, &res, CU_DEV_RESOURCE_TYPE_SM);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDevResourceGenerateDesc, &desc, &res, 1);
        if (rc == CUDA_SUCCESS) rc = CALL(cuGreenCtxCreate, &g, desc, d, CU_GREEN_CTX_DEFAULT_STREAM);
        if (rc == CUDA_SUCCESS) {
            push((struct held){.kind = K_GREEN, .handle = g});
            rc = CALL(cuCtxFromGreenCtx, &c, g);
        }
        if (rc == CUDA_SUCCESS) rc = CALL(cuCtxSetCurrent, c);
        if (rc == CUDA_SUCCESS) { stream = NULL; pool = NULL; kernel = NULL; }
        printf(" ord=%d", n);
    } else if (!strcmp(op, "green-destroy")) {
        /* Destroys the last green context with what was made in it still allocated (those go with it). */
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_GREEN) k--;
        if (k < 0) rc = CUDA_ERROR_INVALID_VALUE;
        else {
            rc = free_one(&held[k]);
            nheld = k;
        }
    } else if (!strcmp(op, "threshold")) {
        cuuint64_t t = parse_size(ARG(1)); used = 2;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemPoolSetAttribute, default_pool(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t);
        printf(" bytes=%llu", (unsigned long long)t);
    } else if (!strcmp(op, "vmm-release") || !strcmp(op, "vmm-retain")) {
        /* On the last VMM allocation: vmm-release releases its handle at once, while mapped (the CUDA
         * samples' order); vmm-retain retains the handle from the address and releases that reference
         * (NCCL's order), leaving the allocation as it was. */
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_VMM) k--;
        if (k < 0 || !held[k].phys) {
            rc = CUDA_ERROR_INVALID_VALUE;
        } else if (!strcmp(op, "vmm-release")) {
            rc = CALL(cuMemRelease, held[k].phys);
            if (rc == CUDA_SUCCESS) held[k].phys = 0;
        } else {
            CUmemGenericAllocationHandle again = 0;
            rc = CALL(cuMemRetainAllocationHandle, &again, (void *)held[k].ptr);
            printf(" same=%d", again == held[k].phys);
            if (rc == CUDA_SUCCESS) rc = CALL(cuMemRelease, again);
        }
    } else if (!strcmp(op, "pool-destroy")) {
        /* Destroys the own pool with its allocations still live (they stay held and valid); the next
         * `pool` op creates a new one. */
        rc = pool ? CALL(cuMemPoolDestroy, pool) : CUDA_ERROR_INVALID_VALUE;
        if (rc == CUDA_SUCCESS) pool = NULL;
    } else if (!strcmp(op, "trim")) {
        CUmemoryPool dp = NULL;
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) dp = default_pool();
        if (rc == CUDA_SUCCESS && dp) rc = CALL(cuMemPoolTrimTo, dp, 0);
        if (rc == CUDA_SUCCESS && pool) rc = CALL(cuMemPoolTrimTo, pool, 0);
        if (rc == CUDA_SUCCESS) rc = CALL(cuDeviceGraphMemTrim, dev);
        printf(" reserved=%llu pool_reserved=%llu graph_reserved=%llu", pool_reserved(dp), pool_reserved(pool), graph_reserved());
    } else if (!strcmp(op, "sync")) {
        rc = need_ctx();
        if (rc == CUDA_SUCCESS && stream) rc = CALL(cuStreamSynchronize, stream);
        /* From CUDA 13 cuGetProcAddress gives cuCtxSynchronize_v2(ctx): called with NULL (the current
         * context), which the older entry point (no argument) ignores. */
        if (rc == CUDA_SUCCESS)
            rc = p_cuCtxSynchronize ? ((CUresult (*)(CUcontext))(void *)p_cuCtxSynchronize)(NULL) : CUDA_ERROR_NOT_FOUND;
        printf(" reserved=%llu", pool_reserved(default_pool()));
    } else if (!strcmp(op, "await")) {
        /* Waits (at most 60 s) until the file ARG exists: the host's go-ahead for the next step. */
        const char *path = ARG(1); used = 2;
        printf(" ready"); fflush(stdout);
        struct timespec t = {0, 10000000};
        int k = 0;
        while (access(path, F_OK) != 0 && k++ < 6000) nanosleep(&t, NULL);
        rc = access(path, F_OK) == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    } else if (!strcmp(op, "watch-total")) {
        /* Polls cuMemGetInfo until it reports a total of BYTES (at most SECONDS): how long a running
           process takes to see its quota changed. */
        unsigned long long want = parse_size(ARG(1));
        double limit_s = atof(ARG(2)); used = 3;
        size_t fr = 0, to = 0;
        rc = need_ctx();
        double t0 = now();
        while (rc == CUDA_SUCCESS && to != want && now() - t0 < limit_s) {
            rc = CALL(cuMemGetInfo, &fr, &to);
            if (to != want) { struct timespec t = {0, 1000000}; nanosleep(&t, NULL); }
        }
        if (rc == CUDA_SUCCESS && to != want) rc = CUDA_ERROR_NOT_READY;
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        printf(" total=%zu free=%zu ms=%.0f seen_ms=%lld", to, fr, (now() - t0) * 1e3,
               (long long)rt.tv_sec * 1000 + rt.tv_nsec / 1000000);
    } else if (!strcmp(op, "sleep")) {
        double s = atof(ARG(1)); used = 2;
        struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
    } else if (!strcmp(op, "wait")) {
        char line[64];
        printf(" ready"); fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) rc = CUDA_SUCCESS;
    } else if (!strcmp(op, "fork")) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) { printf("op=fork"); rc = CUDA_ERROR_OPERATING_SYSTEM; }
        else if (pid == 0) {
            /* The child: a new process for the driver; it forgets what the parent held. */
            nheld = 0; dev_ord = -1; stream = NULL; pool = NULL; kernel = NULL;
            printf("op=fork child=%d", (int)getpid());
            rc = CALL(cuInit, 0);
            endline(rc);
            return rc == CUDA_SUCCESS ? used : (*required_failed = required, -1);
        } else {
            int st = 0;
            waitpid(pid, &st, 0);
            printf("op=fork child=%d child_status=%d", (int)pid, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = CUDA_ERROR_UNKNOWN;
            endline(rc);
            return -2; /* the parent stops here: the child ran the remaining ops */
        }
    } else if (!strcmp(op, "memgetinfo-null")) {
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuMemGetInfo, NULL, NULL);
    } else if (!strcmp(op, "memcheck")) {
        /* Proves the last plain allocation is usable memory: memset, HtoD, DtoD, DtoH. */
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_DEV && held[k].kind != K_ASYNC && held[k].kind != K_VMM) k--;
        if (k < 0) rc = CUDA_ERROR_INVALID_VALUE;
        else {
            size_t n = held[k].size < 8192 ? held[k].size : 8192, half = n / 2;
            unsigned char *a = malloc(n), *b = malloc(n);
            for (size_t j = 0; j < half; j++) a[j] = (unsigned char)(j * 7 + 1);
            rc = CALL(cuMemsetD8, held[k].ptr, 0xab, n);
            if (rc == CUDA_SUCCESS) rc = CALL(cuMemcpyHtoD, held[k].ptr, a, half);
            if (rc == CUDA_SUCCESS && half) rc = CALL(cuMemcpyDtoD, held[k].ptr + half, held[k].ptr, half);
            if (rc == CUDA_SUCCESS) rc = CALL(cuMemcpyDtoH, b, held[k].ptr, n);
            int good = rc == CUDA_SUCCESS;
            for (size_t j = 0; good && j < 2 * half; j++) good = b[j] == a[j % half];
            if (good && n > 2 * half) good = b[n - 1] == 0xab;
            printf(" bytes=%zu ok=%d", n, good);
            if (rc == CUDA_SUCCESS && !good) rc = CUDA_ERROR_UNKNOWN;
            free(a); free(b);
        }
    } else if (!strcmp(op, "ismanaged")) {
        /* cuPointerGetAttribute(IS_MANAGED) and the device ordinal of the last plain allocation. */
        unsigned char m = 0;
        int ord = -1;
        if (nheld == 0 || held[nheld - 1].kind != K_DEV) rc = CUDA_ERROR_INVALID_VALUE;
        else rc = CALL(cuPointerGetAttribute, &m, CU_POINTER_ATTRIBUTE_IS_MANAGED, held[nheld - 1].ptr);
        if (rc == CUDA_SUCCESS) rc = CALL(cuPointerGetAttribute, &ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, held[nheld - 1].ptr);
        printf(" managed=%d devord=%d", m, ord);
    } else if (!strcmp(op, "advise-device") || !strcmp(op, "advise-host") || !strcmp(op, "prefetch-device")
               || !strcmp(op, "prefetch-host") || !strcmp(op, "advise-read-mostly")) {
        /* The last plain or managed allocation, whole: its preferred location set (cuMemAdvise, CUDA 13's
           location form) or advised read-mostly, or prefetched on the client's stream and waited for, to
           the device or the host. */
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev_ord};
        CUmem_advise advice = strstr(op, "read-mostly") ? CU_MEM_ADVISE_SET_READ_MOSTLY : CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
        if (strstr(op, "host")) loc.type = CU_MEM_LOCATION_TYPE_HOST;
        if (nheld == 0 || held[nheld - 1].kind != K_DEV) rc = CUDA_ERROR_INVALID_VALUE;
        else if (op[0] == 'a')
            rc = CALL(cuMemAdvise_v2, held[nheld - 1].ptr, held[nheld - 1].size, advice, loc);
        else {
            rc = need_stream();
            if (rc == CUDA_SUCCESS) rc = CALL(cuMemPrefetchAsync_v2, held[nheld - 1].ptr, held[nheld - 1].size, loc, 0, stream);
            if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
        }
        printf(" size=%zu", nheld ? held[nheld - 1].size : 0);
    } else if (!strcmp(op, "ipc")) {
        /* cuIpcGetMemHandle of the last plain allocation: its rc says whether it can be shared (handle=). */
        CUipcMemHandle h;
        if (nheld == 0 || held[nheld - 1].kind != K_DEV) rc = CUDA_ERROR_INVALID_VALUE;
        else rc = CALL(cuIpcGetMemHandle, &h, held[nheld - 1].ptr);
        if (rc == CUDA_SUCCESS) print_ipc_handle(&h);
    } else if (!strcmp(op, "dmabuf")) {
        /* cuMemGetHandleForAddressRange of the last plain allocation: a dma-buf descriptor, kept open. */
        int fd = -1;
        if (nheld == 0 || held[nheld - 1].kind != K_DEV) rc = CUDA_ERROR_INVALID_VALUE;
        else
            rc = CALL(cuMemGetHandleForAddressRange, &fd, held[nheld - 1].ptr, held[nheld - 1].size,
                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        printf(" fd=%d", fd);
    } else if (!strcmp(op, "addrrange")) {
        CUdeviceptr base = 0;
        size_t sz = 0;
        if (nheld == 0 || held[nheld - 1].kind != K_DEV) rc = CUDA_ERROR_INVALID_VALUE;
        else rc = CALL(cuMemGetAddressRange, &base, &sz, held[nheld - 1].ptr + held[nheld - 1].size / 2);
        printf(" base=0x%llx size=%zu", (unsigned long long)base, sz);
    } else if (!strcmp(op, "procaddr")) {
        const char *name = ARG(1);
        used = 2;
        int ver = cuda_version;
        cuuint64_t flags = proc_flags;
        if (i + 2 < argc && argv[i + 2][0] >= '0' && argv[i + 2][0] <= '9') { ver = atoi(argv[i + 2]); used++; }
        if (i + used < argc && !strcmp(argv[i + used], "ptds")) { flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; used++; }
        else if (i + used < argc && !strcmp(argv[i + used], "legacy")) { flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM; used++; }
        void *fp = NULL;
        int status = -1;
        rc = resolve(name, &fp, ver, flags, &status);
        Dl_info info;
        memset(&info, 0, sizeof info);
        const char *sym = fp && dladdr(fp, &info) && info.dli_sname ? info.dli_sname : "-";
        const char *file = fp && info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        printf(" name=%s version=%d flags=%d sym=%s lib=%s status=%d", name, ver, (int)flags, sym,
               file ? file + 1 : (fp && info.dli_fname ? info.dli_fname : "-"), status);
    } else if (!strcmp(op, "reset")) {
        rc = need_ctx();
        if (rc == CUDA_SUCCESS) rc = CALL(cuDevicePrimaryCtxReset, dev);
        if (rc == CUDA_SUCCESS) { nheld = 0; dev_ord = -1; stream = NULL; pool = NULL; kernel = NULL; }
    } else if (!strcmp(op, "closefds")) {
        int spared = 0, closed = close_fds(&spared);
        printf(" closed=%d spared=%d pipes=%d lowest=%d", closed, spared, napp_pipes, napp_pipes ? app_pipes[0][0] : -1);
        if (napp_pipes != NPIPES) rc = CUDA_ERROR_OPERATING_SYSTEM;
    } else if (!strcmp(op, "pipes")) {
        int err = 0, bad = check_pipes(&err);
        printf(" pipes=%d bad=%d errno=%d", napp_pipes, bad, err);
        if (bad) rc = CUDA_ERROR_OPERATING_SYSTEM;
    } else if (!strcmp(op, "hold")) {
        hold_at_exit = 1;
    } else if (mem_op(op, argc, argv, i, &used, &rc)) {
    } else if (hold_op(op, argc, argv, i, &used, &rc)) {
    } else if (ipc_op(op, argc, argv, i, &used, &rc)) {
    } else {
        fprintf(stderr, "client: unknown op '%s'\n", op);
        exit(2);
    }

    if (!strcmp(op, "fill")) ok = rc == CUDA_ERROR_OUT_OF_MEMORY;
    else if (!strcmp(op, "free-bogus") || !strcmp(op, "memgetinfo-null")) ok = rc == CUDA_ERROR_INVALID_VALUE;
    else ok = rc == CUDA_SUCCESS;
    endline(rc);
    if (!ok && required) {
        printf("fatal op=%s\n", op);
        fflush(stdout);
        *required_failed = 1;
        return -1;
    }
    return used;
}

int main(int argc, char **argv) {
    const char *v = getenv("CLIENT_CUDA_VERSION");
    if (v && *v) cuda_version = atoi(v);
    v = getenv("CLIENT_PTDS");
    if (v && !strcmp(v, "1")) proc_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (load_driver() != 0) return 1;
    CUresult rc = CALL(cuInit, 0);
    int ver = 0;
    CALL(cuDriverGetVersion, &ver);
    printf("op=init driver=%d pid=%d", ver, (int)getpid());
    endline(rc);
    if (rc != CUDA_SUCCESS) return 1;
    int failed = 0;
    for (int i = 1; i < argc;) {
        int n = run_op(argc, argv, i, &failed);
        if (n == -1) return 1;
        if (n == -2) break;
        i += n;
    }
    if (!hold_at_exit) {
        while (nheld > 0) free_one(&held[--nheld]);
        if (dev_ord >= 0) CALL(cuDevicePrimaryCtxRelease, dev);
    }
    return 0;
}
