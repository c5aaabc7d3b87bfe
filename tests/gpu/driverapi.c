/* driverapi: fills a GPU memory quota through each device-memory API of the CUDA driver, linked directly
 * to libcuda (built on the GPU machine with nvcc or gcc -lcuda; against the fake driver here).
 *
 *   driverapi fill KIND... [-c CHUNK_MIB] [-q QUOTA_BYTES]
 *       KIND: plain pitch array array3d async pool vmm graph managed (or "all" = every one but managed).
 *       For each kind, in one context: allocate CHUNK-sized pieces until the driver refuses, check the
 *       refusal, free everything, check that the memory came back. One JSON line per kind.
 *   driverapi hold [-b BYTES] [-c CHUNK_MIB]
 *       For the several-process cases: prints {"event":"ready"} once its context is up, waits for a line
 *       on stdin, allocates BYTES (or until refused) with cuMemAlloc in CHUNK pieces, prints
 *       {"event":"held",...}, waits for stdin to close, frees, prints {"event":"freed",...}.
 *
 *   driverapi measure
 *       What the driver takes for memory nobody asks for by size, as cuMemGetInfo's free drop (run bare to
 *       learn the driver, under the library to see what is charged): a second context, cuCtxSetLimit of the
 *       malloc heap (1 GiB), the printf FIFO (64 MiB) and the stack (4 KiB per thread), a launch after
 *       them, cuLibraryLoadData of a PTX kernel and its first cuLibraryGetKernel. One JSON line
 *       {"case":"measure","kind":K,"drop":BYTES,"bound":BYTES,"rc":N} per step (bound: libvgpu's computed
 *       charge for the limits, -1 elsewhere).
 *
 *   driverapi escape -q QUOTA_BYTES
 *       Patterns that once let memory escape the quota (issue "hard quota, exactly"), each repeated until
 *       the driver refuses (at most 8 rounds), keeping what every round left allocated: vmm-release (create,
 *       map, release the handle while mapped, as the CUDA samples do), vmm-retain (create, map, retain the
 *       handle from the address and release that reference, as NCCL does), pool-destroy (create a pool,
 *       allocate from it, destroy it with the allocation live). One JSON line per pattern with NVML's own
 *       figure for this process while it holds everything ("nvml_used", -1 without NVML): "ok" when that
 *       truth is within the quota and the last round was refused with out-of-memory.
 *
 * Checks per kind (all in the JSON line, "ok" is their conjunction):
 *   total_is_quota  cuMemGetInfo's total equals -q (skipped without -q)
 *   refused_oom     the fill ended with CUDA_ERROR_OUT_OF_MEMORY, not another error and not the cap
 *   within_free     granted <= what cuMemGetInfo called free before the fill
 *   filled          granted > free-before - 2 chunks: the refusal came at the quota, not far before it
 *   refused_at_end  at the refusal cuMemGetInfo's free was smaller than one chunk
 *   meminfo_tracks  after the i-th piece, free <= free-before - i * chunk (+ 2 MiB)
 *   returned        after freeing (and trimming pools), free is back within 2 MiB of free-before
 * A fill never goes past free-before + 1 chunk (the cap), so a quota that is not enforced cannot make
 * this program take the whole GPU (or, for managed memory, more than the GPU has).
 * Exit status: 0 all checks passed, 1 a check failed, 2 bad usage or setup failure.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)
#define TOLERANCE (2 * MIB)
#define MAX_PIECES 4096

static CUdevice dev;
static CUcontext ctx;
static CUstream stream;
static CUmemoryPool explicit_pool;
static size_t vmm_granularity;

struct piece {
    CUdeviceptr ptr;
    CUarray array;
    CUmemGenericAllocationHandle handle;
    CUgraph graph;
    CUgraphExec exec;
    size_t bytes;
};

static void setup_fail(const char *what, CUresult rc) {
    const char *name = NULL;
    cuGetErrorName(rc, &name);
    fprintf(stderr, "driverapi: %s failed: %s (%d)\n", what, name ? name : "?", (int)rc);
    exit(2);
}

static const char *err_name(CUresult rc) {
    const char *name = NULL;
    if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || !name) return "UNKNOWN";
    return name;
}

static CUresult meminfo(size_t *free_b, size_t *total_b) {
    return cuMemGetInfo(free_b, total_b);
}

/* Allocates one piece of about `bytes` with the given API; records what must be freed. `where` names the
 * call that refused, for the report. */
