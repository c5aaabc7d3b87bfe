/* The client's ops for memory shared between processes by legacy CUDA IPC's importing side and by shared
 * pools (issue 48, gap 48.2), included by client.c after hold_ops.h (CALL, need_ctx, need_stream, mem_proc,
 * pool, held). The legacy exporter is client.c's `ipc`, which prints its handle.
 *   ipc-open HEX          cuIpcOpenMemHandle of the handle HEX (128 hex digits, as `ipc` printed it in
 *                         another process), with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS; the pointer is kept (ptr=)
 *   ipc-close             cuIpcCloseMemHandle of that pointer
 *   pool-shared           makes the own pool (the `pool` op's) exportable as POSIX descriptors
 *   pool-export           cuMemPoolExportToShareableHandle of the own pool (fd=)
 *   pool-export-ptr       cuMemPoolExportPointer of the last stream-ordered allocation (data=, 128 hex digits)
 *   pool-import-path PATH cuMemPoolImportFromShareableHandle of the descriptor at PATH (/proc/PID/fd/N)
 *   pool-import-ptr HEX   cuMemPoolImportPointer of export data HEX from that pool; the pointer is kept
 *   free-imported         cuMemFreeAsync of that pointer, and the stream synchronised */
#ifndef IPC_OPS_H
#define IPC_OPS_H

typedef CUresult (*ipcopen_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*ipcclose_t)(CUdeviceptr);
typedef CUresult (*poolexport_t)(void *, CUmemoryPool, CUmemAllocationHandleType, unsigned long long);
typedef CUresult (*poolimport_t)(CUmemoryPool *, void *, CUmemAllocationHandleType, unsigned long long);
typedef CUresult (*exportptr_t)(CUmemPoolPtrExportData *, CUdeviceptr);
typedef CUresult (*importptr_t)(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
static CUdeviceptr ipc_opened, pool_imported;
static CUmemoryPool imported_pool;

/* Reads 128 hex digits into 64 bytes; CUDA_ERROR_INVALID_VALUE when they are not that. */
static CUresult parse_hex64(const char *hex, unsigned char *out) {
    if (strlen(hex) != 128) return CUDA_ERROR_INVALID_VALUE;
    for (int k = 0; k < 64; k++) {
        unsigned v;
        if (sscanf(hex + 2 * k, "%2x", &v) != 1) return CUDA_ERROR_INVALID_VALUE;
        out[k] = (unsigned char)v;
    }
    return CUDA_SUCCESS;
}

static void print_hex64(const char *name, const unsigned char *b) {
    printf(" %s=", name);
    for (int k = 0; k < 64; k++) printf("%02x", b[k]);
}

/* Prints the 64 bytes of `h` as " handle=" and 128 hex digits. */
static void print_ipc_handle(const CUipcMemHandle *h) { print_hex64("handle", (const unsigned char *)h->reserved); }

/* Runs op `op` at argv[i] if it is one of these; returns 1 if it was (with *used and *rc set). */
static int ipc_op(const char *op, int argc, char **argv, int i, int *used, CUresult *rc) {
    if (!strcmp(op, "ipc-open")) {
        const char *hex = i + 1 < argc ? argv[i + 1] : "";
        ipcopen_t f = (ipcopen_t)mem_proc("cuIpcOpenMemHandle", cuda_version);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        *used = 2;
        *rc = parse_hex64(hex, (unsigned char *)h.reserved);
        if (*rc == CUDA_SUCCESS) *rc = need_ctx();
        if (*rc == CUDA_SUCCESS) *rc = f ? f(&ipc_opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : CUDA_ERROR_NOT_FOUND;
        printf(" ptr=0x%llx", (unsigned long long)ipc_opened);
    } else if (!strcmp(op, "ipc-close")) {
        ipcclose_t f = (ipcclose_t)mem_proc("cuIpcCloseMemHandle", cuda_version);
        *rc = !ipc_opened ? CUDA_ERROR_INVALID_VALUE : f ? f(ipc_opened) : CUDA_ERROR_NOT_FOUND;
        if (*rc == CUDA_SUCCESS) ipc_opened = 0;
    } else if (!strcmp(op, "pool-shared")) {
        *rc = need_stream();
        if (*rc == CUDA_SUCCESS && !pool) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = dev;
            *rc = CALL(cuMemPoolCreate, &pool, &props);
        }
    } else if (!strcmp(op, "pool-export")) {
        poolexport_t f = (poolexport_t)mem_proc("cuMemPoolExportToShareableHandle", cuda_version);
        int fd = -1;
        *rc = !pool ? CUDA_ERROR_INVALID_VALUE : f ? f(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) : CUDA_ERROR_NOT_FOUND;
        printf(" fd=%d", fd);
    } else if (!strcmp(op, "pool-export-ptr")) {
        exportptr_t f = (exportptr_t)mem_proc("cuMemPoolExportPointer", cuda_version);
        CUmemPoolPtrExportData data;
        int k = nheld - 1;
        memset(&data, 0, sizeof data);
        while (k >= 0 && held[k].kind != K_ASYNC) k--;
        *rc = k < 0 ? CUDA_ERROR_INVALID_VALUE : f ? f(&data, held[k].ptr) : CUDA_ERROR_NOT_FOUND;
        if (*rc == CUDA_SUCCESS) print_hex64("data", data.reserved);
    } else if (!strcmp(op, "pool-import-path")) {
        const char *path = i + 1 < argc ? argv[i + 1] : "";
        poolimport_t f = (poolimport_t)mem_proc("cuMemPoolImportFromShareableHandle", cuda_version);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        *used = 2;
        *rc = need_ctx();
        if (*rc == CUDA_SUCCESS)
            *rc = fd < 0 ? CUDA_ERROR_INVALID_VALUE
                : f ? f(&imported_pool, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
                    : CUDA_ERROR_NOT_FOUND;
        if (fd >= 0) close(fd);
    } else if (!strcmp(op, "pool-import-ptr")) {
        importptr_t f = (importptr_t)mem_proc("cuMemPoolImportPointer", cuda_version);
        CUmemPoolPtrExportData data;
        *used = 2;
        *rc = parse_hex64(i + 1 < argc ? argv[i + 1] : "", data.reserved);
        if (*rc == CUDA_SUCCESS) *rc = !imported_pool ? CUDA_ERROR_INVALID_VALUE : f ? f(&pool_imported, imported_pool, &data) : CUDA_ERROR_NOT_FOUND;
        printf(" ptr=0x%llx", (unsigned long long)pool_imported);
    } else if (!strcmp(op, "free-imported")) {
        *rc = !pool_imported ? CUDA_ERROR_INVALID_VALUE : need_stream();
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuMemFreeAsync, pool_imported, stream);
        if (*rc == CUDA_SUCCESS) *rc = CALL(cuStreamSynchronize, stream);
        if (*rc == CUDA_SUCCESS) pool_imported = 0;
    } else {
        return 0;
    }
    return 1;
}

#endif
