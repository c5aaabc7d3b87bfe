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

# The API server stand-in and a kubeconfig for it (no credentials: it is local and answers everyone).
cp "$DATA/claim-8gi-30.json" "$API/claims/team-a_trainer-gpu-x7k2p.json"
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

# 1. The ResourceSlice: published through the API, the recorded one- and two-GPU objects.
ok_if "the plugin starts and serves both sockets" start_plugin
ok_if "it published the node's ResourceSlice by server-side apply" \
    grep -q '^PATCH /apis/resource.k8s.io/v1/resourceslices/node-a-gpu.vgpu.io?.*fieldManager=vgpu-dra-plugin.* application/apply-patch+yaml' "$API/requests.log"
ok_if "a one-GPU node: the recorded slice" \
    jq -e --slurpfile want "$DATA/slice-one-gpu.json" '. == $want[0]' "$API/slices/node-a-gpu.vgpu.io.json" > /dev/null
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
ok_if "the claim's CDI spec: its GPU's node, the quota in the provisioning hook's env only" jq -e --arg h "$HOOK" \
    '.kind == "vgpu.io/claim" and .devices[0].containerEdits.deviceNodes[0].path == "/dev/nvidia0"
     and ([.containerEdits.hooks[] | [.hookName, .path, (.env | map(select(startswith("VGPU_CLAIM_QUOTA="))))]]
          == [["createRuntime", $h, ["VGPU_CLAIM_QUOTA=vgpu.io/memory-limit=8589934592,vgpu.io/compute-limit=30"]], ["poststop", $h, []]])' "$SPEC" > /dev/null
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

# 5. A real container from the spec prepare wrote, whose own annotations and env ask for more.
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
pm "${RUN[@]}" --device "$DEV" --annotation vgpu.io/memory-limit=12Gi --annotation vgpu.io/compute-limit=90 \
    -e CUDA_DEVICE_MEMORY_LIMIT=14g "${FAKE[@]}" localhost/vgpu-e2e:rootfs \
    /bin/sh -c 'cat /run/vgpu/limits.json; exec "$@"' - /bin/rt_client info '!alloc' 6Gi alloc 4Gi > "$WORK/run.out" 2>&1
ok_if "the container's limits are the claim's: 8 GiB and 30%, not its own 12Gi / 90 / 14g" \
    grep -qE '"memory_limit": *8589934592' "$WORK/run.out"
ok_if "its compute share is the claim's 30" grep -qE '"compute_limit": *30' "$WORK/run.out"
ok_if "inside, the GPU's total is the claimed 8 GiB" grep -q 'op=info .*total=8589934592' "$WORK/run.out"
ok_if "6 GiB fits, 4 GiB more fails with out-of-memory" bash -c \
    "grep -q 'op=alloc size=6442450944 .*rc=0' '$WORK/run.out' && grep -q 'op=alloc size=4294967296 .*err=CUDA_ERROR_OUT_OF_MEMORY' '$WORK/run.out'"
ok_if "poststop removed the container's state" test -z "$(state_left)"

# 6. Unprepare reclaims: the spec and the checkpoint entry go, the device is no more.
"$KUBELET" unprepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/unprep.json"
ok_if "unprepare answers for the claim without error" jq -e --arg u "$UID1" '.claims[$u].error == ""' "$WORK/unprep.json" > /dev/null
ok_if "its CDI spec is gone" test ! -e "$SPEC"
ok_if "and its checkpoint entry" jq -e '.claims == {}' "$PLUGDIR/checkpoint.json" > /dev/null
pm "${RUN[@]}" --device "$DEV" localhost/vgpu-e2e:rootfs /bin/true > "$WORK/gone.out" 2>&1
ok_if "a container asking for the unprepared device is refused" bash -c "test $? -ne 0 && grep -q 'vgpu.io/claim' '$WORK/gone.out'"
"$KUBELET" unprepare "$PLUGDIR/dra.sock" "${CLAIM1[@]}" > "$WORK/unprep2.json"
ok_if "unprepare again: no error" jq -e --arg u "$UID1" '.claims[$u].error == ""' "$WORK/unprep2.json" > /dev/null
t_done