static CUresult alloc_piece(const char *kind, size_t bytes, struct piece *pc, const char **where) {
    CUresult rc;
    memset(pc, 0, sizeof *pc);
    pc->bytes = bytes;
    if (!strcmp(kind, "plain")) {
        *where = "cuMemAlloc";
        return cuMemAlloc(&pc->ptr, bytes);
    }
    if (!strcmp(kind, "pitch")) {
        size_t pitch = 0, width = 64 * 1024, height = bytes / width;
        *where = "cuMemAllocPitch";
        rc = cuMemAllocPitch(&pc->ptr, &pitch, width, height, 4);
        if (rc == CUDA_SUCCESS) pc->bytes = pitch * height;
        return rc;
    }
    if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {0};
        d.Width = 16384;
        d.Height = bytes / (16384 * 4);
        d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
        d.NumChannels = 4;
        *where = "cuArrayCreate";
        return cuArrayCreate(&pc->array, &d);
    }
    if (!strcmp(kind, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {0};
        d.Width = 1024;
        d.Height = 1024;
        d.Depth = bytes / (1024 * 1024 * 4);
        d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
        d.NumChannels = 4;
        *where = "cuArray3DCreate";
        return cuArray3DCreate(&pc->array, &d);
    }
    if (!strcmp(kind, "async") || !strcmp(kind, "pool")) {
        if (!strcmp(kind, "async")) {
            *where = "cuMemAllocAsync";
            rc = cuMemAllocAsync(&pc->ptr, bytes, stream);
        } else {
            *where = "cuMemAllocFromPoolAsync";
            rc = cuMemAllocFromPoolAsync(&pc->ptr, bytes, explicit_pool, stream);
        }
        if (rc != CUDA_SUCCESS) return rc;
        *where = "cuStreamSynchronize";
        rc = cuStreamSynchronize(stream);
        if (rc != CUDA_SUCCESS) pc->ptr = 0; /* a failed stream-ordered allocation leaves nothing */
        return rc;
    }
    if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = (int)dev;
        size_t sz = (bytes + vmm_granularity - 1) / vmm_granularity * vmm_granularity;
        pc->bytes = sz;
        *where = "cuMemCreate";
        if ((rc = cuMemCreate(&pc->handle, sz, &prop, 0)) != CUDA_SUCCESS) {
            pc->handle = 0;
            return rc;
        }
        *where = "cuMemAddressReserve";
        if ((rc = cuMemAddressReserve(&pc->ptr, sz, 0, 0, 0)) != CUDA_SUCCESS) {
            pc->ptr = 0;
            return rc;
        }
        *where = "cuMemMap";
        if ((rc = cuMemMap(pc->ptr, sz, 0, pc->handle, 0)) != CUDA_SUCCESS) return rc;
        CUmemAccessDesc acc = {0};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        *where = "cuMemSetAccess";
        return cuMemSetAccess(pc->ptr, sz, &acc, 1);
    }
    if (!strcmp(kind, "graph")) {
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = (int)dev;
        p.bytesize = bytes;
        CUgraphNode node;
        *where = "cuGraphCreate";
        if ((rc = cuGraphCreate(&pc->graph, 0)) != CUDA_SUCCESS) {
            pc->graph = 0;
            return rc;
        }
        *where = "cuGraphAddMemAllocNode";
        if ((rc = cuGraphAddMemAllocNode(&node, pc->graph, NULL, 0, &p)) != CUDA_SUCCESS) return rc;
        *where = "cuGraphInstantiateWithFlags";
        if ((rc = cuGraphInstantiateWithFlags(&pc->exec, pc->graph, 0)) != CUDA_SUCCESS) {
            pc->exec = 0;
            return rc;
        }
        *where = "cuGraphLaunch";
        if ((rc = cuGraphLaunch(pc->exec, stream)) != CUDA_SUCCESS) return rc;
        *where = "cuStreamSynchronize";
        if ((rc = cuStreamSynchronize(stream)) != CUDA_SUCCESS) return rc;
        pc->ptr = p.dptr; /* the allocation now lives until freed */
        return CUDA_SUCCESS;
    }
    if (!strcmp(kind, "managed")) {
        *where = "cuMemAllocManaged";
        return cuMemAllocManaged(&pc->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    }
    fprintf(stderr, "driverapi: unknown kind '%s'\n", kind);
    exit(2);
}

