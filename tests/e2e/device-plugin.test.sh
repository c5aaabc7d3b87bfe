#!/usr/bin/env bash
# vgpu-device-plugin driven by a kubelet stand-in (tests/dp-kubelet) over the real device plugin API v1beta1:
# the stand-in serves the registration socket, the plugin registers vgpu.io/memory and vgpu.io/compute,
# the stand-in reads their device lists and admits pods as the kubelet's device manager does
# (GetPreferredAllocation among the free IDs, then Allocate). On the fake NVML's two 16 GiB GPUs: each
# container's memory is kept on one GPU (best fit); a pod the scheduler would place (the node's sum fits)
# but no single GPU can hold is refused at Allocate with one line; Allocate's answer (env, annotations,
# device nodes), applied to a real runc container through vgpu's shim as containerd applies it, gives the
# container exactly the quota and share counted. What no cluster here can show: a real kubelet, scheduler
# and containerd (docs/engines/kubernetes.md says what was verified where).
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
t_init device-plugin
PLUGIN=$T/release/vgpu-device-plugin
KUBELET=$T/release/vgpu-dp-kubelet
t_require "$PLUGIN" "$KUBELET"
oci_setup
export FAKE_CUDA_DEVICES=2 FAKE_CUDA_STATE_DIR=$FAKESTATE
GPU0=GPU-fa4ec0de-0000-4000-8000-000000000000
GPU1=GPU-fa4ec0de-0000-4000-8000-000000000001
DP=$WORK/device-plugins DEV=$WORK/dev
mkdir -p "$DP" "$DEV"
# The node's device nodes, as the plugin's pod sees the host's /dev (major 195: NVIDIA's).
mknod "$DEV/nvidia0" c 195 0 && mknod "$DEV/nvidia1" c 195 1 && mknod "$DEV/nvidiactl" c 195 255

echo "-- bad input: one line naming it"
out=$("$PLUGIN" --memory-unit 1Mi --print-devices 2>&1); rc=$?
check "--memory-unit 1Mi is refused (exit $rc)" test "$rc" != 0
check_match "  ... naming the floor" "64.0 MiB" "$out"
out=$("$PLUGIN" --memory-unit 100000000 --print-devices 2>&1); rc=$?
check_match "--memory-unit of no whole MiB is refused" "not a whole number of MiB" "$out"
out=$("$PLUGIN" --print-devices 2>&1)
check_match "two 16 GiB GPUs: 32 memory devices of 1 GiB" '"vgpu.io/memory","devices":32' "$out"
check_match "  ... and 200 compute devices" '"vgpu.io/compute","devices":200' "$out"
vgpu_config lower_runtime='"runc"' admission_reserve='"1Gi"'
out=$("$PLUGIN" --print-devices 2>&1)
check_match "admission_reserve 1Gi is kept out: 30 memory devices" '"vgpu.io/memory","devices":30' "$out"
vgpu_config lower_runtime='"runc"'

echo "-- registration, device lists and allocations through the real gRPC API"
# Pods in order (one container each): a takes 8 GiB and 30% of one GPU; b's 12 GiB fit only the other;
# c asks 10 GiB: the node has 12 free (8 + 4), so the scheduler would place it, but no GPU has 10: refused
# at Allocate; d asks more than the node has (the kubelet's own OutOf); a removed, e's 10 GiB fit.
"$KUBELET" --dir "$DP" --restart -- a:vgpu.io/memory=8,vgpu.io/compute=30 b:vgpu.io/memory=12 \
    c:vgpu.io/memory=10 d:vgpu.io/memory=40 e:vgpu.io/compute=120 -a f:vgpu.io/memory=10 > "$WORK/kubelet.out" 2> "$WORK/kubelet.err" & KPID=$!
on_exit "kill $KPID"
wait_for 10 test -S "$DP/kubelet.sock" || { echo "device-plugin: the stand-in kubelet did not start"; cat "$WORK/kubelet.err"; }
"$PLUGIN" --device-plugin-dir "$DP" --dev-root "$DEV" 2> "$WORK/plugin.log" & PLUGPID=$!
on_exit "kill $PLUGPID"
wait "$KPID"; krc=$?
check "the stand-in kubelet ran every step (exit $krc)" test "$krc" = 0
[ "$krc" = 0 ] || cat "$WORK/kubelet.err"
line() { grep -F "\"pod\":\"$1\"" "$WORK/kubelet.out" || echo null; }
check "both resources registered with v1beta1 at their sockets, a preferred allocation, no pre-start" jq -se '
    .[0].registered | map([.resource, .endpoint, .version, .preferred, .pre_start]) | sort ==
    [["vgpu.io/compute", "vgpu-compute.sock", "v1beta1", true, false], ["vgpu.io/memory", "vgpu-memory.sock", "v1beta1", true, false]]' "$WORK/kubelet.out"
