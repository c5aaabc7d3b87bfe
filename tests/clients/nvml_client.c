/* NVML test client: loads libnvidia-ml.so.1 the way nvidia-smi and monitoring agents do
 * (dlopen + dlsym) and prints, per device in NVML (physical) order, one line:
 *   nvml index=I uuid=GPU-... total=T free=F used=U v2_total=.. v2_reserved=.. v2_free=.. v2_used=.. procs=N
 * and per process with memory on it: "proc index=I pid=P used=BYTES".
 * Argument: an optional device index to show only that device. Exit 1 on any NVML error. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYM(name) __typeof__(name) *p_##name = (__typeof__(name) *)dlsym(h, #name)

int main(int argc, char **argv) {
    const char *lib = getenv("CLIENT_NVML_LIB");
    void *h = dlopen(lib && *lib ? lib : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("nvml error=dlopen:%s\n", dlerror()); return 1; }
    SYM(nvmlInit_v2); SYM(nvmlShutdown); SYM(nvmlErrorString); SYM(nvmlDeviceGetCount_v2);
    SYM(nvmlDeviceGetHandleByIndex_v2); SYM(nvmlDeviceGetUUID); SYM(nvmlDeviceGetMemoryInfo);
    SYM(nvmlDeviceGetMemoryInfo_v2); SYM(nvmlDeviceGetComputeRunningProcesses_v3);
    SYM(nvmlSystemGetDriverVersion); SYM(nvmlDeviceGetHandleByUUID); SYM(nvmlDeviceGetPciInfo_v3);
    SYM(nvmlDeviceGetHandleByPciBusId_v2); SYM(nvmlDeviceGetIndex);
    if (!p_nvmlInit_v2 || !p_nvmlDeviceGetCount_v2 || !p_nvmlDeviceGetHandleByIndex_v2 || !p_nvmlDeviceGetMemoryInfo ||
        !p_nvmlDeviceGetMemoryInfo_v2 || !p_nvmlDeviceGetComputeRunningProcesses_v3 || !p_nvmlDeviceGetUUID ||
        !p_nvmlErrorString || !p_nvmlShutdown || !p_nvmlSystemGetDriverVersion || !p_nvmlDeviceGetHandleByUUID ||
        !p_nvmlDeviceGetPciInfo_v3 || !p_nvmlDeviceGetHandleByPciBusId_v2 || !p_nvmlDeviceGetIndex) {
        printf("nvml error=missing_symbol\n");
        return 1;
    }
#define CHECK(call) do { nvmlReturn_t r_ = (call); if (r_ != NVML_SUCCESS) { \
        printf("nvml error=%s call=%s\n", p_nvmlErrorString(r_), #call); return 1; } } while (0)
    CHECK(p_nvmlInit_v2());
    char ver[96];
    unsigned n = 0;
    CHECK(p_nvmlSystemGetDriverVersion(ver, sizeof ver));
    CHECK(p_nvmlDeviceGetCount_v2(&n));
    printf("nvml driver=%s count=%u\n", ver, n);
    int only = argc > 1 ? atoi(argv[1]) : -1;
    for (unsigned i = 0; i < n; i++) {
        if (only >= 0 && (unsigned)only != i) continue;
        nvmlDevice_t d, d2;
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlMemory_t m;
        nvmlMemory_v2_t m2;
        CHECK(p_nvmlDeviceGetHandleByIndex_v2(i, &d));
        CHECK(p_nvmlDeviceGetUUID(d, uuid, sizeof uuid));
        CHECK(p_nvmlDeviceGetHandleByUUID(uuid, &d2));
        if (d2 != d) { printf("nvml error=uuid_lookup_mismatch\n"); return 1; }
        nvmlPciInfo_t pci;
        unsigned idx = 99;
        CHECK(p_nvmlDeviceGetPciInfo_v3(d, &pci));
        CHECK(p_nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &d2));
        CHECK(p_nvmlDeviceGetIndex(d2, &idx));
        if (d2 != d || idx != i) { printf("nvml error=pci_lookup_mismatch\n"); return 1; }
        CHECK(p_nvmlDeviceGetMemoryInfo(d, &m));
        memset(&m2, 0, sizeof m2);
        m2.version = 0;
        nvmlReturn_t bad = p_nvmlDeviceGetMemoryInfo_v2(d, &m2);
        m2.version = nvmlMemory_v2;
        CHECK(p_nvmlDeviceGetMemoryInfo_v2(d, &m2));
        unsigned cnt = 0;
        nvmlReturn_t r = p_nvmlDeviceGetComputeRunningProcesses_v3(d, &cnt, NULL);
        if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) CHECK(r);
        nvmlProcessInfo_t *procs = calloc(cnt + 8, sizeof *procs);
        unsigned room = cnt + 8;
        CHECK(p_nvmlDeviceGetComputeRunningProcesses_v3(d, &room, procs));
        printf("nvml index=%u uuid=%s pci=%s total=%llu free=%llu used=%llu v2_total=%llu v2_reserved=%llu v2_free=%llu"
               " v2_used=%llu v2_badversion=%d procs=%u\n",
               i, uuid, pci.busId, m.total, m.free, m.used, m2.total, m2.reserved, m2.free, m2.used, (int)bad, room);
        for (unsigned k = 0; k < room; k++)
            printf("proc index=%u pid=%u used=%llu\n", i, procs[k].pid, procs[k].usedGpuMemory);
        free(procs);
    }
    CHECK(p_nvmlShutdown());
    return 0;
}
