/* The client's ops for what keeps VMM memory alive besides its handle (issue 48 items 2-4), included by
 * client.c after mem_ops.h (CALL, held/push, need_ctx, dev, stream, parse_size, mem_proc, shared_fd).
 * Driver functions are resolved with cuGetProcAddress (mem_proc).
 *   vmm-close-fd          closes the descriptor vmm-export made (the driver may free the memory now)
 *   vmm-import-path PATH  imports the descriptor at PATH (e.g. /proc/PID/fd/N: another process's export),
 *                         not mapped
 *   vmm-windows WIN N     maps N windows of WIN bytes of that import, at offsets 0, WIN, 2 WIN, ... each at
 *                         an address of its own (held); stops at the first refusal (mapped=, rc= its code)
 *   tile-map              a sparse array (made once), one tile of it mapped onto the last VMM allocation
 *   tile-unmap            that tile unmapped
 *   mc-bind               a multicast object of the last VMM allocation's size (made once, with this
 *                         device added), the allocation bound to it
 *   mc-unbind             that binding unbound */
#ifndef HOLD_OPS_H
#define HOLD_OPS_H

#include <fcntl.h>

typedef CUresult (*maparray_t)(CUarrayMapInfo *, unsigned int, CUstream);
typedef CUresult (*mccreate_t)(CUmemGenericAllocationHandle *, const CUmulticastObjectProp *);
typedef CUresult (*mcadd_t)(CUmemGenericAllocationHandle, CUdevice);
typedef CUresult (*mcbind_t)(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t, size_t,
                             unsigned long long);
typedef CUresult (*mcunbind_t)(CUmemGenericAllocationHandle, CUdevice, size_t, size_t);
static CUmemGenericAllocationHandle imported_handle;
static CUarray sparse_array;
static CUmemGenericAllocationHandle mc_object;
static size_t mc_size;

/* The last VMM allocation held with its handle, or -1. */
static int last_vmm(void) {
    int k = nheld - 1;
    while (k >= 0 && (held[k].kind != K_VMM || !held[k].phys)) k--;
    return k;
}

/* One tile (level 0, 64 x 64 at the origin) of the sparse array: mapped onto `ph`, or unmapped (ph 0). */
static CUresult tile_op(CUmemGenericAllocationHandle ph) {
    maparray_t f = (maparray_t)mem_proc("cuMemMapArrayAsync", cuda_version);
    CUarrayMapInfo m;
    memset(&m, 0, sizeof m);
    m.resourceType = CU_RESOURCE_TYPE_ARRAY;
    m.resource.array = sparse_array;
    m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
    m.subresource.sparseLevel.extentWidth = 64;
    m.subresource.sparseLevel.extentHeight = 64;
    m.subresource.sparseLevel.extentDepth = 1;
    m.memOperationType = ph ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
    m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
    m.memHandle.memHandle = ph;
    m.deviceBitMask = 1u << dev;
    if (!f) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = f(&m, 1, stream);
    if (rc == CUDA_SUCCESS) rc = CALL(cuStreamSynchronize, stream);
    return rc;
}

/* Runs op `op` at argv[i] if it is one of these; returns 1 if it was (with *used and *rc set). */
static int hold_op(const char *op, int argc, char **argv, int i, int *used, CUresult *rc) {
#define HARG(k) (i + (k) < argc ? argv[i + (k)] : (fprintf(stderr, "client: %s needs %d argument(s)\n", op, k), exit(2), ""))
    if (!strcmp(op, "vmm-close-fd")) {
        *rc = shared_fd >= 0 && close(shared_fd) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        shared_fd = -1;
    } else if (!strcmp(op, "vmm-import-path")) {
        const char *path = HARG(1);
        import_t f = (import_t)mem_proc("cuMemImportFromShareableHandle", cuda_version);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        *used = 2;
        *rc = need_ctx();
        if (*rc == CUDA_SUCCESS) {
            if (!f) *rc = CUDA_ERROR_NOT_FOUND;
            else if (fd < 0) *rc = CUDA_ERROR_INVALID_VALUE;
            else *rc = f(&imported_handle, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        }
        if (fd >= 0) close(fd);
        printf(" handle=0x%llx", (unsigned long long)imported_handle);
    } else if (!strcmp(op, "vmm-windows")) {
        unsigned long long win = parse_size(HARG(1)), n = parse_size(HARG(2)), k = 0;
        *used = 3;
        *rc = imported_handle ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        for (; k < n && *rc == CUDA_SUCCESS; k++) {
            CUdeviceptr va = 0;
            *rc = CALL(cuMemAddressReserve, &va, win, 0, 0, 0);
            if (*rc != CUDA_SUCCESS) break;
            *rc = CALL(cuMemMap, va, win, k * win, imported_handle, 0);
            if (*rc != CUDA_SUCCESS) { CALL(cuMemAddressFree, va, win); break; }
            push((struct held){.kind = K_VMM, .ptr = va, .size = win, .phys = 0});
        }
        printf(" mapped=%llu", k);
    } else if (!strcmp(op, "tile-map")) {
        int k = last_vmm();
        *rc = need_stream();
        if (*rc == CUDA_SUCCESS && !sparse_array) {
            CUDA_ARRAY3D_DESCRIPTOR d;
            memset(&d, 0, sizeof d);
            d.Width = 1024;
            d.Height = 1024;
            d.Format = CU_AD_FORMAT_FLOAT;
            d.NumChannels = 1;
            d.Flags = CUDA_ARRAY3D_SPARSE;
            *rc = CALL(cuArray3DCreate, &sparse_array, &d);
        }
        if (*rc == CUDA_SUCCESS) *rc = k < 0 ? CUDA_ERROR_INVALID_VALUE : tile_op(held[k].phys);
    } else if (!strcmp(op, "tile-unmap")) {
        *rc = sparse_array ? tile_op(0) : CUDA_ERROR_INVALID_VALUE;
    } else if (!strcmp(op, "mc-bind")) {
        mccreate_t create = (mccreate_t)mem_proc("cuMulticastCreate", cuda_version);
        mcadd_t add = (mcadd_t)mem_proc("cuMulticastAddDevice", cuda_version);
        mcbind_t bind = (mcbind_t)mem_proc("cuMulticastBindMem", cuda_version);
        int k = last_vmm();
        *rc = need_ctx();
        if (*rc == CUDA_SUCCESS && (!create || !add || !bind)) *rc = CUDA_ERROR_NOT_FOUND;
        if (*rc == CUDA_SUCCESS && k < 0) *rc = CUDA_ERROR_INVALID_VALUE;
        if (*rc == CUDA_SUCCESS && !mc_object) {
            CUmulticastObjectProp p;
            memset(&p, 0, sizeof p);
            p.numDevices = 1;
            p.size = held[k].size;
            *rc = create(&mc_object, &p);
            if (*rc == CUDA_SUCCESS) *rc = add(mc_object, dev);
            mc_size = held[k].size;
        }
        if (*rc == CUDA_SUCCESS) *rc = bind(mc_object, 0, held[k].phys, 0, mc_size, 0);
        printf(" size=%zu", mc_size);
    } else if (!strcmp(op, "mc-unbind")) {
        mcunbind_t unbind = (mcunbind_t)mem_proc("cuMulticastUnbind", cuda_version);
        *rc = !unbind ? CUDA_ERROR_NOT_FOUND : !mc_object ? CUDA_ERROR_INVALID_VALUE : unbind(mc_object, dev, 0, mc_size);
    } else {
        return 0;
    }
    return 1;
#undef HARG
}

#endif
