#!/usr/bin/env bash
# The NVML-truth watchdog never hits the wrong process, and sees what it must (issue 25, items 1 and 2), with
# real runc containers on the fake driver and `vgpuctl monitor --kill`:
# - item 1: a stopped container (its state kept until `delete`, as CRI-O keeps exited containers) whose
#   recorded PID-namespace inode is now another container's (the kernel reuses namespace inodes; simulated
#   by writing that container's inode into the stopped one's limits.json): the other container's process,
#   far past the stopped one's quota, is not killed, nor attributed to it.
# - item 2: two GPU containers of one pod sharing a PID namespace (the second joins the first's through the
#   spec's linux.namespaces path), in cgroupfs-named cgroups (CRI-O's `crio-<id>`, Podman's `libpod-<id>`):
#   the one that bypasses the preload and holds more than its quota is attributed (by the cgroup recorded at
#   creation) and killed; the other is untouched.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
VGPUCTL=$T/release/vgpuctl
t_init watchdog
t_require "$VGPUCTL" "$(command -v curl)"
oci_setup
# The pods' cgroup parent, removed (in every hierarchy) when the suite ends.
CGPARENT=vgpu-e2e-watchdog-$$
on_exit "find /sys/fs/cgroup -depth -type d -name '$CGPARENT' -exec rmdir {} +"
cp -a "$ROOTFS" "$WORK/rootfs-rw"

passes() { scrape | grep -E '^vgpu_watchdog_passes_total ' | awk '{print $NF}'; }
# passes_at_least N: the watchdog has run N passes.
passes_at_least() { [ "$(passes)" -ge "$1" ] 2>/dev/null; }
stopped() { ! running "$1"; }
pid_of() { plain state "$1" | jq -r .pid; }
# bypass CMD...: the bundle $B runs CMD without the preload (the container renames /etc, so
# /etc/ld.so.preload is gone), on a writable copy of the rootfs.
bypass() {
    bundle_jq "$B" '.root.path = $r | .root.readonly = false | .process.args = ["sh", "-c", $c]' \
        --arg r "$WORK/rootfs-rw" --arg c "mv /etc /etc2 2>/dev/null; exec $*"
}

echo "-- item 1: a stopped container's recorded PID namespace, now another container's, names none of its processes"
new_bundle true
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=512Mi
X=$ID
shim run -d --bundle "$B" "$X" </dev/null >"$WORK/x.out" 2>&1
check "container X ran and stopped (its state kept until delete)" wait_for 10 stopped "$X"
check "  ... and its state is there" test -f "$STATE/containers/$X/limits.json"
# Y: not vgpu's (no quota, run by runc alone), 800 MiB on the GPU: past X's 512 MiB quota.
new_bundle rt_client device 0 '!alloc' 800Mi sleep 60
Y=$ID
plain run -d --bundle "$B" "$Y" </dev/null >"$WORK/y.out" 2>&1
check "container Y (no vgpu) runs" wait_for 10 running "$Y"
YNS=$(stat -Lc %i "/proc/$(pid_of "$Y")/ns/pid")
L=$STATE/containers/$X/limits.json
jq --argjson ns "$YNS" '.pid_ns = $ns' "$L" >"$L.new" && mv "$L.new" "$L"
check_eq "X's limits.json now records Y's PID namespace" "$(jq .pid_ns "$L")" "$YNS"
monitor_start killer --kill && pass "monitor with --kill starts" || fail "monitor with --kill starts"
check "the watchdog ran 3 passes" wait_for 20 passes_at_least 3
check "Y still runs" running "$Y"
check_eq "no process was killed" "$(grep -c 'killed pid' "$WORK/killer.log")" 0
check_eq "no finding for X" "$(grep -c "container $X" "$WORK/killer.log")" 0
check_eq "nothing of Y's is counted as X's" "$(series vgpu_container_gpu_memory_nvml_bytes "container_id=\"$X\"")" 0
plain kill "$Y" KILL >/dev/null 2>&1
plain delete -f "$Y" >/dev/null 2>&1
shim delete -f "$X" >/dev/null 2>&1
kill "$killer_PID"

# pod FIRST_NAMING SECOND_NAMING: container P (engine naming FIRST_NAMING, within its 1 GiB quota) and Q
# (naming SECOND_NAMING, joins P's PID namespace, bypasses the preload and holds 1.5 GiB on a 1 GiB quota),
# each in the cgroup <CGPARENT>/<naming>-<id> as CRI-O's and Podman's cgroupfs managers name them.
pod() {
    local first=$1 second=$2
    echo "-- item 2: a pod sharing one PID namespace, cgroupfs names $first-<id> and $second-<id>: the bypass is killed, the other untouched"
    new_bundle rt_client device 0 '!alloc' 300Mi sleep 60
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    bundle_jq "$B" '.linux.cgroupsPath = $c' --arg c "/$CGPARENT/$first-$ID"
    P=$ID
    shim run -d --bundle "$B" "$P" </dev/null >"$WORK/p.out" 2>&1
    check "container P runs" wait_for 10 running "$P"
    local ppid; ppid=$(pid_of "$P")
    new_bundle true
    bypass rt_client device 0 info '!alloc' 1536Mi sleep 60
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    bundle_jq "$B" '.linux.cgroupsPath = $c | .linux.namespaces |= map(if .type == "pid" then .path = $p else . end)' \
        --arg c "/$CGPARENT/$second-$ID" --arg p "/proc/$ppid/ns/pid"
    Q=$ID
    shim run -d --bundle "$B" "$Q" </dev/null >"$WORK/q.out" 2>&1
    check "container Q runs" wait_for 10 running "$Q"
    check_eq "  ... in P's PID namespace" "$(stat -Lc %i "/proc/$(pid_of "$Q")/ns/pid")" "$(stat -Lc %i "/proc/$ppid/ns/pid")"
    check_match "  ... in its own cgroup" "/$CGPARENT/$second-$Q\$" "$(grep '^0::' "/proc/$(pid_of "$Q")/cgroup")"
    check_eq "  ... recorded at creation in its limits.json, with its init's start time" \
        "$(jq -r '"\(.cgroup) \(.init_start_time > 0)"' "$STATE/containers/$Q/limits.json")" "/$CGPARENT/$second-$Q true"
    monitor_start pod --kill && pass "monitor with --kill starts" || fail "monitor with --kill starts"
    check "the watchdog logs the kill of Q's process" wait_for 15 grep -q "killed pid [0-9]* (SIGKILL) of container $Q" "$WORK/pod.log"
    check "Q's process is gone (the container stops)" wait_for 10 stopped "$Q"
    check "P still runs" running "$P"
    check_eq "only Q's process was killed" "$(grep -c 'killed pid' "$WORK/pod.log")" 1
    # (read until a collection after the kill has it: right after the kill, a scrape can fall between
    # collections and find no series for P, as it did once; and a loaded machine (two builds beside the suite) took more than 5 s to collect again once.)
    p_is_p() { [ "$(series vgpu_container_gpu_memory_nvml_bytes "container_id=\"$P\"")" = $((556 * MIB)) ]; }
    wait_for 20 p_is_p
    check_eq "P's processes are P's: NVML's truth for P = 556 MiB" \
        "$(series vgpu_container_gpu_memory_nvml_bytes "container_id=\"$P\"")" $((556 * MIB))
    kill "$pod_PID"
    shim delete -f "$Q" >/dev/null 2>&1
    shim delete -f "$P" >/dev/null 2>&1
}
pod libpod crio
pod crio libpod

check_eq "no state left" "$(state_left)" ""
t_done