/* Frees whatever alloc_piece left behind, also after a partial failure. */
static void free_piece(const char *kind, struct piece *pc) {
    if (!strcmp(kind, "array") || !strcmp(kind, "array3d")) {
        if (pc->array) cuArrayDestroy(pc->array);
    } else if (!strcmp(kind, "async") || !strcmp(kind, "pool") || !strcmp(kind, "graph")) {
        if (pc->ptr) cuMemFreeAsync(pc->ptr, stream);
        cuStreamSynchronize(stream);
        if (pc->exec) cuGraphExecDestroy(pc->exec);
        if (pc->graph) cuGraphDestroy(pc->graph);
    } else if (!strcmp(kind, "vmm")) {
        if (pc->ptr) {
            cuMemUnmap(pc->ptr, pc->bytes);
            cuMemAddressFree(pc->ptr, pc->bytes);
        }
        if (pc->handle) cuMemRelease(pc->handle);
    } else if (pc->ptr) {
        cuMemFree(pc->ptr);
    }
    memset(pc, 0, sizeof *pc);
}

/* Gives pooled memory back to the driver so cuMemGetInfo can show it returned. */
static void trim(const char *kind) {
    if (!strcmp(kind, "async")) {
        CUmemoryPool pool;
        if (cuDeviceGetDefaultMemPool(&pool, dev) == CUDA_SUCCESS) cuMemPoolTrimTo(pool, 0);
    } else if (!strcmp(kind, "pool")) {
        cuMemPoolTrimTo(explicit_pool, 0);
    } else if (!strcmp(kind, "graph")) {
        cuDeviceGraphMemTrim(dev);
    }
    cuStreamSynchronize(stream); /* all work of this program runs on this stream */
}

static struct piece pieces[MAX_PIECES];

static int fill(const char *kind, size_t chunk, size_t quota) {
    size_t free0, total, f, t;
    CUresult rc;
    if ((rc = meminfo(&free0, &total)) != CUDA_SUCCESS) setup_fail("cuMemGetInfo", rc);
    if (!strcmp(kind, "pool")) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = (int)dev;
        if ((rc = cuMemPoolCreate(&explicit_pool, &props)) != CUDA_SUCCESS) setup_fail("cuMemPoolCreate", rc);
    }
    size_t cap = free0 + chunk, granted = 0, free_at_refusal = 0, worst_excess = 0;
    int n = 0, tracks = 1, capped = 0;
    const char *where = "";
    CUresult refused = CUDA_SUCCESS;
    while (n < MAX_PIECES) {
        if (granted + chunk > cap) {
            capped = 1;
            break;
        }
        rc = alloc_piece(kind, chunk, &pieces[n], &where);
        if (rc != CUDA_SUCCESS) {
            refused = rc;
            free_piece(kind, &pieces[n]);
            meminfo(&free_at_refusal, &t);
            break;
        }
        granted += pieces[n].bytes;
        n++;
        if (meminfo(&f, &t) != CUDA_SUCCESS) tracks = 0;
        /* free must have dropped by at least what was granted so far */
        size_t expect = free0 > granted ? free0 - granted : 0;
        if (f > expect + TOLERANCE) {
            tracks = 0;
            if (f - expect > worst_excess) worst_excess = f - expect;
        }
    }
    if (n == MAX_PIECES) capped = 1;
    for (int i = n - 1; i >= 0; i--) free_piece(kind, &pieces[i]);
    trim(kind);
    size_t free_end = 0;
    meminfo(&free_end, &t);
    if (!strcmp(kind, "pool")) {
        cuMemPoolDestroy(explicit_pool);
        explicit_pool = NULL;
    }

    int total_is_quota = quota ? total == quota : -1;
    int refused_oom = !capped && refused == CUDA_ERROR_OUT_OF_MEMORY;
    int within_free = granted <= free0;
    int filled = granted + 2 * chunk > free0;
    int refused_at_end = refused != CUDA_SUCCESS && free_at_refusal < chunk;
    int returned = free_end + TOLERANCE >= free0;
    int ok = total_is_quota != 0 && refused_oom && within_free && filled && refused_at_end && tracks && returned;
    printf("{\"case\":\"driverapi\",\"kind\":\"%s\",\"chunk\":%zu,\"quota\":%zu,\"total\":%zu,\"free_before\":%zu,"
           "\"granted\":%zu,\"pieces\":%d,\"refused\":\"%s\",\"refused_at\":\"%s\",\"free_at_refusal\":%zu,"
           "\"free_after\":%zu,\"worst_meminfo_excess\":%zu,\"capped\":%s,"
           "\"checks\":{\"total_is_quota\":%s,\"refused_oom\":%s,\"within_free\":%s,\"filled\":%s,"
           "\"refused_at_end\":%s,\"meminfo_tracks\":%s,\"returned\":%s},\"ok\":%s}\n",
           kind, chunk, quota, total, free0, granted, n, refused == CUDA_SUCCESS ? "" : err_name(refused),
           refused == CUDA_SUCCESS ? "" : where, free_at_refusal, free_end, worst_excess,
           capped ? "true" : "false", total_is_quota < 0 ? "null" : total_is_quota ? "true" : "false",
           refused_oom ? "true" : "false", within_free ? "true" : "false", filled ? "true" : "false",
           refused_at_end ? "true" : "false", tracks ? "true" : "false", returned ? "true" : "false",
           ok ? "true" : "false");
    fflush(stdout);
    return ok;
}

