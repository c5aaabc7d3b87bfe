#!/usr/bin/env bash
# Issue 23 items 7, 1 and 5 on a real GPU, each case under one or more builds of the interposer, with the
# truth beside the ledger: the test client's `truth` op prints this process's memory in NVML's process list
# (not hooked) and the hooked nvmlDeviceGetMemoryInfo's used (the container's ledger).
#   LIBS="name=/path/libvgpu.so ..."   builds to compare (default: new=target/vgpu/libvgpu.so)
#   CLIENT_SRC                         folder with client.c, appfds.h, mem_ops.h (default tests/clients)
#   LIMIT                              quota (default 2g: an H100 context takes ~0.5 GiB of it)
#   OUT                                results folder (attribution.txt)
set -uo pipefail
src=${CLIENT_SRC:-tests/clients}
out=${OUT:-/tmp/attribution}
libs=${LIBS:-new=target/vgpu/libvgpu.so}
mkdir -p "$out"
w=$(mktemp -d)
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
gcc -O2 -std=gnu11 -Wno-deprecated-declarations -I"$inc" -DRT_CLIENT "$src/client.c" -o "$w/rt_client" -ldl -lpthread \
    || { echo "attribution: client build failed" | tee "$out/attribution.txt"; exit 1; }
log=$out/attribution.txt
: >"$log"
# case NAME ARGS...: the client under each library, fresh ledger each time.
case_() {
    local name=$1; shift
    for spec in $libs; do
        local tag=${spec%%=*} lib=${spec#*=} d
        d=$(mktemp -d "$w/case.XXXXXX")
        echo "### $name [$tag] $*" >>"$log"
        LD_PRELOAD=$(realpath "$lib") CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/cache CUDA_DEVICE_MEMORY_LIMIT=${LIMIT:-2g} \
            timeout 60 "$w/rt_client" "$@" 2>&1 | grep -v '^op=load\|^op=init' >>"$log"
    done
}
echo "### procaddr (no library): what cuGetProcAddress gives for cuCtxSynchronize" >>"$log"
"$w/rt_client" procaddr cuCtxSynchronize 12000 procaddr cuCtxSynchronize 13000 2>&1 | grep '^op=procaddr' >>"$log"
case_ item7-sync2 async 1000m free-async sync2 truth 0 alloc 1200m truth 0
case_ item7-nosync async 1000m free-async alloc 1200m truth 0
case_ item1-nocontext device 0 nocontext pool-of 0 1000m pool-of 0 1000m pool-of 0 1000m truth 0
case_ item5-import vmm-fd 1000m vmm-export vmm-import vmm-drop-first truth 0 vmm 1000m truth 0
case_ item5-ordinary vmm-fd 1000m vmm-export free-all truth 0 vmm 1000m truth 0
# Two devices (items 1 and 2): device 1's pool and graph nodes on device 1, from device 0's context.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
    export CUDA_DEVICE_MEMORY_LIMIT_0=8g CUDA_DEVICE_MEMORY_LIMIT_1=2g
    case_ item1-dev1-tight device 0 pool-of 1 1000m pool-of 1 1000m pool-of 1 1000m truth 1 truth 0
    case_ item2-dev1-tight device 0 graph-on 1 4 600m truth 1 truth 0
    export CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=8g
    case_ item1-dev1-roomy device 0 pool-of 1 1000m pool-of 1 1000m truth 1 truth 0
    case_ item2-dev1-roomy device 0 graph-on 1 4 600m truth 1 truth 0
    unset CUDA_DEVICE_MEMORY_LIMIT_0 CUDA_DEVICE_MEMORY_LIMIT_1
fi
cat "$log"
rm -rf "$w"
