#!/usr/bin/env bash
# DRA: vgpu-dra-plugin driven by a stand-in kubelet (tests/dra-kubelet) over its real unix sockets, with a
# stand-in API server answering from recorded API objects (lib/fake-apiserver.py: the claim as the API
# server returns it once the scheduler allocated "8Gi and 30% of gpu-0"), and Debian's real Podman running a
# container from the CDI spec prepare wrote (the fake GPU, 16 GiB). What no cluster here can show: a real
# kubelet, scheduler and containerd (docs/engines/kubernetes.md says what was verified where).
. "$(dirname "$0")/engines-lib.sh"
t_init dra
PLUGIN=$T/release/vgpu-dra-plugin
KUBELET=$T/release/vgpu-dra-kubelet
t_require "$PLUGIN" "$KUBELET" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$FAKE_DIR/libcuda.so.1" "$LIBVGPU" "$CORE" "$CLIENTS_DIR/rt_client"
command -v podman > /dev/null || { echo "dra: podman is not installed"; exit 1; }
command -v python3 > /dev/null || { echo "dra: python3 is not installed"; exit 1; }
DATA=$REPO/dra/tests/data
API=$WORK/api CDI=$WORK/cdi PLUGDIR=$WORK/plugins/gpu.vgpu.io REG=$WORK/plugins_registry
mkdir -p "$API/claims" "$CDI" "$WORK/hooks-none"
vgpu_config
export FAKE_CUDA_STATE_DIR=$WORK/fake-cuda

# The API server stand-in and a kubeconfig for it (no credentials: it is local and answers everyone). It has
# the node, and slices left by an earlier life: a stale one of this node and driver (another name), and
# another node's, which is not this plugin's to touch.
mkdir -p "$API/nodes" "$API/slices"
cp "$DATA/claim-8gi-30.json" "$API/claims/team-a_trainer-gpu-x7k2p.json"
NODE_UID=5e0c1d2b-7a3f-4b9e-8c6d-112233445566
echo '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "'$NODE_UID'"}}' > "$API/nodes/node-a.json"
stale_slice() { jq --arg n "$1" --arg node "$2" '.metadata.name = $n | .spec.nodeName = $node | .spec.pool.name = $node | .spec.pool.generation = 3' \
    "$DATA/slice-one-gpu.json" > "$API/slices/$1.json"; }
stale_slice node-a-gpu.vgpu.io-v0 node-a
stale_slice node-z-gpu.vgpu.io node-z
python3 "$REPO/tests/e2e/lib/fake-apiserver.py" "$API" & APIPID=$!
on_exit "kill $APIPID"
wait_for 10 test -s "$API/port" || { echo "dra: the API server stand-in did not start"; exit 1; }
cat > "$WORK/kubeconfig" << YAML
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$(cat "$API/port")"}}]
users: [{name: fake, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
YAML
export KUBECONFIG=$WORK/kubeconfig

PLUGIN_ARGS=(--node-name node-a --plugin-dir "$PLUGDIR" --registry-dir "$REG" --cdi-dir "$CDI")
start_plugin() {
    "$PLUGIN" "${PLUGIN_ARGS[@]}" 2>> "$WORK/plugin.log" & PLUGPID=$!
    wait_for 20 test -S "$PLUGDIR/dra.sock" -a -S "$REG/gpu.vgpu.io-reg.sock"
}
stop_plugin() { kill "$PLUGPID" 2>/dev/null; wait "$PLUGPID" 2>/dev/null; }
on_exit 'stop_plugin'
UID1=6f1c2a9e-3b7d-4e0a-9c51-2d8e4f6a7b10
CLAIM1=(team-a trainer-gpu-x7k2p "$UID1")
# The pod the recorded claim is reserved for (status.reservedFor), and another pod of the node.
POD1=0d3f5b2c-8a41-4c6e-b7f9-1e2a3c4d5e6f POD2=9a8b7c6d-0000-4000-8000-0123456789ab

# 1. The ResourceSlice: published through the API, the recorded one- and two-GPU objects.
ok_if "the plugin starts and serves both sockets" start_plugin
ok_if "it published the node's ResourceSlice by server-side apply" \
    grep -q '^PATCH /apis/resource.k8s.io/v1/resourceslices/node-a-gpu.vgpu.io?.*fieldManager=vgpu-dra-plugin.* application/apply-patch+yaml' "$API/requests.log"
ok_if "a one-GPU node: the recorded slice, owned by its Node, at the generation after the stale slice's 3" \
    jq -e --slurpfile want "$DATA/slice-one-gpu.json" --arg u "$NODE_UID" \
    '.metadata.ownerReferences == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": $u, "controller": true}]
     and .spec.pool.generation == 4 and (del(.metadata.ownerReferences) | .spec.pool.generation = 1) == $want[0]' \
    "$API/slices/node-a-gpu.vgpu.io.json" > /dev/null
ok_if "the published device says what the GPU is, as a claim's selector reads it (NVML through the real binding)" \
    jq -e '.spec.devices[0] | .attributes == {"index": {"int": 0}, "uuid": {"string": "GPU-fa4ec0de-0000-4000-8000-000000000000"},
        "productName": {"string": "NVIDIA H100 (fake, 16 GiB)"}, "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"}, "driverVersion": {"version": "580.65.6"},
        "cudaDriverVersion": {"version": "13.0.0"}} and .capacity.memory.value == "16Gi"' \
    "$API/slices/node-a-gpu.vgpu.io.json" > /dev/null
