/* allocbench: what one CUDA driver call costs, measured the way the CUDA runtime reaches the driver.
 *
 * The driver is opened with dlopen and every entry point is fetched with cuGetProcAddress_v2 (what the
 * runtime has done since CUDA 11.3), so with LD_PRELOAD=libvgpu.so the interposer sees exactly the path
 * an application's calls take. The same program runs against the fake driver (make bench) and the real
 * one (tests/gpu/run.sh).
 *
 *   allocbench pair    [-n ITERS] [-r REPS] [-s BYTES]   ns per cuMemAlloc_v2 + cuMemFree_v2 pair
 *   allocbench meminfo [-n ITERS] [-r REPS]              ns per cuMemGetInfo_v2
 *   allocbench launch  [-n ITERS] [-r REPS]              ns per cuLaunchKernel of an empty kernel
 *   allocbench procs   -p NPROC [-n ITERS] [-s BYTES]    aggregate pairs/s of NPROC processes at once
 *
 * Each measurement prints one JSON line on stdout. Per-call figures are the median over REPS
 * repetitions of ITERS calls (after a warm-up), with the best repetition alongside.
 * Environment: BENCH_LIBCUDA names the driver to dlopen (default libcuda.so.1);
 * BENCH_RESOLVE=dlsym resolves the _v2 symbols with dlsym instead of cuGetProcAddress_v2.
 * Exit status: 0 on success, 1 on a driver error (printed on stderr), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef CUresult (*getproc_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*devget_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*setcur_t)(CUcontext);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*info_t)(size_t *, size_t *);
typedef CUresult (*modload_t)(CUmodule *, const void *);
typedef CUresult (*getfn_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
typedef CUresult (*sync_t)(void);

static struct {
    init_t init;
    devget_t device_get;
    retain_t primary_retain;
    setcur_t set_current;
    alloc_t alloc;
    free_t free;
    info_t info;
    modload_t module_load;
    getfn_t get_function;
    launch_t launch;
    sync_t sync;
} cu;

/* An empty kernel in PTX: the driver JIT-compiles it for whatever GPU is present. */
static const char noop_ptx[] =
    ".version 8.0\n"
    ".target sm_80\n"
    ".address_size 64\n"
    ".visible .entry noop()\n"
    "{\n"
    "    ret;\n"
    "}\n";

static void die(const char *what, CUresult rc) {
    fprintf(stderr, "allocbench: %s failed: CUresult %d\n", what, (int)rc);
    exit(1);
}