check "ListAndWatch: 32 memory and 200 compute devices, all healthy" \
    jq -se '.[0].devices == {"vgpu.io/compute": 200, "vgpu.io/memory": 32}' "$WORK/kubelet.out"
check_match "the plugin says plainly what it cannot promise on several GPUs" "several GPUs: a container's memory is kept on one GPU or refused at Allocate" "$(cat "$WORK/plugin.log")"
A=$(line a); B1=$(line b)
check "pod a: 8 memory IDs and 30 compute IDs, each on one GPU" jq -e '
    (.ids["vgpu.io/memory"] | length == 8 and (map(split("::")[0]) | unique | length == 1))
    and (.ids["vgpu.io/compute"] | length == 30 and (map(split("::")[0]) | unique | length == 1))' <<< "$A"
GA=$(jq -r '.ids["vgpu.io/memory"][0] | split("::")[0]' <<< "$A")
check "  ... its quota: vgpu.io/memory-limit 8 GiB, vgpu.io/compute-limit 30, HAMi's variables, its GPU" jq -e --arg g "$GA" '
    .annotations == {"vgpu.io/memory-limit": "8589934592", "vgpu.io/compute-limit": "30"}
    and .envs == {"CUDA_DEVICE_MEMORY_LIMIT": "8192m", "CUDA_DEVICE_SM_LIMIT": "30", "NVIDIA_VISIBLE_DEVICES": $g}' <<< "$A"
MA=$( [ "$GA" = "$GPU0" ] && echo 0 || echo 1 )
check "  ... its device nodes: its GPU's and nvidiactl" jq -e --arg d "$DEV" --arg m "$MA" '
    .devices == [{"container_path": "/dev/nvidia\($m)", "host_path": "\($d)/nvidia\($m)", "permissions": "rw"},
                 {"container_path": "/dev/nvidiactl", "host_path": "\($d)/nvidiactl", "permissions": "rw"}]' <<< "$A"
GB=$(jq -r '.ids["vgpu.io/memory"][0] | split("::")[0]' <<< "$B1")
check "pod b: 12 GiB on the other GPU, the only one with room" jq -e --arg g "$GB" '
    .ok and (.ids["vgpu.io/memory"] | length == 12 and all(startswith($g + "::")))
    and .annotations["vgpu.io/memory-limit"] == "12884901888"' <<< "$B1"
check "  ... (a different GPU from a's)" test "$GA" != "$GB"
check "pod c: 10 GiB with 8 + 4 free is refused at Allocate, the pod failing with the plugin's line" jq -e '
    (.ok | not) and (.error | test("^UnexpectedAdmissionError: Allocate failed due to vgpu.io/memory: the 10.0 GiB given to one container are spread over GPUs \\(GPU 0: [0-9.]+ GiB, GPU 1: [0-9.]+ GiB\\): no GPU of this node had 10.0 GiB free"))' <<< "$(line c)"
check_match "  ... and the plugin logged the refusal" "refused: vgpu.io/memory: the 10.0 GiB" "$(cat "$WORK/plugin.log")"
check "pod d: more than the node has is the kubelet's own refusal (its devices were released: 12 free)" jq -e '
    .error == "OutOfvgpu.io/memory: 40 asked, 12 free"' <<< "$(line d)"
check "pod e: 120% of compute cannot be on one GPU: refused" jq -e '(.ok | not) and (.error | test("vgpu.io/compute: the 120% given"))' <<< "$(line e)"
check "pod f, after a is removed: 10 GiB on a's GPU" jq -e --arg g "$GA" '.ok and (.ids["vgpu.io/memory"] | all(startswith($g + "::")))' <<< "$(line f)"
check "a restarted kubelet (its sockets removed): the plugin serves and registers both again" \
    jq -se '.[-1] | .registered_again and (.registered_again | sort == ["vgpu.io/compute", "vgpu.io/memory"]) and .devices == {"vgpu.io/compute": 200, "vgpu.io/memory": 32}' "$WORK/kubelet.out"
kill "$PLUGPID"; wait "$PLUGPID" 2>/dev/null
check "SIGTERM: the plugin stops and removes its sockets" test ! -e "$DP/vgpu-memory.sock" -a ! -e "$DP/vgpu-compute.sock"