static int wait_line(void) {
    char buf[64];
    return fgets(buf, sizeof buf, stdin) != NULL;
}

static int hold(size_t want, size_t chunk) {
    size_t f, t;
    printf("{\"event\":\"ready\",\"pid\":%d}\n", (int)getpid());
    fflush(stdout);
    if (!wait_line()) return 2;
    size_t granted = 0;
    int n = 0;
    CUresult refused = CUDA_SUCCESS;
    while (n < MAX_PIECES && (want == 0 || granted < want)) {
        size_t sz = want && want - granted < chunk ? want - granted : chunk;
        CUresult rc = cuMemAlloc(&pieces[n].ptr, sz);
        if (rc != CUDA_SUCCESS) {
            refused = rc;
            break;
        }
        pieces[n++].bytes = sz;
        granted += sz;
    }
    meminfo(&f, &t);
    printf("{\"event\":\"held\",\"pid\":%d,\"want\":%zu,\"granted\":%zu,\"refused\":\"%s\",\"free\":%zu,"
           "\"total\":%zu}\n",
           (int)getpid(), want, granted, refused == CUDA_SUCCESS ? "" : err_name(refused), f, t);
    fflush(stdout);
    while (wait_line()) {
    }
    for (int i = 0; i < n; i++) cuMemFree(pieces[i].ptr);
    meminfo(&f, &t);
    printf("{\"event\":\"freed\",\"pid\":%d,\"free\":%zu,\"total\":%zu}\n", (int)getpid(), f, t);
    return 0;
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}

static void measured(const char *kind, size_t before, long long bound, CUresult rc) {
    long long drop = (long long)before - (long long)free_now();
    printf("{\"case\":\"measure\",\"kind\":\"%s\",\"drop\":%lld,\"bound\":%lld,\"rc\":%d}\n", kind, drop, bound,
           (int)rc);
    fflush(stdout);
}

static const char measure_ptx[] = ".version 8.0\n.target sm_75\n.address_size 64\n"
                                  ".visible .entry vgpu_noop()\n{\n\tret;\n}\n";

