#!/usr/bin/env bash
# Admission that cannot be gamed (issue 25 items 7, 8, 9), with real runc, the shim, the fake NVML with two
# 16 GiB GPUs: the node's memory policy applied to each GPU; the GPUs a container is given (device nodes,
# CDI, the device plugin's volume-mounts list) deciding where its quota goes, never an env that disagrees;
# a shim killed mid-create leaving no reservation behind. Item 6 (oversubscribe quotas counted where a
# plain quota is at stake) is in governance.test.sh and admission's unit tests.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
t_init admission
oci_setup
export FAKE_CUDA_DEVICES=2
GPU0=GPU-fa4ec0de-0000-4000-8000-000000000000
GPU1=GPU-fa4ec0de-0000-4000-8000-000000000001

gone() { plain delete -f "$1" >/dev/null 2>&1; }
# node_bundle MINOR...: a bundle whose linux.devices holds /dev/nvidiactl and /dev/nvidia<MINOR> (as an
# engine's CDI edits or `--device` put them), with a 1 GiB quota from the env.
node_bundle() {
    local m
    new_bundle sleep 60
    bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT=1G
    for m in ctl "$@"; do
        bundle_jq "$B" '.linux.devices += [{"path": ("/dev/nvidia" + $m), "type": "c", "major": 195,
            "minor": (if $m == "ctl" then 255 else ($m | tonumber) end), "fileMode": 438, "uid": 0, "gid": 0}]' --arg m "$m"
    done
}
# refused WHAT EXPECT: creating $B/$ID through the shim fails with one line matching EXPECT, nothing left.
refused() {
    local out rc=0
    # Through a file: a create that wrongly succeeds keeps its stdio open, and a pipe would wait on it.
    shim create --bundle "$B" "$ID" </dev/null >"$WORK/refused.log" 2>&1 || rc=$?
    out=$(cat "$WORK/refused.log")
    [ "$rc" = 0 ] && gone "$ID"
    check "$1: refused (exit $rc)" test "$rc" != 0
    check_eq "  ... with one line" "$(printf '%s\n' "$out" | grep -c .)" 1
    check_match "  ... saying why" "$2" "$out"
    check_eq "  ... and nothing is left" "$(state_left)" ""
}
# quota_on: "UUID=BYTES ..." of $ID's limits.json.
quota_on() { jq -r '[.devices[] | "\(.uuid)=\(.memory_limit)"] | join(" ")' "$STATE/containers/$ID/limits.json"; }

echo "-- item 7: the node's memory policy applies to each GPU, a GPU with a compute share alone too"
vgpu_config lower_runtime='"runc"' require_memory_limit=true
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0,1 CUDA_DEVICE_MEMORY_LIMIT_0=64Mi CUDA_DEVICE_SM_LIMIT_1=99
refused "require_memory_limit: GPU 1 with a compute share alone" \
    'gives the container its GPU 1 but it asks for no memory quota there, and this node requires one'
vgpu_config lower_runtime='"runc"' default_memory_limit='"4Gi"'
check "default_memory_limit: the same container is created" create_quiet
check_eq "  ... with the default quota on GPU 1 beside its share" "$(quota_on)" "$GPU0=$((64 * MIB)) $GPU1=$((4 * GIB))"
gone "$ID"
vgpu_config lower_runtime='"runc"'

echo "-- item 8: the devices a container is given decide where its quota goes"
node_bundle 1
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
refused "granted GPU 1 (its device node), the env names GPU 0" \
    'env NVIDIA_VISIBLE_DEVICES=0 names GPU 0 but the container is given GPU 1 \(devices /dev/nvidia1\)'
