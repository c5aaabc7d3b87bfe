/* The client's ops for legacy CUDA IPC's importing side (issue 48, gap 48.2), included by client.c after
 * hold_ops.h (CALL, need_ctx, mem_proc). The exporting side is client.c's `ipc`, which prints its handle.
 *   ipc-open HEX   cuIpcOpenMemHandle of the handle HEX (128 hex digits, as `ipc` printed it in another
 *                  process), with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS; the pointer is kept (ptr=)
 *   ipc-close      cuIpcCloseMemHandle of that pointer */
#ifndef IPC_OPS_H
#define IPC_OPS_H

typedef CUresult (*ipcopen_t)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*ipcclose_t)(CUdeviceptr);
static CUdeviceptr ipc_opened;

/* Prints the 64 bytes of `h` as " handle=" and 128 hex digits. */
static void print_ipc_handle(const CUipcMemHandle *h) {
    printf(" handle=");
    for (int k = 0; k < CU_IPC_HANDLE_SIZE; k++) printf("%02x", (unsigned char)h->reserved[k]);
}

/* Runs op `op` at argv[i] if it is one of these; returns 1 if it was (with *used and *rc set). */
static int ipc_op(const char *op, int argc, char **argv, int i, int *used, CUresult *rc) {
    if (!strcmp(op, "ipc-open")) {
        const char *hex = i + 1 < argc ? argv[i + 1] : "";
        ipcopen_t f = (ipcopen_t)mem_proc("cuIpcOpenMemHandle", cuda_version);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        *used = 2;
        *rc = strlen(hex) == 2 * CU_IPC_HANDLE_SIZE ? need_ctx() : CUDA_ERROR_INVALID_VALUE;
        for (int k = 0; *rc == CUDA_SUCCESS && k < CU_IPC_HANDLE_SIZE; k++) {
            unsigned v;
            if (sscanf(hex + 2 * k, "%2x", &v) != 1) *rc = CUDA_ERROR_INVALID_VALUE;
            h.reserved[k] = (char)v;
        }
        if (*rc == CUDA_SUCCESS) *rc = f ? f(&ipc_opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) : CUDA_ERROR_NOT_FOUND;
        printf(" ptr=0x%llx", (unsigned long long)ipc_opened);
    } else if (!strcmp(op, "ipc-close")) {
        ipcclose_t f = (ipcclose_t)mem_proc("cuIpcCloseMemHandle", cuda_version);
        *rc = !ipc_opened ? CUDA_ERROR_INVALID_VALUE : f ? f(ipc_opened) : CUDA_ERROR_NOT_FOUND;
        if (*rc == CUDA_SUCCESS) ipc_opened = 0;
    } else {
        return 0;
    }
    return 1;
}

#endif
