#!/usr/bin/env bash
# The node's governance with real runc through the shim, on the fake driver's 16 GiB GPU.
# Admission: a container whose quota would make the quotas on its GPU add up past the GPU is refused with one
# line; a quota is released when its container is removed; containers created at once cannot both take the
# last room; the node may allow overcommit, or keep a reserve. No silent typos: a misspelt annotation or
# quota variable fails the container with one line. The node's policy for GPU containers without a quota.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
t_init governance
oci_setup

# quota_bundle LIMIT: a bundle of a container that sleeps, with the fake GPU and LIMIT on it.
quota_bundle() {
    new_bundle sleep 60
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT="$1"
}
gone() { plain delete -f "$1" >/dev/null 2>&1; }

echo "-- quotas on one GPU never add up past it"
quota_bundle 12G; c1=$ID
check "a 12 GiB quota on the 16 GiB GPU is admitted" create_quiet
quota_bundle 12G; c2=$ID
out=$(shim create --bundle "$B" "$ID" </dev/null 2>&1); rc=$?
check "a second 12 GiB quota on it is refused (exit $rc)" test "$rc" != 0
check_eq "  ... with one line" "$(printf '%s\n' "$out" | grep -c .)" 1
check_match "  ... naming the GPU, the sum and the figure" \
    'admission: GPU 0 \(GPU-[0-9a-f-]+\) would have 24\.0 GiB of quotas committed \(12\.0 GiB already, 12\.0 GiB asked for\), more than its 16\.0 GiB' "$out"
check_eq "  ... and nothing of it is left" "$(state_left)" "$c1"
check_eq "  ... no container" "$(plain list -q | grep -c "^$c2\$")" 0
quota_bundle 4G; c3=$ID
check "4 GiB more fits exactly (16 of 16 GiB)" create_quiet
gone "$c3"; gone "$c1"
check_eq "removing the containers releases their quotas" "$(state_left)" ""
quota_bundle 12G
check "  ... so 12 GiB is admitted again" create_quiet
gone "$ID"

echo "-- containers created at once: only as many as fit"
pids=(); ids=()
for i in 1 2 3 4; do
    quota_bundle 6G
    ids+=("$ID")
    shim create --bundle "$B" "$ID" </dev/null >"$WORK/race$i.log" 2>&1 &
    pids+=($!)
done
ok=0; refused=0
for i in 1 2 3 4; do
    if wait "${pids[i - 1]}"; then ok=$((ok + 1)); elif grep -q 'admission: GPU 0' "$WORK/race$i.log"; then refused=$((refused + 1)); fi
done
check_eq "four 6 GiB quotas created at once on 16 GiB: two admitted" "$ok" 2
check_eq "  ... and two refused by admission" "$refused" 2
check_eq "  ... two states" "$(state_left | wc -l)" 2
for id in "${ids[@]}"; do gone "$id"; done

echo "-- the node's policy: a reserve, or overcommit"
vgpu_config lower_runtime='"runc"' admission_reserve='"1Gi"'
quota_bundle 16G
out=$(shim create --bundle "$B" "$ID" </dev/null 2>&1)
check_match "with admission_reserve = 1Gi a 16 GiB quota is refused" \
    'more than the 15\.0 GiB it has for quotas \(16\.0 GiB less a reserve of 1\.0+ GiB\)' "$out"
quota_bundle 15G
check "  ... 15 GiB is admitted" create_quiet
gone "$ID"
vgpu_config lower_runtime='"runc"' allow_overcommit=true
quota_bundle 12G; a=$ID
check "with allow_overcommit = true: 12 GiB" create_quiet
quota_bundle 12G
check "  ... and 12 GiB more on the same GPU are admitted" create_quiet
gone "$ID"; gone "$a"
vgpu_config lower_runtime='"runc"' admission_reserve='"lots"'
quota_bundle 1G
out=$(shim create --bundle "$B" "$ID" </dev/null 2>&1)
check_match "a bad admission_reserve is one line naming the key" 'admission_reserve "lots"' "$out"