static void *resolve(void *lib, getproc_t getproc, const char *base, const char *versioned) {
    void *fn = NULL;
    if (getproc) {
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        /* 12000: what a CUDA 12.0 runtime asks for; it maps base names to their _v2 entry points. */
        CUresult rc = getproc(base, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
        if (rc != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS) fn = NULL;
    } else {
        fn = dlsym(lib, versioned);
    }
    if (!fn) {
        fprintf(stderr, "allocbench: cannot resolve %s\n", versioned);
        exit(1);
    }
    return fn;
}

static void load_driver(void) {
    const char *path = getenv("BENCH_LIBCUDA");
    if (!path || !*path) path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "allocbench: dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
    const char *how = getenv("BENCH_RESOLVE");
    getproc_t gp = NULL;
    if (!how || strcmp(how, "dlsym") != 0) {
        gp = (getproc_t)dlsym(lib, "cuGetProcAddress_v2");
        if (!gp) {
            fprintf(stderr, "allocbench: %s has no cuGetProcAddress_v2\n", path);
            exit(1);
        }
    }
    cu.init = (init_t)resolve(lib, gp, "cuInit", "cuInit");
    cu.device_get = (devget_t)resolve(lib, gp, "cuDeviceGet", "cuDeviceGet");
    cu.primary_retain = (retain_t)resolve(lib, gp, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    cu.set_current = (setcur_t)resolve(lib, gp, "cuCtxSetCurrent", "cuCtxSetCurrent");
    cu.alloc = (alloc_t)resolve(lib, gp, "cuMemAlloc", "cuMemAlloc_v2");
    cu.free = (free_t)resolve(lib, gp, "cuMemFree", "cuMemFree_v2");
    cu.info = (info_t)resolve(lib, gp, "cuMemGetInfo", "cuMemGetInfo_v2");
    cu.module_load = (modload_t)resolve(lib, gp, "cuModuleLoadData", "cuModuleLoadData");
    cu.get_function = (getfn_t)resolve(lib, gp, "cuModuleGetFunction", "cuModuleGetFunction");
    cu.launch = (launch_t)resolve(lib, gp, "cuLaunchKernel", "cuLaunchKernel");
    cu.sync = (sync_t)resolve(lib, gp, "cuCtxSynchronize", "cuCtxSynchronize");
}

static void context_up(void) {
    CUresult rc;
    CUdevice dev;
    CUcontext ctx;
    if ((rc = cu.init(0)) != CUDA_SUCCESS) die("cuInit", rc);
    if ((rc = cu.device_get(&dev, 0)) != CUDA_SUCCESS) die("cuDeviceGet", rc);
    if ((rc = cu.primary_retain(&ctx, dev)) != CUDA_SUCCESS) die("cuDevicePrimaryCtxRetain", rc);
    if ((rc = cu.set_current(ctx)) != CUDA_SUCCESS) die("cuCtxSetCurrent", rc);
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void pair_loop(long iters, size_t bytes) {
    for (long i = 0; i < iters; i++) {
        CUdeviceptr p;
        CUresult rc = cu.alloc(&p, bytes);
        if (rc != CUDA_SUCCESS) die("cuMemAlloc_v2", rc);
        if ((rc = cu.free(p)) != CUDA_SUCCESS) die("cuMemFree_v2", rc);
    }
}

static void info_loop(long iters) {
    size_t free_b, total_b;
    for (long i = 0; i < iters; i++) {
        CUresult rc = cu.info(&free_b, &total_b);
        if (rc != CUDA_SUCCESS) die("cuMemGetInfo_v2", rc);
    }
}

static CUfunction noop_fn;

static void launch_loop(long iters) {
    for (long i = 0; i < iters; i++) {
        CUresult rc = cu.launch(noop_fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        if (rc != CUDA_SUCCESS) die("cuLaunchKernel", rc);
    }
    CUresult rc = cu.sync();
    if (rc != CUDA_SUCCESS) die("cuCtxSynchronize", rc);
}

/* Runs REPS repetitions of ITERS calls and prints ns per call (median and best). */
static void per_call(const char *name, int mode, long iters, int reps, size_t bytes) {
    double *ns = calloc((size_t)reps, sizeof *ns);
    long warm = iters / 10 > 0 ? iters / 10 : 1;
    for (int r = -1; r < reps; r++) {
        long n = r < 0 ? warm : iters;
        uint64_t t0 = now_ns();
        if (mode == 0) pair_loop(n, bytes);
        else if (mode == 1) info_loop(n);
        else launch_loop(n);
        uint64_t t1 = now_ns();
        if (r >= 0) ns[r] = (double)(t1 - t0) / (double)n;
    }
    double best = ns[0];
    for (int r = 1; r < reps; r++) best = ns[r] < best ? ns[r] : best;
    double med = median(ns, reps);
    printf("{\"bench\":\"%s\",\"bytes\":%zu,\"iters\":%ld,\"reps\":%d,\"ns_median\":%.1f,\"ns_min\":%.1f}\n",
           name, mode == 0 ? bytes : 0, iters, reps, med, best);
    free(ns);
}

struct child_result {
    uint64_t t0, t1;
    int32_t failed; /* CUresult of the first failing call, 0 if none */
    int32_t pad;
};

static void write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(3);
        p += w;
        n -= (size_t)w;
    }
}

static size_t read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* NPROC processes, each with its own CUDA context (forked before any CUDA call, as CUDA requires),
 * start their loops together; throughput = all pairs / (last end - first start). */
static int procs(int nproc, long iters, size_t bytes) {
    int ready[2], go[2], res[2];
    if (pipe(ready) || pipe(go) || pipe(res)) {
        perror("allocbench: pipe");
        return 1;
    }
    pid_t *pids = calloc((size_t)nproc, sizeof *pids);
    for (int i = 0; i < nproc; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("allocbench: fork");
            for (int j = 0; j < i; j++) kill(pids[j], SIGKILL);
            return 1;
        }
        if (pid == 0) {
            close(ready[0]);
            close(go[1]);
            close(res[0]);
            load_driver();
            context_up();
            pair_loop(iters / 10 > 0 ? iters / 10 : 1, bytes); /* warm-up */
            char c = 'r';
            write_all(ready[1], &c, 1);
            read_all(go[0], &c, 1); /* returns at EOF: the parent closed the write end */
            struct child_result cr = {0};
            cr.t0 = now_ns();
            for (long k = 0; k < iters; k++) {
                CUdeviceptr p;
                CUresult rc = cu.alloc(&p, bytes);
                if (rc == CUDA_SUCCESS) rc = cu.free(p);
                if (rc != CUDA_SUCCESS) {
                    cr.failed = (int32_t)rc;
                    break;
                }
            }
            cr.t1 = now_ns();
            write_all(res[1], &cr, sizeof cr);
            _exit(0);
        }
        pids[i] = pid;
    }
    close(ready[1]);
    close(go[0]);
    close(res[1]);
    int ok = 1;
    for (int i = 0; i < nproc; i++) {
        char c;
        if (read_all(ready[0], &c, 1) != 1) {
            fprintf(stderr, "allocbench: a child died before it was ready\n");
            ok = 0;
            break;
        }
    }
    close(go[1]); /* all children start */
    uint64_t first = UINT64_MAX, last = 0;
    int failed = 0, reported = 0;
    struct child_result cr;
    while (ok && read_all(res[0], &cr, sizeof cr) == sizeof cr) {
        reported++;
        if (cr.failed) {
            fprintf(stderr, "allocbench: a child's alloc/free failed: CUresult %d\n", cr.failed);
            failed = 1;
        }
        first = cr.t0 < first ? cr.t0 : first;
        last = cr.t1 > last ? cr.t1 : last;
    }
    for (int i = 0; i < nproc; i++) {
        if (!ok) kill(pids[i], SIGKILL);
        int st;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
    }
    if (!ok || failed || reported != nproc) {
        fprintf(stderr, "allocbench: %d of %d processes reported\n", reported, nproc);
        return 1;
    }
    double secs = (double)(last - first) / 1e9;
    double total = (double)nproc * (double)iters;
    printf("{\"bench\":\"procs\",\"procs\":%d,\"bytes\":%zu,\"iters\":%ld,\"seconds\":%.4f,"
           "\"pairs_per_s\":%.0f,\"ns_per_pair_per_proc\":%.1f}\n",
           nproc, bytes, iters, secs, total / secs, secs * 1e9 / (double)iters);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: allocbench pair|meminfo|launch|procs [-n ITERS] [-r REPS] [-s BYTES] [-p NPROC]\n");
    exit(2);
}

static long parse_num(const char *flag, const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v <= 0) {
        fprintf(stderr, "allocbench: %s wants a positive integer, got '%s'\n", flag, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *mode = argv[1];
    long iters = 20000;
    int reps = 11, nproc = 1;
    size_t bytes = 4096;
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "-n")) iters = parse_num("-n", argv[++i]);
        else if (!strcmp(argv[i], "-r")) reps = (int)parse_num("-r", argv[++i]);
        else if (!strcmp(argv[i], "-s")) bytes = (size_t)parse_num("-s", argv[++i]);
        else if (!strcmp(argv[i], "-p")) nproc = (int)parse_num("-p", argv[++i]);
        else usage();
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "procs")) return procs(nproc, iters, bytes);

    load_driver();
    context_up();
    if (!strcmp(mode, "pair")) {
        per_call("pair", 0, iters, reps, bytes);
    } else if (!strcmp(mode, "meminfo")) {
        per_call("meminfo", 1, iters, reps, 0);
    } else if (!strcmp(mode, "launch")) {
        CUmodule mod;
        CUresult rc = cu.module_load(&mod, noop_ptx);
        if (rc != CUDA_SUCCESS) die("cuModuleLoadData", rc);
        if ((rc = cu.get_function(&noop_fn, mod, "noop")) != CUDA_SUCCESS) die("cuModuleGetFunction", rc);
        per_call("launch", 2, iters, reps, 0);
    } else {
        usage();
    }
    return 0;
}
