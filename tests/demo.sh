#!/usr/bin/env bash
# `make demo`: one real container, started with runc through vgpu-container-runtime, with a GPU memory quota.
# It shows the quota as the container sees it, an allocation refused past it, and the container's state gone
# from the host once it has exited.
#
# On a machine where `nvidia-smi -L` works it uses the real GPU: the host's driver libraries, its
# /dev/nvidia* nodes, a rootfs made of read-only bind mounts of the host's system folders, quota 4 GiB.
# Elsewhere it uses the project's fake driver (one 16 GiB fake GPU) in a busybox rootfs, quota 1 GiB.
# Overrides: VGPU_DEMO_MODE=gpu|fake (instead of detecting), VGPU_DEMO_QUOTA (e.g. 2Gi), RUNC (runc binary),
# VGPU_DEMO_DRIVER_DIR (gpu mode: a folder with libcuda.so.1 and libnvidia-ml.so.1 to use instead of the
# host's installed driver; this is how the gpu mode's container layout is exercised without a GPU).
set -euo pipefail
. "$(dirname "$0")/e2e/lib/common.sh"
. "$(dirname "$0")/e2e/lib/rootfs.sh"
. "$(dirname "$0")/e2e/lib/bundle.sh"
. "$(dirname "$0")/e2e/lib/vgpu.sh"
. "$(dirname "$0")/e2e/lib/gpu.sh"
RUNC=${RUNC:-$(command -v runc || true)}
[ -n "$RUNC" ] || { echo "demo: runc not found (set RUNC=/path/to/runc)"; exit 1; }
t_init demo
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$CLIENTS_DIR/rt_client"

if [ -n "${VGPU_DEMO_MODE:-}" ]; then
    MODE=$VGPU_DEMO_MODE
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    MODE=gpu
else
    MODE=fake
fi
ID=vgpu-demo
B=$WORK/bundle
R=$WORK/runc-root
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
mib() { echo $(( $1 / 1048576 )); }

if [ "$MODE" = gpu ]; then
    QUOTA=${VGPU_DEMO_QUOTA:-4Gi}
    say "vgpu demo on a real GPU: one runc container through vgpu-container-runtime, quota $QUOTA"
    { nvidia-smi -L 2>/dev/null || echo "(nvidia-smi -L failed)"; } | head -1 | sed 's/^/  host: /'
    ROOTFS=$WORK/rootfs
    GPU_HOST_LD_LIBRARY_PATH=${GPU_HOST_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}
    gpu_bundle "$B" "$ROOTFS" sh -c 'rt_client device 0 info fill 256Mi; echo; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>&1 || true'
    bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT="$QUOTA"
    nvml='"libnvidia-ml.so.1"'
    if [ -n "${VGPU_DEMO_DRIVER_DIR:-}" ]; then
        bundle_bind "$B" "$VGPU_DEMO_DRIVER_DIR" /vgpu-driver ro
        bundle_env "$B" LD_LIBRARY_PATH=/vgpu-driver
        nvml="\"$VGPU_DEMO_DRIVER_DIR/libnvidia-ml.so.1\""
    fi
    vgpu_config lower_runtime="\"$RUNC\"" nvml_library="$nvml"
else
    QUOTA=${VGPU_DEMO_QUOTA:-1Gi}
    say "vgpu demo on the fake GPU driver (no NVIDIA GPU here): one runc container through vgpu-container-runtime, quota $QUOTA"
    t_require "$FAKE_DIR/libcuda.so.1" "$T/vgpu/libvgpu_core.so"
    echo "  host: one fake 16 GiB GPU (target/fake/libcuda.so.1 and libnvidia-ml.so.1, mounted into the container)"
    ROOTFS=$WORK/rootfs
    rootfs_busybox "$ROOTFS"
    rootfs_add_libs "$ROOTFS" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR"/* "$LIBVGPU" "$T/vgpu/libvgpu_core.so"
    mkdir -p "$WORK/fakestate"
    bundle_new "$B" "$ROOTFS" rt_client device 0 info fill 256Mi
    fake_gpu_mounts "$B" "$WORK/fakestate"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT="$QUOTA"
    vgpu_config lower_runtime="\"$RUNC\""
fi
on_exit "'$RUNC' --root '$R' delete -f $ID"

say "1. create: the engine calls vgpu-container-runtime create (it edits config.json, provisions, execs runc)"
echo "  \$ vgpu-container-runtime --root ... create --bundle $B $ID      # env CUDA_DEVICE_MEMORY_LIMIT=$QUOTA"
"$SHIM" --root "$R" create --bundle "$B" "$ID" </dev/null >"$WORK/container.out" 2>&1 || { cat "$WORK/container.out"; exit 1; }
echo "  state on the host, $STATE/containers/$ID/:"
(cd "$STATE/containers/$ID" && find . -type f | sort | sed 's/^\.\//    /')
echo "  limits.json (mounted read-only at /run/vgpu/limits.json):"
jq -c '{devices: [.devices[] | {index, uuid, memory_limit}], init_pid, pid_ns}' "$STATE/containers/$ID/limits.json" | sed 's/^/    /'
echo "  hooks added to config.json: $(jq -c '[.hooks | to_entries[] | select(any(.value[]; .args[0] == "vgpu-hook")) | .key]' "$B/config.json")"

say "2. start: inside the container"
"$RUNC" --root "$R" start "$ID"
wait_for 300 sh -c "'$RUNC' --root '$R' state $ID | jq -e '.status == \"stopped\"'" || echo "  (container still running after 300 s)"
out=$(cat "$WORK/container.out")
total=$(field total "$out" || true); free=$(field free "$out" || true); bytes=$(field bytes "$out" || true); count=$(field count "$out" || true)
phys=$(printf '%s\n' "$out" | grep -o 'name=[^ ]*' | head -1 | cut -d= -f2 | tr _ ' ' || true)
if [ -z "$total" ]; then echo "  the client did not report:"; printf '%s\n' "$out" | sed 's/^/    | /'; exit 1; fi
echo "  GPU                          : $phys"
echo "  total memory it sees         : $(mib "$total") MiB   (cuMemGetInfo and cuDeviceTotalMem: the quota)"
echo "  free at start                : $(mib "$free") MiB   (its CUDA context already holds $(mib $((total - free))) MiB)"
echo "  allocating 256 MiB at a time : $count granted ($(mib "$bytes") MiB), then $(printf '%s\n' "$out" | grep -o 'op=fill.*err=[A-Z_]*' | grep -o 'err=.*' | cut -d= -f2)"
printf '%s\n' "$out" | grep -E '^\[vgpu' | head -1 | sed 's/^/  library: /'
if [ "$MODE" = gpu ]; then
    printf '%s\n' "$out" | sed -n '/^name, memory.total/,$p' | sed 's/^/  nvidia-smi in the container: /'
fi

say "3. delete: runc runs the poststop hook"
"$RUNC" --root "$R" delete "$ID"
left=$(state_left)
echo "  state left under $STATE/containers: ${left:-(none)}"
if [ -z "$left" ] && [ "$total" -le $((64 * 1073741824)) ] && printf '%s\n' "$out" | grep -q 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY'; then
    say "demo: OK — the container saw its quota as the GPU's size, was refused past it, and left nothing behind"
else
    say "demo: FAILED"; exit 1
fi
