/* The client's ops for charges made to the device of the object (issue 23 items 1, 2, 5, 7), included by
 * client.c after its helpers (CALL, held/push, need_stream, dev, stream, parse_size, resolve). Driver
 * functions newer than the headers the client is built with are resolved here with cuGetProcAddress.
 *   sync2                 cuCtxSynchronize_v2(NULL), as CUDA 13's cudaDeviceSynchronize calls it
 *   nocontext             no context current on this thread (the client's stream and pool stay)
 *   pool-of DEV SIZE      cuMemAllocFromPoolAsync from device DEV's current pool on the client's stream
 *   graph-on DEV N SIZE   a graph of N independent alloc/free pairs of SIZE on device DEV, launched
 *   async-default SIZE    cuMemAllocAsync on the legacy default stream (NULL), kept
 *   free-async            cuMemFreeAsync of the last stream-ordered allocation, no synchronisation
 *   vmm-fd SIZE           as vmm, the handle made exportable as a POSIX descriptor (requestedHandleTypes)
 *   vmm-export            exports the last VMM allocation's handle to a POSIX descriptor
 *   vmm-import            imports that descriptor, maps the imported handle (held as a VMM allocation)
 *   vmm-drop-first        unmaps and releases the first VMM allocation held (the exported one)
 *   truth DEV             this process's memory on device DEV as NVML's process list says (unhooked:
 *                         used=), and the container's as the hooked nvmlDeviceGetMemoryInfo says (ledger=) */
#ifndef MEM_OPS_H
#define MEM_OPS_H

typedef CUresult (*ctxsync2_t)(CUcontext);
typedef CUresult (*export_t)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
typedef CUresult (*import_t)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
static int shared_fd = -1;

/* A driver function by the name cuGetProcAddress knows, at CUDA `version`. */
static void *mem_proc(const char *name, int version) {
    void *p = NULL;
    if (resolve(name, &p, version, proc_flags, NULL) != CUDA_SUCCESS) return NULL;
    return p;
}

/* This process's used bytes on NVML device `index` (and in *ledger what nvmlDeviceGetMemoryInfo says is
 * used: the container's ledger under the library), -1 if NVML cannot say. */
