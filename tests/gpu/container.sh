#!/usr/bin/env bash
# The OCI flow on a real GPU (issue 4, item 7): runc, carried as Debian's .deb and unpacked, runs containers
# through vgpu-container-runtime whose rootfs is the host's system folders mounted read-only. Checks, on the
# GPU: `make demo`'s container (driver-API client + nvidia-smi), PyTorch inside a container with an
# annotation quota, two processes sharing one container's quota, two containers with independent quotas on
# one GPU, two containers at vgpu.io/compute-limit 30 and 70 at once (time-sliced, then as clients of an MPS
# daemon the script starts and quits), and no state left behind. Run from the repository root on the GPU machine (device tool):
#   carry: target/vgpu  .deps/gpu   (the .debs of runc, libseccomp2, jq; vgpu-hook, vgpu-container-runtime
#                                   and vgpuctl built for glibc 2.28 in .deps/gpu/bin)
#   command: bash tests/gpu/container.sh
# Prints "N passed, N failed" and writes the log to $OUT/container.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
# The driver is where the host finds it; the containers get the same LD_LIBRARY_PATH.
export GPU_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
source tests/gpu/lib.sh
unpack_container_tools
# The test clients, built against this machine's CUDA.
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')
for d in ${LD_LIBRARY_PATH//:/ } "${CUDA_HOME:-/usr/local/cuda}/lib64/stubs"; do
    [ -z "$libcuda" ] && { [ -e "$d/libcuda.so.1" ] || [ -e "$d/libcuda.so" ]; } && libcuda=$d/libcuda.so
done
libcuda_dir=$(dirname "${libcuda:-/usr/lib/x86_64-linux-gnu/libcuda.so.1}")
CUDA_INCLUDE=$cuda_inc LIBCUDA_DIR=$libcuda_dir OUT=target/clients bash tests/clients/build.sh >/dev/null

if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/container.log") 2>&1; fi
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
echo "== runc $("$RUNC" --version | head -1), $(jq --version)"
echo "== libcuda: $(ldconfig -p | grep -m1 'libcuda\.so\.1 ' || echo 'not in ld.so.cache'); LD_LIBRARY_PATH=$GPU_HOST_LD_LIBRARY_PATH"

echo "== make demo (GPU mode)"
VGPU_DEMO_MODE=gpu VGPU_DEMO_QUOTA=4Gi bash tests/demo.sh; demo_rc=$?

. tests/e2e/lib/common.sh
. tests/e2e/lib/bundle.sh
. tests/e2e/lib/vgpu.sh
. tests/e2e/lib/gpu.sh
t_init gpu-container
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$CLIENTS_DIR/rt_client"
check_eq "make demo on the GPU" "$demo_rc" 0
vgpu_config lower_runtime="\"$RUNC\"" nvml_library='"libnvidia-ml.so.1"'
R=$WORK/runc-root
GiB=1073741824
TORCH=${GPU_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}

# run_container ID QUOTA_ANNOTATION CMD...: runs a container to completion through the shim, prints its output.
run_container() {
    local id=$1 quota=$2; shift 2
    local b=$WORK/b-$id
    gpu_bundle "$b" "$WORK/rootfs-$id" "$@"
    bundle_annotate "$b" vgpu.io/memory-limit "$quota"
    bundle_bind "$b" "$REPO/tests/gpu" /vgpu-tests ro
    "$SHIM" --root "$R" run --bundle "$b" "$id" </dev/null 2>&1
    "$RUNC" --root "$R" delete -f "$id" >/dev/null 2>&1 || true
}

echo "== PyTorch in a container, annotation vgpu.io/memory-limit=8Gi"
out=$(run_container torch 8Gi "$TORCH" /vgpu-tests/torch_case.py fill --quota $((8 * GiB)))
printf '%s\n' "$out" | tail -5
res=$(printf '%s\n' "$out" | sed -n 's/^RESULT //p' | tail -1)
check_match "PyTorch: a RESULT line" '^\{' "$res"
check_eq "PyTorch: torch.cuda.mem_get_info() total is the quota" "$(jq -r '.total' <<<"$res" 2>/dev/null)" $((8 * GiB))
check_eq "PyTorch: filling ends in torch.cuda.OutOfMemoryError" "$(jq -r '.oom_clean' <<<"$res" 2>/dev/null)" true
granted=$(jq -r '.granted // 0' <<<"$res" 2>/dev/null)
check "PyTorch: granted ($((granted / 1048576)) MiB) within the quota" test "${granted:-0}" -gt 0 -a "${granted:-0}" -le $((8 * GiB))
check_eq "PyTorch: training loop ran under the quota" "$(jq -r '.train_ok' <<<"$res" 2>/dev/null)" true

echo "== two processes in one container share its 4 GiB quota"
out=$(run_container shared 4Gi sh -c 'rt_client device 0 alloc 2Gi sleep 20 & sleep 10; rt_client device 0 info fill 256Mi; wait')
printf '%s\n' "$out" | grep -E '^op=(info|fill|alloc)'
f=$(printf '%s\n' "$out" | grep '^op=fill' | tail -1)
i=$(printf '%s\n' "$out" | grep '^op=info' | tail -1)
got=$(field bytes "$f"); free2=$(field free "$i")
check_match "second process refused with OUT_OF_MEMORY" 'err=CUDA_ERROR_OUT_OF_MEMORY' "$f"
check "second process sees the first's 2 GiB as used (free $((free2 / 1048576)) MiB < 2 GiB)" test "${free2:-0}" -gt 0 -a "${free2:-0}" -lt $((2 * GiB))
check "second process got what was left, not more (got $((got / 1048576)) MiB <= free)" test "${got:-0}" -gt 0 -a "${got:-0}" -le "${free2:-0}"

echo "== two containers on one GPU, quotas 2 GiB and 3 GiB, at the same time"
run_container c2g 2Gi sh -c 'rt_client device 0 info fill 256Mi sleep 15' > "$WORK/c2g.out" &
bg=$!
sleep 5
out3=$(run_container c3g 3Gi sh -c 'rt_client device 0 info fill 256Mi')
wait "$bg"
out2=$(cat "$WORK/c2g.out")
printf '%s\n' "$out2" "$out3" | grep -E '^op=(info|fill)'
check_eq "container A sees 2 GiB" "$(field total "$(grep '^op=info' <<<"$out2")")" $((2 * GiB))
check_eq "container B sees 3 GiB" "$(field total "$(grep '^op=info' <<<"$out3")")" $((3 * GiB))
a=$(field bytes "$(grep '^op=fill' <<<"$out2")"); b=$(field bytes "$(grep '^op=fill' <<<"$out3")")
check "container A filled its own quota ($((a / 1048576)) MiB)" test "${a:-0}" -gt $((GiB)) -a "${a:-0}" -le $((2 * GiB))
check "container B filled its own quota, unaffected by A ($((b / 1048576)) MiB)" test "${b:-0}" -gt $((2 * GiB)) -a "${b:-0}" -le $((3 * GiB))

echo "== the compute share in containers: vgpu.io/compute-limit 30 and 70 at once, time-sliced, then under MPS"
# run_share ID PCT START_AT [mps]: a container running the compute case's saturating matmul loop (from START_AT,
# 3 s of warm-up then 10 s timed) under vgpu.io/compute-limit=PCT ("none": no annotation); "mps": a client of the host's MPS
# daemon (its pipe folder mounted, the host's IPC namespace).
run_share() {
    local id=$1 pct=$2 at=$3 mps=${4:-}
    local b=$WORK/b-$id
    gpu_bundle "$b" "$WORK/rootfs-$id" "$TORCH" /vgpu-tests/compute_case.py matmul --seconds 10 --start-at "$at"
    [ "$pct" != none ] && bundle_annotate "$b" vgpu.io/compute-limit "$pct"
    bundle_bind "$b" "$REPO/tests/gpu" /vgpu-tests ro
    if [ -n "$mps" ]; then
        bundle_bind "$b" "$MPS_PIPE" "$MPS_PIPE"
        bundle_env "$b" CUDA_MPS_PIPE_DIRECTORY="$MPS_PIPE"
        bundle_jq "$b" '.linux.namespaces |= map(select(.type != "ipc"))'
    fi
    "$SHIM" --root "$R" run --bundle "$b" "$id" </dev/null 2>&1
    "$RUNC" --root "$R" delete -f "$id" >/dev/null 2>&1 || true
}
tflops() { sed -n 's/^RESULT //p' "$1" | tail -1 | jq -r '.tflops // 0' 2>/dev/null || echo 0; }
# share_pair NAME [mps]: the 30% and 70% containers at once; sets s30 and s70, percent of the loop alone.
share_pair() {
    local at=$(( $(date +%s) + 25 ))
    run_share "$1-30" 30 "$at" "${2:-}" > "$WORK/$1-30.out" &
    local p=$!
    run_share "$1-70" 70 "$at" "${2:-}" > "$WORK/$1-70.out"
    wait "$p"
    s30=$(awk -v t="$(tflops "$WORK/$1-30.out")" -v b="$base" 'BEGIN { printf "%.1f", (b > 0 ? 100 * t / b : 0) }')
    s70=$(awk -v t="$(tflops "$WORK/$1-70.out")" -v b="$base" 'BEGIN { printf "%.1f", (b > 0 ? 100 * t / b : 0) }')
}
within() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }
run_share calone none $(( $(date +%s) + 15 )) > "$WORK/calone.out"
base=$(tflops "$WORK/calone.out")
check "the loop alone in a container, no share: $base TFLOP/s" within "$base" 1 100000
share_pair sliced
check "time-sliced: the 30% container gets 30 ± 5 ($s30%)" within "$s30" 25 35
check "time-sliced: the 70% container gets 70 ± 5 ($s70%)" within "$s70" 65 75
MPS_PIPE=$WORK/mps-pipe
mkdir -p "$MPS_PIPE" "$WORK/mps-log"
if CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log nvidia-cuda-mps-control -d; then
    sleep 1
    share_pair mps mps
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control
    grep -h 'RESULT\|rror' "$WORK"/mps-*.out | tail -4
    check "under MPS: the 30% container gets 30 ± 5 ($s30%)" within "$s30" 25 35
    check "under MPS: the 70% container gets 70 ± 5 ($s70%)" within "$s70" 65 75
else
    echo "  skipped: no MPS control daemon could be started here"
fi

check_eq "no state left under the state root" "$(state_left)" ""
t_done