echo "-- Allocate's answer in a real container: the quota and share counted, enforced"
# respond_bundle JSON CMD...: a bundle running CMD with the answer applied as the kubelet and containerd
# apply it: envs into process.env, annotations into the spec (containerd: the handler's
# container_annotations, vgpu.io/*), device specs into linux.devices with the host node's numbers.
# CUDA_VISIBLE_DEVICES stands in for NVIDIA's runtime, which gives the container only NVIDIA_VISIBLE_DEVICES.
respond_bundle() {
    local json=$1 k v d host maj min; shift
    new_bundle "$@"
    bundle_env "$B" FAKE_CUDA_DEVICES=2 CUDA_VISIBLE_DEVICES="$(jq -r '.envs.NVIDIA_VISIBLE_DEVICES' <<< "$json")"
    while IFS=$'\t' read -r k v; do bundle_env "$B" "$k=$v"; done < <(jq -r '.envs | to_entries[] | [.key, .value] | @tsv' <<< "$json")
    while IFS=$'\t' read -r k v; do bundle_annotate "$B" "$k" "$v"; done < <(jq -r '.annotations | to_entries[] | [.key, .value] | @tsv' <<< "$json")
    while IFS=$'\t' read -r d host; do
        maj=$((16#$(stat -c %t "$host"))); min=$((16#$(stat -c %T "$host")))
        bundle_jq "$B" '.linux.devices += [{"path": $p, "type": "c", "major": $M, "minor": $m, "fileMode": 438, "uid": 0, "gid": 0}]' \
            --arg p "$d" --argjson M "$maj" --argjson m "$min"
    done < <(jq -r '.devices[] | [.container_path, .host_path] | @tsv' <<< "$json")
}
respond_bundle "$A" sh -c 'cat /run/vgpu/limits.json; exec rt_client info "!alloc" 6Gi alloc 4Gi'
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_match "pod a's container: limits.json has its GPU" "\"uuid\": *\"$GA\"" "$out"
check_match "  ... with the 8 GiB counted" '"memory_limit": *8589934592' "$out"
check_match "  ... and the 30% counted" '"compute_limit": *30' "$out"
check_eq "  ... inside, the GPU's total is the counted 8 GiB" "$(field total "$out")" $((8 * GIB))
check_match "  ... 6 GiB fits, 4 GiB more fails with out-of-memory" 'op=alloc size=4294967296 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_eq "  ... and poststop removed its state" "$(state_left)" ""
# Pods a and b at once, as the node runs them: each held to its own quota on its own GPU, admission agreeing
# with the plugin's count (b's 12 GiB beside a's 8 GiB on different GPUs; both fit).
respond_bundle "$A" sleep 60; IDA=$ID
check "pod a's container created (8 GiB on $GA)" create_quiet
respond_bundle "$B1" sleep 60; IDB=$ID
check "pod b's container created beside it (12 GiB on $GB)" create_quiet
check_eq "  ... limits: each on its GPU" "$(jq -r '[.devices[] | "\(.uuid)=\(.memory_limit)"] | join(" ")' "$STATE/containers/$IDB/limits.json")" "$GB=$((12 * GIB))"
plain delete -f "$IDA" > /dev/null 2>&1; plain delete -f "$IDB" > /dev/null 2>&1

echo "-- the chart's optional DaemonSet (rendered by a real Helm, tests/helm/template.py; validated offline)"
RENDER=(python3 "$REPO/tests/helm/template.py") CHART=$REPO/packaging/helm/vgpu
"${RENDER[@]}" "$CHART" > "$WORK/default.yaml"
check_not "off by default: no device plugin in the default render" grep -q 'vgpu-device-plugin' "$WORK/default.yaml"
"${RENDER[@]}" "$CHART" --set devicePlugin.enabled=true --set devicePlugin.memoryUnit=512Mi > "$WORK/dp.yaml"
check "devicePlugin.enabled=true renders and validates (kubernetes-validate --strict)" kubernetes-validate --strict --quiet "$WORK/dp.yaml"
check "  ... a DaemonSet running the plugin with the unit, the kubelet's folder and the host's /dev, no API token" python3 -c '
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-device-plugin")]
pod = ds[0]["spec"]["template"]["spec"]; c = pod["containers"][0]
assert c["command"] == ["/usr/local/bin/vgpu-device-plugin"], c["command"]
assert c["args"] == ["--device-plugin-dir=/var/lib/kubelet/device-plugins", "--memory-unit=512Mi", "--dev-root=/host/dev"], c["args"]
assert pod["automountServiceAccountToken"] is False
assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}["dev"] == "/dev"
' "$WORK/dp.yaml"
t_done
