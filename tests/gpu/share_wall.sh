#!/usr/bin/env bash
# The compute share's host wall on a real GPU (issue 24 item 3; tests/e2e/monitor-share.test.sh is the fake
# driver's version): a runc container at vgpu.io/compute-limit 10 whose process renames /etc (no
# /etc/ld.so.preload: the library never loads) and runs compute_client's saturating loop of 2 ms kernels,
# with `vgpuctl monitor` (share wall "freeze", a 5 s window) watching it from the host: the loop alone
# without any container first, then in the container. Prints the client's GPU time (share=), the monitor's
# findings and how often the container's cgroup was seen frozen, and "N passed, N failed".
# Run from the repository root on the GPU machine (device tool), as tests/gpu/container.sh:
#   carry: target/vgpu  .deps/gpu    command: bash tests/gpu/share_wall.sh   (SECS: the loop's seconds, 20)
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export GPU_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
source tests/gpu/lib.sh
unpack_container_tools
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')
libcuda_dir=$(dirname "${libcuda:-/usr/lib/x86_64-linux-gnu/libcuda.so.1}")
CUDA_INCLUDE=$cuda_inc LIBCUDA_DIR=$libcuda_dir OUT=target/clients bash tests/clients/build.sh >/dev/null
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/share-wall.log") 2>&1; fi
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), runc $("$RUNC" --version | head -1)"

. tests/e2e/lib/common.sh
. tests/e2e/lib/bundle.sh
. tests/e2e/lib/vgpu.sh
. tests/e2e/lib/gpu.sh
t_init gpu-share-wall
VGPUCTL=$T/release/vgpuctl
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$VGPUCTL" "$CLIENTS_DIR/compute_client"
vgpu_config lower_runtime="\"$RUNC\"" nvml_library='"libnvidia-ml.so.1"'
printf '[monitor]\nshare_window_seconds = 5\n' >>"$VGPU_CONFIG"
R=$WORK/runc-root
SECS=${SECS:-20}
CG2=$(findmnt -n -t cgroup2 -o TARGET 2>/dev/null | head -1); CG2=${CG2:-/sys/fs/cgroup}

echo "== the loop alone, no container, no library"
out=$("$CLIENTS_DIR/compute_client" plain 5)
echo "$out"
bare=$(field share "$out" | cut -d. -f1)
check "the loop alone keeps the GPU busy (${bare}%)" test "${bare:-0}" -ge 80

echo "== a container at vgpu.io/compute-limit 10 whose process drops the preload, the monitor watching"
"$VGPUCTL" monitor --listen 127.0.0.1:0 --interval 1 >"$WORK/mon.log" 2>&1 &
MON=$!
on_exit "kill $MON 2>/dev/null"
wait_for 20 grep -q 'serving http://' "$WORK/mon.log" || cat "$WORK/mon.log"
head -1 "$WORK/mon.log"
b=$WORK/b-wall
gpu_bundle "$b" "$WORK/rootfs-wall" sh -c "mv /etc /etc2 && exec compute_client plain $SECS"
bundle_annotate "$b" vgpu.io/compute-limit 10
# /etc renamed takes ld.so.cache with it: the driver's folder by path.
bundle_env "$b" LD_LIBRARY_PATH="$libcuda_dir${GPU_HOST_LD_LIBRARY_PATH:+:$GPU_HOST_LD_LIBRARY_PATH}"
"$SHIM" --root "$R" run --bundle "$b" wall </dev/null >"$WORK/wall.out" 2>&1 &
PW=$!
for _ in $(seq 100); do pid=$("$RUNC" --root "$R" state wall 2>/dev/null | jq -r '.pid // 0'); [ "${pid:-0}" -gt 0 ] && break; sleep 0.1; done
cg=$CG2$(awk -F: '$1 == "0" { print $3 }' "/proc/$pid/cgroup" 2>/dev/null)
echo "container cgroup: $cg"
while [ -e "$cg/cgroup.events" ]; do grep -h '^frozen' "$cg/cgroup.events" 2>/dev/null; sleep 0.05; done >"$WORK/frozen" &
wait "$PW"
"$RUNC" --root "$R" delete -f wall >/dev/null 2>&1 || true
cat "$WORK/wall.out"
grep 'over its compute share\|thaw' "$WORK/mon.log" | head -3
s=$(field share "$(cat "$WORK/wall.out")" | cut -d. -f1)
n1=$(grep -c 'frozen 1' "$WORK/frozen"); n0=$(grep -c 'frozen 0' "$WORK/frozen")
echo "cgroup.events samples (50 ms): frozen 1 x$n1, frozen 0 x$n0"
echo "-- the monitor's log"; tail -8 "$WORK/mon.log"
check "the monitor found the container over its share (NVML) and froze its cgroup" grep -q 'over its compute share: container wall .*freezing' "$WORK/mon.log"
check "the cgroup was seen frozen and thawed again ($n1 / $((n0 + n1)) samples frozen)" test "$n1" -gt 0 -a "$n0" -gt 0
check "the bypassing loop is held near its share + tolerance: ${s}% of the GPU's time (bare ${bare}%)" test "${s:-100}" -le 30
t_done