ok_if "the node's stale slice was deleted, another node's kept" bash -c \
    "test ! -e '$API/slices/node-a-gpu.vgpu.io-v0.json' -a -e '$API/slices/node-z-gpu.vgpu.io.json' &&
     grep -Eq '^DELETE /apis/resource.k8s.io/v1/resourceslices/node-a-gpu.vgpu.io-v0[? ]' '$API/requests.log' &&
     ! grep -q '^DELETE .*node-z' '$API/requests.log'"
FAKE_CUDA_DEVICES=16Gi,81559Mi "$PLUGIN" --node-name node-b --print-slice > "$WORK/two.json"
ok_if "a two-GPU node (16 GiB and an H100's 81559 MiB): the recorded slice" \
    jq -e --slurpfile want "$DATA/slice-two-gpus.json" '. == $want[0]' "$WORK/two.json" > /dev/null

# 2. Registration, as the kubelet's plugin watcher does it.
"$KUBELET" register "$REG" > "$WORK/reg.json"
ok_if "registration: a DRAPlugin named gpu.vgpu.io serving v1.DRAPlugin at its DRA socket" jq -e --arg s "$PLUGDIR/dra.sock" \
    '.type == "DRAPlugin" and .name == "gpu.vgpu.io" and .supported_versions == ["v1.DRAPlugin"] and .endpoint == $s and .registered' "$WORK/reg.json" > /dev/null
ok_if "the plugin heard it was registered" grep -q 'registered with the kubelet' "$WORK/plugin.log"

# 3. Prepare: the claim read from the API, its CDI spec written, its device names returned.
"$KUBELET" prepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/prep1.json"
ok_if "prepare returns the claim's CDI device" jq -e --arg u "$UID1" \
    '.claims[$u] == {"devices": [{"request_names": ["gpu"], "pool": "node-a", "device": "gpu-0", "cdi_device_ids": ["vgpu.io/claim=\($u)-gpu-0"]}], "error": ""}' "$WORK/prep1.json" > /dev/null
ok_if "it read the claim from the API server" grep -q "^GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/trainer-gpu-x7k2p" "$API/requests.log"
SPEC=$CDI/vgpu.io-claim_$UID1.json
ok_if "the claim's CDI spec: its GPU's node, the quota and its pod in the provisioning hook's env only" jq -e --arg h "$HOOK" --arg p "$POD1" \
    '.kind == "vgpu.io/claim" and .devices[0].containerEdits.deviceNodes[0].path == "/dev/nvidia0"
     and ([.containerEdits.hooks[] | [.hookName, .path, (.env | map(select(startswith("VGPU_CLAIM_"))))]]
          == [["createRuntime", $h, ["VGPU_CLAIM_QUOTA=vgpu.io/memory-limit=8589934592,vgpu.io/compute-request=30", "VGPU_CLAIM_PODS=\($p)"]], ["poststop", $h, []]])' "$SPEC" > /dev/null
ok_if "and the checkpoint has the claim" jq -e --arg u "$UID1" '.claims[$u].namespace == "team-a"' "$PLUGDIR/checkpoint.json" > /dev/null
"$KUBELET" prepare "$PLUGDIR/dra.sock" team-a absent 00000000-0000-0000-0000-000000000000 > "$WORK/absent.json"
ok_if "a claim the API server does not have: an error for that claim alone, nothing written" bash -c \
    "jq -e '.claims[\"00000000-0000-0000-0000-000000000000\"].error | test(\"cannot read it from the API server\")' '$WORK/absent.json' > /dev/null && test \$(ls '$CDI' | wc -l) -eq 1"