node_bundle 1
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=all
check "an image's NVIDIA_VISIBLE_DEVICES=all beside the device of GPU 1 is created" create_quiet
check_eq "  ... with the quota on GPU 1 alone" "$(quota_on)" "$GPU1=$GIB"
check_eq "  ... and runc gave it that device node" "$(plain exec "$ID" ls /dev/nvidia1 2>&1)" /dev/nvidia1
gone "$ID"
node_bundle 1
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=void
check "NVIDIA's CDI specs' NVIDIA_VISIBLE_DEVICES=void beside the device is created" create_quiet
check_eq "  ... with the quota on GPU 1" "$(quota_on)" "$GPU1=$GIB"
gone "$ID"
new_bundle sleep 60
bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT=1G
bundle_annotate "$B" cdi.k8s.io/vgpu nvidia.com/gpu=1
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
refused "a CDI device GPU 1 (a lower runtime applies it), the env names GPU 0" \
    'env NVIDIA_VISIBLE_DEVICES=0 names GPU 0 but the container is given GPU 1 \(CDI devices nvidia.com/gpu=1\)'
new_bundle sleep 60
bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT=1G NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices
bundle_bind "$B" /dev/null /var/run/nvidia-container-devices/$GPU1 ro
check "the device plugin's volume-mounts list (one mount for GPU 1) is created" create_quiet
check_eq "  ... with the quota on GPU 1" "$(quota_on)" "$GPU1=$GIB"
gone "$ID"
new_bundle sleep 60
bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT=1G NVIDIA_VISIBLE_DEVICES=1
check "no device in the spec: the env decides (the legacy NVIDIA hook injects what it names)" create_quiet
check_eq "  ... the quota on GPU 1" "$(quota_on)" "$GPU1=$GIB"
gone "$ID"

echo "-- item 9: a shim killed mid-create leaves no reservation"
# A lower runtime that stalls in create (as runc does on a slow image or hook) so the shim can be killed
# while its state is provisioned and no owner is recorded yet.
cat > "$WORK/slow-runc" <<SLOW
#!/bin/sh
case " \$* " in *" create "*) echo \$\$ > "$WORK/slow.pid"; sleep 60;; esac
exec runc "\$@"
SLOW
chmod +x "$WORK/slow-runc"
# kill_mid_create: creates $ID (12 GiB on GPU 0) through the shim over slow-runc, SIGKILLs the shim once
# the lower runtime runs, then the stalled lower runtime.
kill_mid_create() {
    vgpu_config lower_runtime="\"$WORK/slow-runc\""
    new_bundle sleep 60
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=12G
    rm -f "$WORK/slow.pid"
    # exec: $! is the shim itself, not a subshell around it.
    (exec "$SHIM" --root "$WORK/rt" create --bundle "$B" "$ID" </dev/null >/dev/null 2>&1) &
    local spid=$!
    wait_for 20 test -s "$WORK/slow.pid" || fail "the lower runtime started"
    kill -9 "$spid"; wait "$spid" 2>/dev/null
    kill -9 "$(cat "$WORK/slow.pid")" 2>/dev/null
    vgpu_config lower_runtime='"runc"'
}
kill_mid_create
killed=$ID
check_eq "the killed create's state is there (12 GiB of GPU 0)" "$(state_left)" "$killed"
shim delete -f "$killed" >/dev/null 2>&1
check_eq "  ... and a delete -f through the shim, as an engine sends, removes it" "$(state_left)" ""
kill_mid_create
killed=$ID
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=12G
check "another 12 GiB container on GPU 0 is admitted at once (the killed create holds no room)" create_quiet
check_eq "  ... and the killed create's state was collected" "$(state_left)" "$ID"
gone "$ID"
vgpu_config lower_runtime='"runc"' gc_pending_grace_seconds=300
kill_mid_create
echo '{"id":"another-container","bundle":"/nonexistent"}' | "$HOOK" poststop
check_eq "the next hook's garbage collection removes a killed create's state within the grace" "$(state_left)" ""
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=12G
create_quiet
check_eq "a created container's state (its owner recorded) stays" "$(state_left)" "$ID"
shim delete -f "$ID" >/dev/null 2>&1
check_eq "  ... until delete -f, whose poststop removes it" "$(state_left)" ""

t_done