static int measure(void) {
    int sms = 0, threads = 0;
    cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
    size_t b = free_now(), old = 0;
    CUcontext second = NULL;
#if CUDA_VERSION >= 13000
    CUresult rc = cuCtxCreate(&second, NULL, 0, dev); /* CUDA 13: cuCtxCreate_v4 (creation params) */
#else
    CUresult rc = cuCtxCreate(&second, 0, dev);
#endif
    if (rc == CUDA_SUCCESS) cuCtxSetCurrent(ctx);
    measured("context", b, -1, rc);
    cuCtxGetLimit(&old, CU_LIMIT_MALLOC_HEAP_SIZE);
    b = free_now();
    measured("limit-heap", b, (long long)(1024 * MIB - old), cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1024 * MIB));
    cuCtxGetLimit(&old, CU_LIMIT_PRINTF_FIFO_SIZE);
    b = free_now();
    measured("limit-printf", b, (long long)(64 * MIB - old), cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 64 * MIB));
    cuCtxGetLimit(&old, CU_LIMIT_STACK_SIZE);
    b = free_now();
    measured("limit-stack", b, (long long)(4096 - old) * sms * threads, cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    CUlibrary lib = NULL;
    CUkernel kern = NULL;
    b = free_now();
    rc = cuLibraryLoadData(&lib, measure_ptx, NULL, NULL, 0, NULL, NULL, 0);
    measured("library-load", b, -1, rc);
    b = free_now();
    measured("library-get-kernel", b, -1, rc == CUDA_SUCCESS ? cuLibraryGetKernel(&kern, lib, "vgpu_noop") : rc);
    b = free_now();
    /* A CUkernel may be passed to cuLaunchKernel as a CUfunction (CUDA 12). */
    rc = kern ? cuLaunchKernel((CUfunction)kern, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) : CUDA_ERROR_NOT_FOUND;
    if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
    measured("first-launch", b, -1, rc);
    b = free_now();
    measured("limit-heap-shrink", b, -1, cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MIB));
    if (lib) cuLibraryUnload(lib);
    if (second) cuCtxDestroy(second);
    return 0;
}

/* NVML's figure for this process on device 0, read through libnvidia-ml directly (the interposer does
 * not virtualise per-process usage): the truth a quota is checked against. -1 without NVML. */
struct nvml_proc { unsigned pid; unsigned long long used; unsigned gi, ci; };
static long long nvml_self_used(void) {
    static void *lib;
    if (!lib && !(lib = dlopen("libnvidia-ml.so.1", RTLD_NOW))) return -1;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*procs)(void *, unsigned *, struct nvml_proc *) =
        (int (*)(void *, unsigned *, struct nvml_proc *))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    void *d = NULL;
    struct nvml_proc p[64];
    unsigned n = 64;
    if (!init || !by_index || !procs || init() != 0 || by_index(0, &d) != 0 || procs(d, &n, p) != 0) return -1;
    for (unsigned i = 0; i < n; i++)
        if (p[i].pid == (unsigned)getpid()) return (long long)p[i].used;
    return 0;
}