# 4. A restart in between: the claim is gone from the API server, the checkpoint still answers.
stop_plugin
ok_if "a stopped plugin removed its sockets" test ! -e "$PLUGDIR/dra.sock" -a ! -e "$REG/gpu.vgpu.io-reg.sock"
rm "$API/claims/team-a_trainer-gpu-x7k2p.json"
: > "$API/requests.log"
ok_if "the plugin starts again" start_plugin
"$KUBELET" register "$REG" > /dev/null
"$KUBELET" prepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/prep2.json"
ok_if "after the restart prepare gives the same devices" jq -e --slurpfile a "$WORK/prep1.json" '. == $a[0]' "$WORK/prep2.json" > /dev/null
ok_if "from its checkpoint (no claim read from the API server)" bash -c "! grep -q resourceclaims '$API/requests.log'"
ok_if "the restart published the same GPU at the pool's next generation (5)" \
    jq -e '.spec.pool.generation == 5 and (.spec.devices | length) == 1' "$API/slices/node-a-gpu.vgpu.io.json" > /dev/null

# 5. A real container from the spec prepare wrote, whose own annotations and env ask for more. Podman plays
# the CRI runtime: it writes the pod uid annotation containerd writes (io.kubernetes.cri.sandbox-uid).
P=(podman --root "$WORK/storage" --runroot "$WORK/runroot" --tmpdir "$WORK/tmp" --storage-driver vfs
   --cgroup-manager cgroupfs --events-backend none --runtime runc --hooks-dir "$WORK/hooks-none")
RUN=(run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
if [ ! -d /etc/cdi ]; then mkdir /etc/cdi && on_exit "rmdir /etc/cdi"; fi
pm() { unshare -m sh -c 'mount --make-rprivate / && mount --bind "$0" /etc/cdi && shift && exec "$@"' "$CDI" - "${P[@]}" "$@"; }
podman_cleanup() {
    "${P[@]}" rm -af > /dev/null 2>&1
    grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
}
on_exit podman_cleanup
engine_rootfs "$WORK/rootfs" "$CLIENTS_DIR/rt_client"
tar -C "$WORK/rootfs" -c . | "${P[@]}" import - localhost/vgpu-e2e:rootfs > /dev/null 2>&1
FAKE=(-e LD_LIBRARY_PATH=/usr/local/fake -v "$FAKE_DIR:/usr/local/fake:ro" -v "$WORK/fake-cuda:$WORK/fake-cuda" -e FAKE_CUDA_STATE_DIR="$WORK/fake-cuda")
DEV=$(jq -r --arg u "$UID1" '.claims[$u].devices[0].cdi_device_ids[0]' "$WORK/prep2.json")
pm "${RUN[@]}" --device "$DEV" --annotation io.kubernetes.cri.sandbox-uid=$POD1 --annotation vgpu.io/memory-limit=12Gi --annotation vgpu.io/compute-limit=90 \
    --annotation vgpu.io/compute-request=90 -e CUDA_DEVICE_MEMORY_LIMIT=14g -e CUDA_DEVICE_SM_REQUEST=100 "${FAKE[@]}" localhost/vgpu-e2e:rootfs \
    /bin/sh -c 'cat /run/vgpu/limits.json; exec "$@"' - /bin/rt_client info '!alloc' 6Gi alloc 4Gi > "$WORK/run.out" 2>&1
ok_if "the container's limits are the claim's: 8 GiB and 30%, not its own 12Gi / 90 / 90 / 14g / 100" \
    grep -qE '"memory_limit": *8589934592' "$WORK/run.out"
# issue 42: a claim's compute capacity is its request (a floor, no limit), not a hard cap.
ok_if "its compute share is the claim's request of 30, with no limit" bash -c \
    "grep -qE '\"compute_request\": *30' '$WORK/run.out' && ! grep -q '\"compute_limit\"' '$WORK/run.out'"
ok_if "inside, the GPU's total is the claimed 8 GiB" grep -q 'op=info .*total=8589934592' "$WORK/run.out"
ok_if "6 GiB fits, 4 GiB more fails with out-of-memory" bash -c \
    "grep -q 'op=alloc size=6442450944 .*rc=0' '$WORK/run.out' && grep -q 'op=alloc size=4294967296 .*err=CUDA_ERROR_OUT_OF_MEMORY' '$WORK/run.out'"
ok_if "poststop removed the container's state" test -z "$(state_left)"

# 5b. The claim is its pod's alone: another pod's container naming the claim's CDI device (a tenant who may
# write cdi.k8s.io/* pod annotations), or a container of no pod, is refused by the hook, nothing left.
pm "${RUN[@]}" --device "$DEV" --annotation io.kubernetes.cri.sandbox-uid=$POD2 "${FAKE[@]}" localhost/vgpu-e2e:rootfs \
    /bin/rt_client info > "$WORK/foreign.out" 2>&1; rc=$?
ok_if "another pod's container given the claim's device is refused, naming its pod" bash -c \
    "test $rc -ne 0 && grep -q 'is in pod $POD2, which the DRA claim is not reserved for' '$WORK/foreign.out'"
pm "${RUN[@]}" --device "$DEV" --annotation io.kubernetes.pod.uid=$POD1 --annotation io.kubernetes.cri.sandbox-uid=$POD2 \
    "${FAKE[@]}" localhost/vgpu-e2e:rootfs /bin/rt_client info > "$WORK/mixed.out" 2>&1; rc=$?
ok_if "  ... also when CRI-O's key names the claim's pod beside it" bash -c \
    "test $rc -ne 0 && grep -q 'is in pod $POD2' '$WORK/mixed.out'"
pm "${RUN[@]}" --device "$DEV" "${FAKE[@]}" localhost/vgpu-e2e:rootfs /bin/rt_client info > "$WORK/nopod.out" 2>&1; rc=$?
ok_if "a container of no pod given the claim's device is refused" bash -c \
    "test $rc -ne 0 && grep -q 'names no pod' '$WORK/nopod.out'"
pm "${RUN[@]}" --device "$DEV" --annotation io.kubernetes.pod.uid=$POD1 "${FAKE[@]}" localhost/vgpu-e2e:rootfs \
    /bin/rt_client info > "$WORK/crio.out" 2>&1
ok_if "the claim's pod by CRI-O's key (io.kubernetes.pod.uid) runs with the claim's 8 GiB" \
    grep -q 'op=info .*total=8589934592' "$WORK/crio.out"
ok_if "the refused containers left no state" test -z "$(state_left)"

# 5c. vgpu's runtime handler with a claim: real runc through vgpu-container-runtime, the bundle's spec
# carrying the claim's hooks as a CDI-aware engine applies them and a quota annotation the shim plans from.
# The hook refuses it (the shim's quota would be the annotation's, not the claim's) and nothing is left.
. "$REPO/tests/e2e/lib/bundle.sh"
B=$WORK/shim-bundle
bundle_new "$B" "$WORK/rootfs" /bin/rt_client info
fake_gpu_mounts "$B" "$WORK/fake-cuda"
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 12Gi
bundle_annotate "$B" io.kubernetes.cri.sandbox-uid "$POD1"
bundle_jq "$B" '.hooks = ($s[0].containerEdits.hooks | group_by(.hookName)
    | map({key: .[0].hookName, value: map(del(.hookName))}) | from_entries)' --slurpfile s "$SPEC"
