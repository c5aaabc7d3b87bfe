// The one list of every entry point libvgpu hooks, `dlsym` aside. Included (`include!`) by both the engine
// (`libvgpu/src/interpose.rs`: name -> hook table) and the preload front (`libvgpu/preload/src/lib.rs`: one
// trampoline per name). Adding a hook: write it in its family module under `libvgpu/src/hooks/` and add
// its name here (both tables follow from this list); then give it its class in `classes.txt` if no rule
// covers it, drop its `gap` line there if it was a known gap, and run `make surface`
// (docs/architecture.md, "Adding a hook"). `tests/e2e/libvgpu-preload.test.sh` checks both libraries
// export exactly this list.
//
// `hooked_symbols!(callback)` expands to `callback! { Cuda: names...; Nvml: names...; }`.
macro_rules! hooked_symbols {
    ($callback:ident) => {
        $callback! {
            Cuda:
                cuInit cuGetProcAddress cuGetProcAddress_v2
                cuMemGetInfo cuMemGetInfo_v2 cuDeviceTotalMem cuDeviceTotalMem_v2
                cuMemAlloc cuMemAlloc_v2 cuMemAllocPitch cuMemAllocPitch_v2 cuMemAllocManaged
                cuMemAdvise cuMemAdvise_v2 cuMemPrefetchAsync cuMemPrefetchAsync_ptsz cuMemPrefetchAsync_v2
                cuMemPrefetchAsync_v2_ptsz cuMemPrefetchBatchAsync cuMemPrefetchBatchAsync_ptsz
                cuMemDiscardAndPrefetchBatchAsync cuMemDiscardAndPrefetchBatchAsync_ptsz
                cuMemFree cuMemFree_v2 cuIpcGetMemHandle cuMemGetHandleForAddressRange
                cuIpcOpenMemHandle cuIpcOpenMemHandle_v2 cuIpcCloseMemHandle
                cuArrayCreate cuArrayCreate_v2 cuArray3DCreate cuArray3DCreate_v2 cuArrayDestroy
                cuMipmappedArrayCreate cuMipmappedArrayDestroy
                cuMemAllocAsync cuMemAllocAsync_ptsz cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz
                cuMemFreeAsync cuMemFreeAsync_ptsz cuMemPoolCreate cuMemPoolDestroy cuMemPoolTrimTo
                cuMemPoolExportToShareableHandle cuMemPoolExportPointer cuMemPoolImportPointer
                cuStreamSynchronize cuStreamSynchronize_ptsz cuCtxSynchronize cuCtxSynchronize_v2 cuEventSynchronize
                cuStreamQuery cuStreamQuery_ptsz cuEventQuery cuStreamDestroy cuStreamDestroy_v2
                cuStreamBeginCapture cuStreamBeginCapture_ptsz cuStreamBeginCapture_v2 cuStreamBeginCapture_v2_ptsz
                cuStreamBeginCaptureToGraph cuStreamBeginCaptureToGraph_ptsz cuStreamWaitEvent cuStreamWaitEvent_ptsz
                cuMemCreate cuMemRelease cuMemRetainAllocationHandle cuMemMap cuMemUnmap
                cuMemExportToShareableHandle cuMemImportFromShareableHandle
                cuMemMapArrayAsync cuMemMapArrayAsync_ptsz
                cuMulticastCreate cuMulticastBindMem cuMulticastBindAddr cuMulticastUnbind
                cuGraphInstantiate cuGraphInstantiate_v2 cuGraphInstantiateWithFlags
                cuGraphInstantiateWithParams cuGraphInstantiateWithParams_ptsz
                cuLaunchKernel cuLaunchKernel_ptsz cuLaunchKernelEx cuLaunchKernelEx_ptsz
                cuLaunchCooperativeKernel cuLaunchCooperativeKernel_ptsz cuLaunchCooperativeKernelMultiDevice
                cuLaunch cuLaunchGrid cuLaunchGridAsync
                cuGLCtxCreate cuGLCtxCreate_v2 cuVDPAUCtxCreate cuVDPAUCtxCreate_v2 cuCtxDetach
                cuGraphLaunch cuGraphLaunch_ptsz cuGraphUpload cuGraphUpload_ptsz
                cuGraphExecDestroy cuGraphAddMemAllocNode cuGraphDestroy cuDeviceGraphMemTrim
                cuGraphExecUpdate cuGraphExecUpdate_v2 cuGraphExecKernelNodeSetParams
                cuGraphExecKernelNodeSetParams_v2 cuGraphExecNodeSetParams cuGraphExecChildGraphNodeSetParams
                cuCtxCreate cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4 cuCtxDestroy cuCtxDestroy_v2 cuCtxSetLimit
                cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
                cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2 cuGreenCtxCreate cuGreenCtxDestroy
                cuModuleLoad cuModuleLoadData cuModuleLoadDataEx cuModuleLoadFatBinary cuModuleUnload
                cuLibraryLoadData cuLibraryLoadFromFile cuLibraryUnload cuLibraryGetModule cuLibraryGetKernel
                cuKernelGetFunction cuLibraryGetGlobal cuLibraryGetManaged cuLibraryGetUnifiedFunction
                cuMemsetD8_v2 cuMemsetD8_v2_ptds cuMemsetD16_v2 cuMemsetD16_v2_ptds cuMemsetD32_v2
                cuMemsetD32_v2_ptds cuMemsetD8Async cuMemsetD8Async_ptsz cuMemsetD16Async
                cuMemsetD16Async_ptsz cuMemsetD32Async cuMemsetD32Async_ptsz cuMemsetD2D8_v2
                cuMemsetD2D8_v2_ptds cuMemsetD2D16_v2 cuMemsetD2D16_v2_ptds cuMemsetD2D32_v2
                cuMemsetD2D32_v2_ptds cuMemsetD2D8Async cuMemsetD2D8Async_ptsz cuMemsetD2D16Async
                cuMemsetD2D16Async_ptsz cuMemsetD2D32Async cuMemsetD2D32Async_ptsz cuMemcpy cuMemcpy_ptds
                cuMemcpyAsync cuMemcpyAsync_ptsz cuMemcpyHtoD_v2 cuMemcpyHtoD_v2_ptds cuMemcpyDtoH_v2
                cuMemcpyDtoH_v2_ptds cuMemcpyDtoD_v2 cuMemcpyDtoD_v2_ptds cuMemcpyHtoDAsync_v2
                cuMemcpyHtoDAsync_v2_ptsz cuMemcpyDtoHAsync_v2 cuMemcpyDtoHAsync_v2_ptsz cuMemcpyDtoDAsync_v2
                cuMemcpyDtoDAsync_v2_ptsz cuMemcpyPeer cuMemcpyPeer_ptds cuMemcpyPeerAsync
                cuMemcpyPeerAsync_ptsz cuMemcpyAtoD_v2 cuMemcpyAtoD_v2_ptds cuMemcpyDtoA_v2
                cuMemcpyDtoA_v2_ptds cuMemcpyHtoA_v2 cuMemcpyHtoA_v2_ptds cuMemcpyAtoH_v2 cuMemcpyAtoH_v2_ptds
                cuMemcpyHtoAAsync_v2 cuMemcpyHtoAAsync_v2_ptsz cuMemcpyAtoHAsync_v2 cuMemcpyAtoHAsync_v2_ptsz
                cuMemcpyAtoA_v2 cuMemcpyAtoA_v2_ptds cuMemcpy2D_v2 cuMemcpy2D_v2_ptds cuMemcpy2DUnaligned_v2
                cuMemcpy2DUnaligned_v2_ptds cuMemcpy2DAsync_v2 cuMemcpy2DAsync_v2_ptsz cuMemcpy3D_v2
                cuMemcpy3D_v2_ptds cuMemcpy3DAsync_v2 cuMemcpy3DAsync_v2_ptsz cuMemcpy3DPeer
                cuMemcpy3DPeer_ptds cuMemcpy3DPeerAsync cuMemcpy3DPeerAsync_ptsz
                cuMemcpyBatchAsync cuMemcpyBatchAsync_ptsz cuMemcpyBatchAsync_v2 cuMemcpyBatchAsync_v2_ptsz
                cuMemcpy3DBatchAsync cuMemcpy3DBatchAsync_ptsz cuMemcpy3DBatchAsync_v2 cuMemcpy3DBatchAsync_v2_ptsz
                cuMemsetD8 cuMemsetD16 cuMemsetD32 cuMemsetD2D8 cuMemsetD2D16 cuMemsetD2D32 cuMemcpyHtoD
                cuMemcpyDtoH cuMemcpyDtoD cuMemcpyHtoDAsync cuMemcpyDtoHAsync cuMemcpyDtoDAsync cuMemcpyAtoD
                cuMemcpyDtoA cuMemcpyHtoA cuMemcpyAtoH cuMemcpyHtoAAsync cuMemcpyAtoHAsync cuMemcpyAtoA
                cuMemcpy2D cuMemcpy2DUnaligned cuMemcpy2DAsync cuMemcpy3D cuMemcpy3DAsync
                cuMemBatchDecompressAsync cuMemBatchDecompressAsync_ptsz;
            Nvml:
                nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2;
        }
    };
}
