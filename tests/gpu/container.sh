#!/usr/bin/env bash
# The OCI flow on a real GPU (issue 4, item 7): runc, carried as Debian's .deb and unpacked, runs containers
# through vgpu-container-runtime whose rootfs is the host's system folders mounted read-only. Checks, on the
# GPU: `make demo`'s container (driver-API client + nvidia-smi), PyTorch inside a container with an
# annotation quota, two processes sharing one container's quota, two containers with independent quotas on
# one GPU, and no state left behind. Run from the repository root on the GPU machine (device tool):
#   carry: target/vgpu  .deps/gpu   (the .debs of runc, libseccomp2, jq; vgpu-hook, vgpu-container-runtime
#                                   and vgpuctl built for glibc 2.28 in .deps/gpu/bin)
#   command: bash tests/gpu/container.sh
# Prints "N passed, N failed" and writes the log to $OUT/container.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
# The driver is where the host finds it; the containers get the same LD_LIBRARY_PATH.
export GPU_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
DEBS=/tmp/vgpu-debs
mkdir -p "$DEBS" target/release
for d in .deps/gpu/*.deb; do dpkg -x "$d" "$DEBS"; done
export PATH=$DEBS/usr/bin:$DEBS/usr/sbin:$PATH LD_LIBRARY_PATH=$DEBS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cp .deps/gpu/bin/* target/release/
export RUNC=$DEBS/usr/sbin/runc
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

check_eq "no state left under the state root" "$(state_left)" ""
t_done