ok_if "  (the bundle carries the claim's createRuntime hook with its quota)" \
    jq -e '.hooks.createRuntime[0].env | any(startswith("VGPU_CLAIM_QUOTA="))' "$B/config.json" > /dev/null
"$SHIM" --root "$WORK/rt" run --bundle "$B" shim-claim > "$WORK/shim.out" 2>&1; rc=$?
ok_if "the claim's container under vgpu's runtime handler is refused: run it with the default handler" bash -c \
    "test $rc -ne 0 && grep -q \"ran under vgpu's runtime handler\" '$WORK/shim.out'"
ok_if "  ... and nothing is left: no state, no runc container" bash -c \
    "test -z \"\$(ls -A '$STATE/containers' 2>/dev/null | grep -vx .vgpu-state)\" && ! runc --root '$WORK/rt' state shim-claim > /dev/null 2>&1"

# 6. Unprepare reclaims: the spec and the checkpoint entry go, the device is no more.
"$KUBELET" unprepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/unprep.json"
ok_if "unprepare answers for the claim without error" jq -e --arg u "$UID1" '.claims[$u].error == ""' "$WORK/unprep.json" > /dev/null
ok_if "its CDI spec is gone" test ! -e "$SPEC"
ok_if "and its checkpoint entry" jq -e '.claims == {}' "$PLUGDIR/checkpoint.json" > /dev/null
pm "${RUN[@]}" --device "$DEV" localhost/vgpu-e2e:rootfs /bin/true > "$WORK/gone.out" 2>&1
ok_if "a container asking for the unprepared device is refused" bash -c "test $? -ne 0 && grep -q 'vgpu.io/claim' '$WORK/gone.out'"
"$KUBELET" unprepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/unprep2.json"
ok_if "unprepare again: no error" jq -e --arg u "$UID1" '.claims[$u].error == ""' "$WORK/unprep2.json" > /dev/null

# 7. A restart on other GPUs (a second card, 80 GiB): republished at the next generation with both.
stop_plugin
FAKE_CUDA_DEVICES=16Gi,80Gi start_plugin
ok_if "a restart on two GPUs republishes the slice: both GPUs, generation 6, still owned by the Node" \
    jq -e --arg u "$NODE_UID" '.spec.pool.generation == 6 and ([.spec.devices[] | [.name, .capacity.memory.value]] == [["gpu-0", "16Gi"], ["gpu-1", "80Gi"]])
        and .metadata.ownerReferences[0].uid == $u' "$API/slices/node-a-gpu.vgpu.io.json" > /dev/null
t_done