/* One escape pattern (see the header); returns 1 when the truth stayed within the quota. */
static int escape_one(const char *kind, size_t quota) {
    size_t chunk = (quota / 3 + vmm_granularity - 1) / vmm_granularity * vmm_granularity;
    CUdeviceptr va[8] = {0};
    CUdeviceptr ptrs[8] = {0};
    CUmemGenericAllocationHandle hs[8] = {0};
    int rounds = 0;
    CUresult rc = CUDA_SUCCESS;
    size_t granted = 0;
    for (; rounds < 8; rounds++) {
        if (!strncmp(kind, "vmm", 3)) {
            CUmemAllocationProp prop = {0};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = (int)dev;
            if ((rc = cuMemCreate(&hs[rounds], chunk, &prop, 0)) != CUDA_SUCCESS) break;
            if ((rc = cuMemAddressReserve(&va[rounds], chunk, 0, 0, 0)) != CUDA_SUCCESS) break;
            if ((rc = cuMemMap(va[rounds], chunk, 0, hs[rounds], 0)) != CUDA_SUCCESS) break;
            CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            cuMemSetAccess(va[rounds], chunk, &acc, 1);
            if (!strcmp(kind, "vmm-release")) {
                cuMemRelease(hs[rounds]);
                hs[rounds] = 0;
            } else {
                CUmemGenericAllocationHandle again = 0;
                if (cuMemRetainAllocationHandle(&again, (void *)va[rounds]) == CUDA_SUCCESS) cuMemRelease(again);
            }
        } else {
            CUmemPoolProps props = {0};
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = (int)dev;
            CUmemoryPool p;
            if ((rc = cuMemPoolCreate(&p, &props)) != CUDA_SUCCESS) break;
            rc = cuMemAllocFromPoolAsync(&ptrs[rounds], chunk, p, stream);
            cuStreamSynchronize(stream);
            cuMemPoolDestroy(p);
            if (rc != CUDA_SUCCESS) break;
        }
        granted += chunk;
    }
    long long truth = nvml_self_used();
    int ok = rc == CUDA_ERROR_OUT_OF_MEMORY && truth <= (long long)quota;
    printf("{\"case\":\"escape\",\"kind\":\"%s\",\"ok\":%d,\"rounds\":%d,\"granted\":%zu,\"chunk\":%zu,"
           "\"nvml_used\":%lld,\"last_rc\":%d}\n", kind, ok, rounds, granted, chunk, truth, (int)rc);
    fflush(stdout);
    for (int i = 0; i < 8; i++) {
        if (va[i]) {
            cuMemUnmap(va[i], chunk);
            if (hs[i]) cuMemRelease(hs[i]);
            cuMemAddressFree(va[i], chunk);
        } else if (hs[i]) {
            cuMemRelease(hs[i]);
        }
        if (ptrs[i]) cuMemFreeAsync(ptrs[i], stream);
    }
    cuStreamSynchronize(stream);
    return ok;
}

static void usage(void) {
    fprintf(stderr, "usage: driverapi fill KIND... [-c CHUNK_MIB] [-q QUOTA_BYTES]\n"
                    "       driverapi hold [-b BYTES] [-c CHUNK_MIB]\n"
                    "       driverapi measure\n"
                    "       driverapi escape -q QUOTA_BYTES\n");
    exit(2);
}

static unsigned long long num(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || end == s) {
        fprintf(stderr, "driverapi: expected a number, got '%s'\n", s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *kinds[32];
    int nk = 0;
    size_t chunk = 256 * MIB, quota = 0, want = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-c") && i + 1 < argc) chunk = num(argv[++i]) * MIB;
        else if (!strcmp(argv[i], "-q") && i + 1 < argc) quota = num(argv[++i]);
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) want = num(argv[++i]);
        else if (argv[i][0] != '-' && nk < 32) kinds[nk++] = argv[i];
        else usage();
    }
    if (chunk == 0) usage();
    CUresult rc;
    if ((rc = cuInit(0)) != CUDA_SUCCESS) setup_fail("cuInit", rc);
    if ((rc = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS) setup_fail("cuDeviceGet", rc);
    if ((rc = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) setup_fail("cuDevicePrimaryCtxRetain", rc);
    if ((rc = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) setup_fail("cuCtxSetCurrent", rc);

    if (!strcmp(argv[1], "hold")) return hold(want, chunk);
    if (!strcmp(argv[1], "measure")) return measure();
    int escape = !strcmp(argv[1], "escape");
    if ((strcmp(argv[1], "fill") != 0 || nk == 0) && !(escape && quota)) usage();

    if ((rc = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) setup_fail("cuStreamCreate", rc);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    rc = cuMemGetAllocationGranularity(&vmm_granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rc != CUDA_SUCCESS || vmm_granularity == 0) vmm_granularity = 2 * MIB;
    if (escape) {
        int ok = escape_one("vmm-release", quota);
        ok &= escape_one("vmm-retain", quota);
        ok &= escape_one("pool-destroy", quota);
        return ok ? 0 : 1;
    }

    static const char *every[] = {"plain", "pitch", "array", "array3d", "async", "pool", "vmm", "graph"};
    int failed = 0;
    for (int k = 0; k < nk; k++) {
        if (!strcmp(kinds[k], "all")) {
            for (size_t j = 0; j < sizeof every / sizeof *every; j++) failed |= !fill(every[j], chunk, quota);
        } else {
            failed |= !fill(kinds[k], chunk, quota);
        }
    }
    return failed ? 1 : 0;
}
