// The one list of every entry point libvgpu hooks, `dlsym` aside. Included (`include!`) by both the engine
// (`libvgpu/src/interpose.rs`: name -> hook table) and the preload front (`libvgpu/preload/src/lib.rs`: one
// trampoline per name). Adding a hook: write it in its family module under `libvgpu/src/hooks/` and add
// its name here; nothing else. `tests/e2e/libvgpu-preload.test.sh` checks both libraries export exactly
// this list.
//
// `hooked_symbols!(callback)` expands to `callback! { Cuda: names...; Nvml: names...; }`.
macro_rules! hooked_symbols {
    ($callback:ident) => {
        $callback! {
            Cuda:
                cuInit cuGetProcAddress cuGetProcAddress_v2
                cuMemGetInfo cuMemGetInfo_v2 cuDeviceTotalMem cuDeviceTotalMem_v2
                cuMemAlloc cuMemAlloc_v2 cuMemAllocPitch cuMemAllocPitch_v2 cuMemAllocManaged
                cuMemFree cuMemFree_v2 cuIpcGetMemHandle
                cuArrayCreate cuArrayCreate_v2 cuArray3DCreate cuArray3DCreate_v2 cuArrayDestroy
                cuMipmappedArrayCreate cuMipmappedArrayDestroy
                cuMemAllocAsync cuMemAllocAsync_ptsz cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz
                cuMemFreeAsync cuMemFreeAsync_ptsz cuMemPoolCreate cuMemPoolDestroy cuMemPoolTrimTo
                cuStreamSynchronize cuStreamSynchronize_ptsz cuCtxSynchronize cuCtxSynchronize_v2 cuEventSynchronize
                cuMemCreate cuMemRelease cuMemRetainAllocationHandle cuMemMap cuMemUnmap
                cuMemExportToShareableHandle cuMemImportFromShareableHandle
                cuGraphInstantiate cuGraphInstantiate_v2 cuGraphInstantiateWithFlags
                cuGraphInstantiateWithParams cuGraphInstantiateWithParams_ptsz
                cuLaunchKernel cuLaunchKernel_ptsz cuLaunchKernelEx cuLaunchKernelEx_ptsz
                cuLaunchCooperativeKernel cuLaunchCooperativeKernel_ptsz
                cuGraphLaunch cuGraphLaunch_ptsz cuGraphUpload cuGraphUpload_ptsz
                cuGraphExecDestroy cuGraphAddMemAllocNode cuGraphDestroy cuDeviceGraphMemTrim
                cuGraphExecUpdate cuGraphExecUpdate_v2 cuGraphExecKernelNodeSetParams
                cuGraphExecKernelNodeSetParams_v2 cuGraphExecNodeSetParams cuGraphExecChildGraphNodeSetParams
                cuCtxCreate cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4 cuCtxDestroy cuCtxDestroy_v2 cuCtxSetLimit
                cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
                cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
                cuModuleLoad cuModuleLoadData cuModuleLoadDataEx cuModuleLoadFatBinary cuModuleUnload
                cuLibraryLoadData cuLibraryLoadFromFile cuLibraryUnload;
            Nvml:
                nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2;
        }
    };
}
