#!/usr/bin/env bash
# Kubernetes for real, without a kubelet: a private containerd with its CRI plugin, driven by the kubelet
# stand-in (tests/cri-client) exactly as the kubelet drives it — RunPodSandbox with runtime_handler "vgpu"
# and the pod's annotations, CreateContainer/StartContainer for a pod's containers, their logs,
# StopPodSandbox/RemovePodSandbox. The sandbox image is made here (busybox rootfs, `ctr images import`);
# pods use the node's network (no CNI). GPUs reach containers as the NVIDIA device plugin gives them
# (NVIDIA_VISIBLE_DEVICES), the fake driver mounted in as in the other container suites.
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
. "$(dirname "$0")/lib/cri.sh"
t_init cri
t_require "$CRI_CLIENT" "$VGPUCTL" "$SHIM" "$HOOK" "$LIBVGPU" "$CORE" "$FAKE_DIR/libcuda.so.1" "$CLIENTS_DIR/rt_client"
command -v containerd >/dev/null || { echo "cri: containerd not installed"; echo "0 passed, 1 failed"; exit 1; }
GIB=1073741824
IMAGE=localhost/vgpu-e2e:1
on_exit cri_stop

engine_rootfs "$WORK/rootfs" || { fail "busybox rootfs"; t_done; }
rootfs_add_libs "$WORK/rootfs" "$CLIENTS_DIR"/*
# One image for the sandbox (its default command sleeps) and the containers (which name their command).
oci_image_tar "$WORK/rootfs" "$IMAGE" "$WORK/image.tar" /bin/sleep 2147483647
FAKESTATE=$WORK/fakestate
mkdir -p "$FAKESTATE" "$WORK/pods"
vgpu_config
echo "-- a private containerd with CRI, sandbox_image $IMAGE"
if ! cri_start "$WORK/ctd" "$IMAGE"; then fail "containerd's CRI answers" "$(tail -5 "$WORK/ctd/containerd.log")"; t_done; fi
pass "containerd's CRI answers: $(cri version)"
check "sandbox image imported into k8s.io" cri_import "$WORK/image.tar"

# run_pod NAME ANNOTATION...: a pod of the vgpu RuntimeClass; its file in $WORK/pods/NAME.json.
run_pod() {
    local name=$1 a args=(); shift
    for a in "$@"; do args+=(--annotation "$a"); done
    mkdir -p "$WORK/logs/$name"
    cri run-pod --save "$WORK/pods/$name.json" --name "$name" --log-dir "$WORK/logs/$name" "${args[@]}"
}
# container POD NAME GPU CMD...: creates and starts a container (GPU "-" for none); prints its id.
container() {
    local pod=$1 name=$2 gpu=$3 id; shift 3
    local env=(--env LD_LIBRARY_PATH=/opt/fake --env FAKE_CUDA_STATE_DIR=/fakestate --env PATH=/opt/clients:/bin)
    [ "$gpu" != - ] && env+=(--env "NVIDIA_VISIBLE_DEVICES=$gpu")
    id=$(cri create --pod "$WORK/pods/$pod.json" --name "$name" --image "$IMAGE" "${env[@]}" \
        --mount "$FAKE_DIR:/opt/fake:ro" --mount "$CLIENTS_DIR:/opt/clients:ro" --mount "$FAKESTATE:/fakestate" \
        -- "$@") || return 1
    echo "$id"
    cri start "$id"
}
# untouched WHAT PID ID: the process has no vgpu mount and no preload, and vgpu keeps no state for ID.
untouched() {
    local what=$1 pid=$2 id=$3
    if [ -z "$pid" ] || [ ! -r "/proc/$pid/mountinfo" ]; then fail "$what: running (pid '$pid')"; return; fi
    check_eq "$what: no vgpu mount (ld.so.preload, /run/vgpu)" \
        "$(grep -cE ' /etc/ld.so.preload | /run/vgpu' "/proc/$pid/mountinfo")" 0
    check_eq "$what: no LD_PRELOAD" "$(tr '\0' '\n' < "/proc/$pid/environ" | grep -c '^LD_PRELOAD=')" 0
    check "$what: no state under the state root" test ! -e "$STATE/containers/$id"
    check_eq "$what: its spec not provisioned by vgpu" \
        "$(jq -r '.annotations["vgpu.io/provisioned-by"] // "none"' "$WORK/ctd/state/io.containerd.runtime.v2.task/k8s.io/$id/config.json")" none
}

echo "-- pod a: a pod default (1Gi), the trainer's own quota (2Gi), a sidecar without a GPU"
pod_a=$(run_pod a vgpu.io/memory-limit=1Gi vgpu.io/memory-limit.trainer=2Gi) \
    && pass "RunPodSandbox (handler vgpu) with the pod's quota annotations" || fail "RunPodSandbox" "$pod_a"
status=$(cri pod-status --pod "$WORK/pods/a.json")
check_match "the sandbox is ready" '^state=SANDBOX_READY ' "$status"
untouched "pause container" "$(field pid "$status")" "$pod_a"

trainer=$(container a trainer 0 sh -c 'rt_client device 0 info fill 64Mi; grep -E " /etc/ld.so.preload | /run/vgpu" /proc/self/mountinfo | cut -d" " -f5')
check "trainer started" test -n "$trainer"
check_match "trainer exited 0" '^exit_code=0$' "$(cri wait "$trainer")"
out=$(cri logs "$trainer")
check_eq "trainer sees its own quota (vgpu.io/memory-limit.trainer=2Gi) as the GPU's total" "$(field total "$out")" $((2 * GIB))
check_match "trainer's filling stops with out-of-memory at the quota" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_match "trainer has the preload and /run/vgpu mounted (what the others must lack)" '^/etc/ld.so.preload$' "$out"

worker=$(container a worker 0 rt_client device 0 info '!alloc' 512Mi sleep 120)
check "worker started (holds 512 MiB)" test -n "$worker"
check "worker's ledger state provisioned" wait_for 10 test -f "$STATE/containers/$worker/limits.json"
check_eq "worker's limits file has the pod default (1 GiB)" \
    "$(jq -r '.devices[0].memory_limit' "$STATE/containers/$worker/limits.json" 2>&1)" "$GIB"
check "worker holds its 512 MiB" \
    wait_for 10 bash -c "'$CRI_CLIENT' --socket '$CRI_SOCK' logs '$worker' | grep -q 'op=alloc size=536870912 .*rc=0'"
check_eq "worker sees the pod default (1 GiB) as the GPU's total" "$(field total "$(cri logs "$worker")")" "$GIB"
check_eq "worker's limits file names pod and container" \
    "$(jq -r '.kubernetes | "\(.pod)/\(.container)"' "$STATE/containers/$worker/limits.json" 2>&1)" a/worker

sidecar=$(container a sidecar - sleep 120)
check "sidecar (no GPU) started" test -n "$sidecar"
status=$(cri status "$sidecar")
check_match "sidecar is running" '^state=CONTAINER_RUNNING ' "$status"
untouched "sidecar" "$(field pid "$status")" "$sidecar"

echo "-- pod b on the same GPU: its own 3Gi, while pod a's worker holds memory"
pod_b=$(run_pod b vgpu.io/memory-limit=3Gi) && pass "pod b runs" || fail "pod b runs" "$pod_b"
# A context costs 256 MiB (as on a real GPU): 256 + 2560 fits 3 GiB, 512 more does not.
bid=$(container b main 0 rt_client device 0 info alloc 2560Mi alloc 512Mi)
check_match "pod b's container exited 0" '^exit_code=0$' "$(cri wait "$bid")"
out=$(cri logs "$bid")
check_eq "pod b sees 3 GiB" "$(field total "$out")" $((3 * GIB))
check_match "pod b got 2.5 GiB while pod a holds memory on the GPU" 'size=2684354560 .*rc=0' "$out"
check_match "pod b refused 512 MiB more: its own quota" 'size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_match "pod a's worker still runs with its 1 GiB" '^state=CONTAINER_RUNNING ' "$(cri status "$worker")"

echo "-- deleting pods reclaims their state"
check "StopPodSandbox a" cri stop-pod --pod "$WORK/pods/a.json"
check "RemovePodSandbox a" cri remove-pod --pod "$WORK/pods/a.json"
check "pod a's containers' state gone" wait_for 10 bash -c "! ls '$STATE/containers' | grep -qE '^($trainer|$worker|$sidecar|$pod_a)\$'"
check "StopPodSandbox b" cri stop-pod --pod "$WORK/pods/b.json"
check "RemovePodSandbox b" cri remove-pod --pod "$WORK/pods/b.json"
check_eq "nothing left under the state root" "$(state_left)" ""

echo "-- bad quotas: one line through the CRI error, nothing provisioned"
# start_refused WHAT POD CONTAINER GPU REGEX: StartContainer fails with one line matching REGEX.
start_refused() {
    local what=$1 pod=$2 name=$3 gpu=$4 want=$5 err
    err=$(container "$pod" "$name" "$gpu" true 2>&1 >/dev/null)
    if [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -Eq "^vgpu-cri-client: StartContainer: .*$want"; then
        pass "$what: $(printf '%s' "$err" | grep -o 'vgpu: .*' | cut -c1-150)"
    else fail "$what: StartContainer refused with one line /$want/" "$err"; fi
    check_eq "  ... nothing under the state root" "$(state_left)" ""
}
run_pod c vgpu.io/memory-limit.trainer=4Qi vgpu.io/memory-limit.sidecar=1Gi vgpu.io/memory-limit=64Gi > /dev/null \
    && pass "pod c (bad values for its containers) runs its sandbox" || fail "pod c runs"
start_refused "a bad value for the container" c trainer 0 'vgpu: annotation vgpu.io/memory-limit.trainer="4Qi": '
start_refused "a quota naming a container without a GPU" c sidecar - \
    'vgpu: annotation vgpu.io/memory-limit.sidecar is set but the container gets no GPU'
start_refused "the pod default larger than the GPU" c other 0 'vgpu: annotation vgpu.io/memory-limit: 64.0 GiB is larger than'
cri stop-pod --pod "$WORK/pods/c.json" && cri remove-pod --pod "$WORK/pods/c.json"
for bad in "vgpu.io/memory-limit=4Qi:vgpu: annotation vgpu.io/memory-limit=\"4Qi\"" \
           "vgpu.io/memory-limits=1Gi:vgpu: annotation vgpu.io/memory-limits is not one vgpu defines"; do
    err=$(run_pod d "${bad%%:*}" 2>&1 >/dev/null)
    if [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -qF "${bad#*:}" \
        && printf '%s' "$err" | grep -q '^vgpu-cri-client: RunPodSandbox: '; then
        pass "pod annotation ${bad%%:*}: RunPodSandbox refused with one line"
    else fail "pod annotation ${bad%%:*}: RunPodSandbox refused with one line naming it" "$err"; fi
done
check_eq "nothing left under the state root" "$(state_left)" ""
((FAILED)) && { echo "--- containerd log (errors)"; grep 'level=error' "$WORK/ctd/containerd.log" | tail -5; }
t_done