echo "-- no silent typos"
vgpu_config lower_runtime='"runc"'
# typo_case WHAT EXPECT: $B/$ID fails to create with one line matching EXPECT, leaving nothing.
typo_case() {
    local out rc=0
    out=$(shim create --bundle "$B" "$ID" </dev/null 2>&1) || rc=$?
    if [ "$rc" != 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" = 1 ] && grep -Eq -- "$2" <<<"$out"; then
        pass "$1: $out"
    else fail "$1 (rc=$rc, wanted one line /$2/)" "$out"; fi
    check_eq "  ... nothing left" "$(state_left)" ""
    check_eq "  ... no container" "$(plain list -q | grep -c "^$ID\$")" 0
}
for key in vgpu.io/memory_limit vgpu.io/memory-limits; do
    new_bundle true; bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0; bundle_annotate "$B" "$key" 4Gi
    typo_case "annotation $key" "annotation $key is not one vgpu defines \(did you mean vgpu.io/memory-limit\?\)"
done
new_bundle true; bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMT=4G
typo_case "env CUDA_DEVICE_MEMORY_LIMT" 'env CUDA_DEVICE_MEMORY_LIMT is not a variable vgpu knows: did you mean CUDA_DEVICE_MEMORY_LIMIT\?'
new_bundle true; bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MODULE_LOADING=LAZY
check "CUDA's own variables pass (CUDA_DEVICE_ORDER, CUDA_MODULE_LOADING)" create_quiet
gone "$ID"

echo "-- GPU containers without a quota: the node's default, or refused"
vgpu_config lower_runtime='"runc"' default_memory_limit='"2Gi"'
new_bundle rt_client device 0 info
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_eq "default_memory_limit = 2Gi: a GPU container without a quota sees 2 GiB" "$(field total "$out")" $((2 * GIB))
new_bundle sh -c 'grep -q libvgpu /etc/ld.so.preload 2>/dev/null && echo preloaded || echo no-preload'
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_match "  ... a container without a GPU is untouched" '^no-preload$' "$out"
vgpu_config lower_runtime='"runc"' require_memory_limit=true
new_bundle true; bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
typo_case "require_memory_limit = true: a GPU container without a quota is refused" \
    'gives the container its GPU 0 but it asks for no memory quota there, and this node requires one'
new_bundle sh -c 'echo fine'
check_match "  ... a container without a GPU still runs" '^fine$' "$(shim run --bundle "$B" "$ID" 2>&1)"

echo "-- a pod's quota annotation reaches its pause container and sidecars: they are left alone"
vgpu_config lower_runtime='"runc"'
for type in sandbox container; do
    new_bundle sh -c 'grep -q libvgpu /etc/ld.so.preload 2>/dev/null && echo preloaded || echo untouched'
    bundle_annotate "$B" io.kubernetes.cri.container-type "$type"
    bundle_annotate "$B" vgpu.io/memory-limit 4Gi
    check_match "a pod's $type container without a GPU runs untouched" '^untouched$' "$(shim run --bundle "$B" "$ID" 2>&1)"
done
new_bundle rt_client device 0 info
bundle_annotate "$B" io.kubernetes.cri.container-type container
bundle_annotate "$B" vgpu.io/memory-limit 4Gi
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
check_eq "  ... while the pod's GPU container gets the quota" "$(field total "$(shim run --bundle "$B" "$ID" 2>&1)")" $((4 * GIB))

echo "-- unified memory: annotation -> limits.json -> the library in the container"
vgpu_config lower_runtime='"runc"'
new_bundle rt_client device 0 '!alloc' 512Mi '!alloc' 1Gi ismanaged memcheck alloc 2Gi
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 1Gi
bundle_annotate "$B" vgpu.io/memory-spill 2Gi
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_match "spill (vgpu.io/memory-spill=2Gi): 1 GiB past the 1 GiB quota served as managed memory" \
    'op=ismanaged managed=1 devord=0 rc=0' "$out"
check_match "  ... usable" 'op=memcheck .*ok=1 rc=0' "$out"
check_match "  ... and past the budget out of memory" 'op=alloc size=2147483648 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
new_bundle rt_client device 0 '!alloc' 512Mi '!alloc' 1Gi ismanaged alloc 2Gi
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 1Gi
bundle_annotate "$B" vgpu.io/memory-spill 2Gi
add_hooksd_hooks
out=$(plain run --bundle "$B" "$ID" 2>&1)
check_match "the same through the hooks.d path (no shim): spilled past the quota" 'op=ismanaged managed=1 devord=0 rc=0' "$out"
check_match "  ... and refused past the budget" 'op=alloc size=2147483648 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_eq "  ... poststop removed the state" "$(state_left)" ""
quota_bundle 12G; c1=$ID
bundle_annotate "$B" vgpu.io/memory-mode oversubscribe
check "oversubscribe: a 12 GiB quota on the 16 GiB GPU" create_quiet
check_eq "  ... recorded in limits.json" "$(jq -c '.devices[0].memory' "$STATE/containers/$c1/limits.json")" \
    '{"mode":"oversubscribe","reserve":1610612736}'
quota_bundle 12G; c2=$ID
bundle_annotate "$B" vgpu.io/memory-mode oversubscribe
check "  ... a second 12 GiB oversubscribe quota is admitted (24 of 16 GiB)" create_quiet
quota_bundle 12G; c3=$ID
check_not "  ... but not a plain 12 GiB quota beside them (their pools, VMM and arrays are device memory)" create_quiet
quota_bundle 12G; c4=$ID
bundle_annotate "$B" vgpu.io/memory-spill 8Gi
check_not "  ... nor a 12 GiB spill quota" create_quiet
gone "$c1"; gone "$c2"; gone "$c3"; gone "$c4"
quota_bundle 1G
bundle_annotate "$B" vgpu.io/memory-mode spill
out=$(shim create --bundle "$B" "$ID" </dev/null 2>&1); rc=$?
check "spill mode without a budget: refused (exit $rc)" test "$rc" != 0
check_eq "  ... with one line" "$(printf '%s\n' "$out" | grep -c .)" 1
check_match "  ... naming it" 'vgpu.io/memory-mode=spill needs a spill budget' "$out"
check_eq "  ... and nothing is left" "$(state_left)" ""

echo "-- driver_memory_limit: the quota as the container cgroup's limit in the driver (the fake NVML records it)"
# memlimit_file PID: where the fake NVML records the limits of PID's cgroup on GPU 0 (the hook's choice of
# cgroup: the unified hierarchy's under the cgroup2 mount, unless it is the root; else the memory
# controller's under its mount). The hook before put the unified line under /sys/fs/cgroup whatever the
# mount: on a hybrid host (this one: cgroup2 at /sys/fs/cgroup/unified) it named a folder that is not there,
# and for a process at the unified root (0::/, where a hybrid host keeps most) the whole host's cgroup.
memlimit_file() {
    local cg v2
    cg=$(sed -n 's/^0:://p' "/proc/$1/cgroup")
    v2=$(awk '/ - cgroup2 / && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
    if [ -n "$v2" ] && [ -n "$cg" ] && [ "$cg" != / ]; then cg=$v2$cg
    else cg=$(awk '/ - cgroup / && $4 == "/" && $NF ~ /(^|,)memory(,|$)/ { print $5; exit }' /proc/self/mountinfo)$(sed -n 's/^[0-9]*:\([^:]*,\)\{0,1\}memory\(,[^:]*\)\{0,1\}://p' "/proc/$1/cgroup"); fi
    echo "/tmp/fake-cuda/memlimit-0-$(echo "$cg" | tr / _)"
}
vgpu_config lower_runtime='"runc"' driver_memory_limit=true
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
shim run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
pid=$(plain state "$ID" | jq -r .pid)
check "a container with driver_memory_limit = true runs (pid $pid)" test "$pid" -gt 0
f=$(memlimit_file "$pid")
check_eq "  ... its cgroup got the quota as soft and hard limit (nvmlDeviceSetMemoryLimits_v1)" "$(cat "$f" 2>&1)" "$GIB $GIB"
check "  ... and no hierarchy's root did (the whole host's cgroup: $f)" \
    bash -c '! ls /tmp/fake-cuda/memlimit-0-_sys_fs_cgroup_ /tmp/fake-cuda/memlimit-0-_sys_fs_cgroup_memory_ /tmp/fake-cuda/memlimit-0-_sys_fs_cgroup_unified_ 2>/dev/null | grep -q .'
gone "$ID"; rm -f "$f"
vgpu_config lower_runtime='"runc"'
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
shim run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
pid=$(plain state "$ID" | jq -r .pid)
check_not "  ... and without it, nothing is set (pid $pid)" test -e "$(memlimit_file "$pid")"
gone "$ID"

# Logs: log_level and log_file of the vgpu config; the shim's and the hook's lines go to the file, not to
# the engine's stdout or stderr.
vgpu_config lower_runtime='"runc"' log_level='"debug"' log_file="\"$WORK/vgpu.log\""
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
shim run -d --bundle "$B" "$ID" </dev/null >"$WORK/log.out" 2>"$WORK/log.err"
check "log_file: the shim logged the create at debug" grep -q "DEBUG create id=$ID lower=runc" "$WORK/vgpu.log"
check "log_file: with the version and commit" grep -q 'logging started program="vgpu-container-runtime" version="[^"]*(commit ' "$WORK/vgpu.log"
check "log_file: the hook logged too" grep -q 'program="vgpu-hook"' "$WORK/vgpu.log"
decision=$(grep "DEBUG quota decision id=$ID " "$WORK/vgpu.log")
check_match "log_file: the quota decision at debug: the GPU, its quota, no share" \
    'gpus="?0 GPU-[0-9a-f-]+ memory 1(\.0+)? GiB, no share' "$decision"
check_match "  ... the memory mode and the mounts (the preload list among them)" \
    'memory_mode="?plain"? mounts="?[^ ]*.*/etc/ld\.so\.preload' "$decision"
check "log_file: nothing on the engine's stdout and stderr" test ! -s "$WORK/log.out" -a ! -s "$WORK/log.err"
gone "$ID"
vgpu_config lower_runtime='"runc"' log_file='"relative.log"'
new_bundle sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
err=$(shim run -d --bundle "$B" "$ID" </dev/null 2>&1 >/dev/null)
check_match "log_file must be absolute: one clear line" "log_file must be an absolute path" "$err"
gone "$ID"
t_done