static long long nvml_own_used(unsigned index, long long *ledger) {
    typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*byidx)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*procs)(void *, unsigned *, proc_t *) =
        (int (*)(void *, unsigned *, proc_t *))dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    typedef struct { unsigned long long total, free, used; } mem_t;
    int (*info)(void *, mem_t *) = (int (*)(void *, mem_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    void *d = NULL;
    proc_t list[64];
    unsigned n = 64;
    mem_t m = {0, 0, 0};
    if (!init || !byidx || !procs || init() || byidx(index, &d) || procs(d, &n, list)) return -1;
    *ledger = info && info(d, &m) == 0 ? (long long)m.used : -1;
    long long used = 0;
    for (unsigned k = 0; k < n; k++)
        if (list[k].pid == (unsigned)getpid()) used += (long long)list[k].used;
    return used;
}

/* Maps `ph` (size n) at a new address with read-write access from device `dev`; pushes it as held. */
static CUresult map_held(CUmemGenericAllocationHandle ph, size_t n) {
    CUdeviceptr va = 0;
    CUresult rc = CALL(cuMemAddressReserve, &va, n, 0, 0, 0);
    if (rc == CUDA_SUCCESS) {
        rc = CALL(cuMemMap, va, n, 0, ph, 0);
        if (rc != CUDA_SUCCESS) CALL(cuMemAddressFree, va, n);
    }
    if (rc == CUDA_SUCCESS) {
        CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        rc = CALL(cuMemSetAccess, va, n, &acc, 1);
        push((struct held){.kind = K_VMM, .ptr = va, .size = n, .phys = ph});
    }
    return rc;
}

/* Runs op `op` at argv[i] if it is one of these; returns 1 if it was (with *used and *rc set). */
static int mem_op(const char *op, int argc, char **argv, int i, int *used, CUresult *rc) {
#define MARG(k) (i + (k) < argc ? argv[i + (k)] : (fprintf(stderr, "client: %s needs %d argument(s)\n", op, k), exit(2), ""))
    if (!strcmp(op, "sync2")) {
        ctxsync2_t f = (ctxsync2_t)mem_proc("cuCtxSynchronize", 13000);
        *rc = need_ctx();
        if (*rc == CUDA_SUCCESS) *rc = f ? f(NULL) : CUDA_ERROR_NOT_FOUND;
        printf(" reserved=%llu", pool_reserved(default_pool()));
    } else if (!strcmp(op, "nocontext")) {
        *rc = need_stream();
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuCtxSetCurrent, NULL);
    } else if (!strcmp(op, "pool-of")) {
        int d = atoi(MARG(1));
        unsigned long long n = parse_size(MARG(2));
        *used = 3;
        CUdevice dv = 0;
        CUmemoryPool p = NULL;
        CUdeviceptr ptr = 0;
        *rc = need_stream();
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuDeviceGet, &dv, d);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuDeviceGetMemPool, &p, dv);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuMemAllocFromPoolAsync, &ptr, n, p, stream);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuStreamSynchronize, stream);
        /* kept (freed at exit on the client's stream) */
        if (ptr) push((struct held){.kind = K_ASYNC, .ptr = ptr, .size = n});
        printf(" dev=%d size=%llu reserved=%llu", d, n, pool_reserved(p));
    } else if (!strcmp(op, "graph-on")) {
        int d = atoi(MARG(1));
        unsigned long long pairs = parse_size(MARG(2)), n = parse_size(MARG(3));
        *used = 4;
        CUgraph g = NULL;
        CUgraphExec ex = NULL;
        *rc = need_stream();
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuGraphCreate, &g, 0);
        for (unsigned long long k = 0; k < pairs && *rc == CUDA_SUCCESS; k++) {
            CUDA_MEM_ALLOC_NODE_PARAMS prm;
            CUgraphNode an = NULL, fn = NULL;
            memset(&prm, 0, sizeof prm);
            prm.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            prm.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prm.poolProps.location.id = d;
            prm.bytesize = n;
            *rc = CALL(cuGraphAddMemAllocNode, &an, g, NULL, 0, &prm);
            if (*rc == CUDA_SUCCESS) *rc = CALL(cuGraphAddMemFreeNode, &fn, g, &an, 1, prm.dptr);
        }
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuGraphInstantiateWithFlags, &ex, g, 0);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuGraphLaunch, ex, stream);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuStreamSynchronize, stream);
        if (ex || g) push((struct held){.kind = K_GRAPH, .handle = ex, .handle2 = g});
        cuuint64_t r = 0;
        CUdevice dv = 0;
        CALL(cuDeviceGet, &dv, d);
        CALL(cuDeviceGetGraphMemAttribute, dv, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &r);
        printf(" dev=%d pairs=%llu size=%llu graph_reserved=%llu", d, pairs, n, (unsigned long long)r);
    } else if (!strcmp(op, "async-default")) {
        unsigned long long n = parse_size(MARG(1));
        CUdeviceptr ptr = 0;
        *used = 2;
        *rc = CALL(cuMemAllocAsync, &ptr, n, NULL);
        if (*rc == CUDA_SUCCESS) push((struct held){.kind = K_ASYNC, .ptr = ptr, .size = n});
        printf(" size=%llu", n);
    } else if (!strcmp(op, "free-async")) {
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_ASYNC) k--;
        if (k < 0) *rc = CUDA_ERROR_INVALID_VALUE;
        else {
            *rc = CALL(cuMemFreeAsync, held[k].ptr, stream);
            if (*rc == CUDA_SUCCESS) { memmove(&held[k], &held[k + 1], (nheld - k - 1) * sizeof *held); nheld--; }
        }
    } else if (!strcmp(op, "vmm-fd")) {
        unsigned long long n = parse_size(MARG(1));
        *used = 2;
        CUmemAllocationProp prop;
        size_t gran = 0;
        CUmemGenericAllocationHandle ph = 0;
        memset(&prop, 0, sizeof prop);
        *rc = need_ctx();
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (*rc == CUDA_SUCCESS) {
            n = (n + gran - 1) / gran * gran;
            *rc = CALL(cuMemCreate, &ph, n, &prop, 0);
        }
        if (*rc == CUDA_SUCCESS) {
            *rc = map_held(ph, n);
            if (*rc != CUDA_SUCCESS) CALL(cuMemRelease, ph);
        }
        printf(" size=%llu", n);
    } else if (!strcmp(op, "vmm-export")) {
        export_t f = (export_t)mem_proc("cuMemExportToShareableHandle", cuda_version);
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_VMM) k--;
        if (!f) *rc = CUDA_ERROR_NOT_FOUND;
        else if (k < 0 || !held[k].phys) *rc = CUDA_ERROR_INVALID_VALUE;
        else *rc = f(&shared_fd, held[k].phys, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf(" fd=%d", shared_fd);
    } else if (!strcmp(op, "vmm-import")) {
        import_t f = (import_t)mem_proc("cuMemImportFromShareableHandle", cuda_version);
        int k = nheld - 1;
        while (k >= 0 && held[k].kind != K_VMM) k--;
        CUmemGenericAllocationHandle ph = 0;
        if (!f) *rc = CUDA_ERROR_NOT_FOUND;
        else if (k < 0 || shared_fd < 0) *rc = CUDA_ERROR_INVALID_VALUE;
        else *rc = f(&ph, (void *)(uintptr_t)shared_fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (*rc == CUDA_SUCCESS) {
            *rc = map_held(ph, held[k].size);
            if (*rc != CUDA_SUCCESS) CALL(cuMemRelease, ph);
        }
        printf(" size=%zu same=%d", k >= 0 ? held[k].size : (size_t)0, k >= 0 && ph == held[k].phys);
    } else if (!strcmp(op, "vmm-drop-first")) {
        int k = 0;
        while (k < nheld && held[k].kind != K_VMM) k++;
        if (k == nheld) *rc = CUDA_ERROR_INVALID_VALUE;
        else {
            *rc = free_one(&held[k]);
            if (*rc == CUDA_SUCCESS) { memmove(&held[k], &held[k + 1], (nheld - k - 1) * sizeof *held); nheld--; }
        }
    } else if (!strcmp(op, "truth")) {
        int d = atoi(MARG(1));
        *used = 2;
        long long ledger = -1, u = nvml_own_used((unsigned)d, &ledger);
        printf(" dev=%d used=%lld ledger=%lld", d, u, ledger);
        if (u < 0) *rc = CUDA_ERROR_NOT_FOUND;
    } else {
        return 0;
    }
    return 1;
#undef MARG
}

#endif
