#!/usr/bin/env bash
# Builds the C test clients into target/clients/: rt_client (dlopen + cuGetProcAddress, like the
# CUDA runtime) and linked_client (-lcuda). Overrides for a real driver:
#   CUDA_INCLUDE  folder with cuda.h           (default .deps/cuda/include)
#   LIBCUDA_DIR   folder with libcuda.so to link (default target/fake)
#   OUT           output folder                (default target/clients)
set -euo pipefail
cd "$(dirname "$0")/../.."
inc=${CUDA_INCLUDE:-.deps/cuda/include}
libdir=${LIBCUDA_DIR:-target/fake}
out=${OUT:-target/clients}
cc=${CC:-gcc}
[ -f "$inc/cuda.h" ] || { echo "build.sh: no cuda.h in $inc (set CUDA_INCLUDE)" >&2; exit 1; }
mkdir -p "$out"
flags=(-O2 -Wall -Wextra -Wno-unused-parameter -Wno-deprecated-declarations -std=gnu11 -I"$inc")
"$cc" "${flags[@]}" -DRT_CLIENT tests/clients/client.c -o "$out/rt_client" -ldl -lpthread
if [ -e "$libdir/libcuda.so" ] || [ -e "$libdir/libcuda.so.1" ]; then
    # Link against the soname file when no unversioned link exists (e.g. a driver-only install).
    if [ -e "$libdir/libcuda.so" ]; then lib=(-L"$libdir" -lcuda); else lib=("$libdir/libcuda.so.1"); fi
    "$cc" "${flags[@]}" tests/clients/client.c -o "$out/linked_client" "${lib[@]}" -ldl -lpthread
else
    echo "build.sh: no libcuda.so in $libdir (set LIBCUDA_DIR)" >&2
    exit 1
fi
echo "built $out/rt_client $out/linked_client"
"$cc" "${flags[@]}" tests/clients/compute_client.c -o "$out/compute_client" "${lib[@]}"
echo "built $out/compute_client"
"$cc" "${flags[@]}" tests/clients/nvml_client.c -o "$out/nvml_client" -ldl
echo "built $out/nvml_client"
"$cc" "${flags[@]}" -shared -fPIC tests/clients/ctorlib.c -o "$out/libctor.so" -ldl
echo "built $out/libctor.so"
