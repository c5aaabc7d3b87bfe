#!/usr/bin/env bash
# vgpuctl monitor with real runc containers on the fake driver: the metrics of a container with a quota
# (HAMi's series with its Kubernetes names, usage by kind, NVML's truth), and the NVML-truth watchdog: a
# container process that bypasses the preload (the container renames /etc, so /etc/ld.so.preload is gone)
# and allocates past its quota is reported (metric + one log line) and, under the kill policy, killed; a
# container whose tenant zeroed its ledger is reported; a container within its quota is never touched.
# Memory no process's NVML figure shows (issue 48: an export kept after its release, managed memory): the
# GPU's unattributed remainder as a series, a log line once it lasted three collections and a line of
# `vgpuctl status`, with the container that likely holds it when its ledger charges past its NVML figure.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
VGPUCTL=$T/release/vgpuctl
t_init monitor
t_require "$VGPUCTL" "$(command -v curl)"
oci_setup

stopped() { ! running "$1"; }

echo "-- a container within its quota: HAMi's series with its Kubernetes names, usage by kind, NVML's truth"
new_bundle rt_client device 0 '!alloc' 300Mi alloc 1Gi sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
bundle_annotate "$B" io.kubernetes.pod.name trainer-0
bundle_annotate "$B" io.kubernetes.pod.namespace ml
bundle_annotate "$B" io.kubernetes.container.name main
A=$ID
shim run --bundle "$B" "$A" >"$WORK/a.out" 2>&1 &
PA=$!
check "container A allocated 300 MiB" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/a.out"
check "  ... and was refused 1 GiB more" wait_for 20 grep -q 'op=alloc .*rc=2' "$WORK/a.out"
monitor_start mon && pass "monitor (report only) starts" || fail "monitor (report only) starts"
LA="namespace=\"ml\",pod=\"trainer-0\",container=\"main\",container_id=\"$A\",vdevice_index=\"0\""
# The context is charged as measured (256 MiB on the fake GPU), then 300 MiB of data.
check_eq "vgpu_memory_used_bytes = 556 MiB" "$(series vgpu_memory_used_bytes "$LA")" $((556 * MIB))
check_eq "vgpu_memory_limit_bytes = 1 GiB" "$(series vgpu_memory_limit_bytes "$LA")" "$GIB"
HA='zone="vGPU",namespace="ml",pod="trainer-0",container="main",vdevice_index="0",device_uuid="GPU-'
check_eq "hami_vgpu_memory_used_bytes (HAMi's labels) = 556 MiB" "$(series hami_vgpu_memory_used_bytes "$HA")" $((556 * MIB))
check_eq "hami_vgpu_memory_limit_bytes (HAMi's labels) = 1 GiB" "$(series hami_vgpu_memory_limit_bytes "$HA")" "$GIB"
check_eq "usage by kind: data 300 MiB" "$(series vgpu_memory_used_by_kind_bytes "$LA.*kind=\"data\"")" $((300 * MIB))
check_eq "usage by kind: context 256 MiB" "$(series vgpu_memory_used_by_kind_bytes "$LA.*kind=\"context\"")" $((256 * MIB))
check_eq "NVML's truth for A (host PID attributed by PID namespace) = 556 MiB" \
    "$(series vgpu_container_gpu_memory_nvml_bytes "$LA")" $((556 * MIB))
check_eq "vgpu_container_sm_utilization_ratio for A (idle fake GPU)" "$(series vgpu_container_sm_utilization_ratio "$LA")" 0.0
check_eq "hami_container_device_utilization_ratio for A (HAMi's labels)" "$(series hami_container_device_utilization_ratio "$HA")" 0.0
check_eq "nothing untracked in A" "$(series vgpu_container_gpu_memory_untracked_bytes "$LA")" 0
check_eq "vgpu_memory_refusals_total counts A's refused allocation" "$(series vgpu_memory_refusals_total "$LA")" 1
check_match "the scrape says how old its reading is" '^vgpu_monitor_reading_age_seconds [0-9.]+$' "$(scrape)"
check_match "host GPU series with its type" \
    "hami_host_gpu_memory_used_bytes\\{zone=\"vGPU\",node=\"$(hostname)\",device_index=\"0\",device_uuid=\"GPU-fa4ec0de-0000-4000-8000-000000000000\",device_type=\"NVIDIA-NVIDIA H100 \\(fake, 16 GiB\\)\"\\} [1-9]" \
    "$(scrape)"
check_match "host GPU utilisation" 'hami_host_gpu_utilization_ratio\{.*device_index="0".*\} 0.0' "$(scrape)"
check_eq "the limits file records the names" "$(jq -c .kubernetes "$STATE/containers/$A/limits.json")" \
    '{"namespace":"ml","pod":"trainer-0","container":"main"}'

echo "-- a process that bypasses the preload and allocates past its quota: reported, not killed without the policy"
cp -a "$ROOTFS" "$WORK/rootfs-rw"
new_bundle sh -c 'mv /etc /etc2 && exec rt_client device 0 info "!alloc" 800Mi sleep 60'
bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-rw"
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=512Mi
BY=$ID
shim run --bundle "$B" "$BY" >"$WORK/b.out" 2>&1 &
PB=$!
check "container B's process allocated 800 MiB past its 512 MiB quota" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/b.out"
check_eq "  ... it saw the whole GPU (no preload)" "$(field total "$(cat "$WORK/b.out")")" $((16 * GIB))
LB="container_id=\"$BY\",vdevice_index=\"0\""
check "the watchdog logs one line naming container B, its process and the figures" \
    wait_for 10 grep -q "over quota: container $BY GPU 0 .*hold 1.03 GiB (NVML), quota 512 MiB, ledger 0 B: pid [0-9]* 1.03 GiB without a ledger slot" "$WORK/mon.log"
check_eq "vgpu_watchdog_findings{finding=over_quota} for B" "$(series vgpu_watchdog_findings "$LB.*finding=\"over_quota\"")" 1
check_eq "NVML's truth for B = 1056 MiB, all untracked" "$(series vgpu_container_gpu_memory_untracked_bytes "$LB")" $((1056 * MIB))
check_match "vgpu_watchdog_events_total counts it" 'vgpu_watchdog_events_total\{finding="over_quota"\} 1' "$(scrape)"
sleep 2
check_eq "the finding is logged once, not at every pass" "$(grep -c "over quota: container $BY" "$WORK/mon.log")" 1
check "B still runs (no kill policy)" running "$BY"
out=$(scrape)
check_match "  ... the scrape lists B's finding" "vgpu_watchdog_findings\\{.*container_id=\"$BY\"" "$out"
check_eq "  ... and none for A" "$(printf '%s\n' "$out" | grep vgpu_watchdog_findings | grep -c "container_id=\"$A\"")" 0

echo "-- a tenant that zeroes its ledger's total is reported"
new_bundle sh -c 'rt_client device 0 "!alloc" 300Mi sleep 60 & sleep 2; for f in /run/vgpu/ledgers/*.ledger; do dd if=/dev/zero of=$f bs=16 seek=16 count=1 conv=notrunc 2>/dev/null; done; wait'
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
C=$ID
shim run --bundle "$B" "$C" >"$WORK/c.out" 2>&1 &
PC=$!
LC="container_id=\"$C\",vdevice_index=\"0\""
check "the watchdog logs C's ledger below the truth" \
    wait_for 15 grep -q "ledger below the truth: container $C GPU 0 .*total is 0 B, its own processes hold 556 MiB" "$WORK/mon.log"
check "  ... and its total disagreeing with its slots" \
    wait_for 5 grep -q "ledger inconsistent: container $C GPU 0 .*total is 0 B, its slots add up to 556 MiB" "$WORK/mon.log"
check_eq "vgpu_watchdog_findings{finding=ledger_below_truth} for C" \
    "$(series vgpu_watchdog_findings "$LC.*finding=\"ledger_below_truth\"")" 1

echo "-- the kill policy: B's bypassing process is killed, A and C (within their quotas) are not"
kill "$mon_PID"
monitor_start killer --kill && pass "monitor with --kill starts" || fail "monitor with --kill starts"
check "the watchdog logs the kill of B's process" wait_for 10 grep -q "killed pid [0-9]* (SIGKILL) of container $BY" "$WORK/killer.log"
check "B's process is gone (the container exits)" wait_for 10 stopped "$BY"
wait "$PB"; rc=$?
check_eq "  ... killed by SIGKILL (exit status 137)" "$rc" 137
check_match "vgpu_watchdog_kills_total 1" '^vgpu_watchdog_kills_total 1$' "$(scrape)"
check "A still runs" running "$A"
check "C still runs" running "$C"
check_eq "A still holds its 556 MiB (NVML)" "$(series vgpu_container_gpu_memory_nvml_bytes "$LA")" $((556 * MIB))
check_eq "only B was killed" "$(grep -c 'killed pid' "$WORK/killer.log")" 1

echo "-- memory no process's NVML figure shows: the GPU's unattributed remainder, logged once it lasts"
kill "$killer_PID"
# The fake NVML's per-process figures leave managed memory out, as a GPU's do (tests/fake-driver.md).
FAKE_NVML_PROCESS_OMITS_MANAGED=1 monitor_start unat && pass "monitor starts" || fail "monitor starts"
U0=GPU-fa4ec0de-0000-4000-8000-000000000000
HG="device_index=\"0\",device_uuid=\"$U0\""
unattributed() { series vgpu_host_gpu_memory_unattributed_bytes "$HG"; }
unattributed_is() { [ "$(unattributed)" = "$1" ]; }
# backs_at_least N: the monitor has logged GPU 0's remainder back within the threshold N times.
backs_at_least() { [ "$(grep -c "unattributed memory: GPU 0 ($U0): back to 0 B, within 256 MiB" "$WORK/unat.log")" -ge "$1" ]; }
# gpu_status: vgpuctl status's line of GPU 0 in its unattributed memory table (the last line naming it).
gpu_status() { FAKE_CUDA_STATE_DIR=$FAKESTATE FAKE_NVML_PROCESS_OMITS_MANAGED=1 "$VGPUCTL" status | grep "^$U0 " | tail -1; }
check_eq "vgpu_host_gpu_memory_unattributed_bytes: 0 while every byte is a process's (A and C, 556 MiB each)" "$(unattributed)" 0
check_eq "  ... beside the processes' figures" "$(series vgpu_host_gpu_memory_processes_bytes "$HG")" $((1112 * MIB))
check_eq "  ... and the driver's reserve (none on the fake)" "$(series vgpu_host_gpu_memory_reserved_bytes "$HG")" 0
# An export kept after its release: 512 MiB the device uses and no process lists.
echo $((512 * MIB)) >"$FAKESTATE/unlisted-0"
check "vgpu_host_gpu_memory_unattributed_bytes = 512 MiB" wait_for 5 unattributed_is $((512 * MIB))
LINE="unattributed memory: GPU 0 \($U0\): 512 MiB in use that no process's NVML figure shows, past 256 MiB for 3 collections \(used 1.59 GiB, driver reserve 0 B, processes 1.09 GiB\); no container's ledger charges more than NVML shows for its processes: the holder is not known"
check "the monitor logs it once it lasted three collections, no ledger explaining it" wait_for 10 grep -qE "$LINE" "$WORK/unat.log"
check_match "vgpuctl status: GPU 0's 512 MiB past the threshold, holder unknown" \
    " 1.59 GiB +0 B +1.09 GiB +512 MiB \(past the threshold\) +unknown$" "$(gpu_status)"
check_match "vgpu_watchdog_events_total{finding=unattributed_memory} counts it" \
    '^vgpu_watchdog_events_total\{finding="unattributed_memory"\} 1$' "$(scrape)"
sleep 2
check_eq "  ... logged once, not at every collection" "$(grep -c 'unattributed memory: GPU 0 .*in use that no process' "$WORK/unat.log")" 1
rm -f "$FAKESTATE/unlisted-0"
check "the descriptor closed: back to 0, logged" wait_for 5 backs_at_least 1
check_eq "  ... vgpu_host_gpu_memory_unattributed_bytes 0" "$(unattributed)" 0

echo "-- the likely holder: a container whose ledger charges past what NVML shows for its processes"
new_bundle rt_client device 0 '!managed' 512Mi sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
D=$ID
shim run --bundle "$B" "$D" >"$WORK/d.out" 2>&1 &
PD=$!
check "container D allocated 512 MiB of managed memory" wait_for 20 grep -q 'op=managed .*rc=0' "$WORK/d.out"
LD="container_id=\"$D\",vdevice_index=\"0\""
d_charged_is() { [ "$(series vgpu_memory_used_bytes "$LD")" = "$1" ]; }
check "D's ledger charges its context and the managed memory (768 MiB)" wait_for 5 d_charged_is $((768 * MIB))
check_eq "  ... NVML's figure of its process leaves the managed memory out (256 MiB)" "$(series vgpu_container_gpu_memory_nvml_bytes "$LD")" $((256 * MIB))
check "vgpu_host_gpu_memory_unattributed_bytes = 512 MiB" wait_for 5 unattributed_is $((512 * MIB))
LINE="unattributed memory: GPU 0 \($U0\): 512 MiB in use .*; likely held by container $D, whose ledger charges 512 MiB more than NVML shows for its processes \(768 MiB against 256 MiB; its ledger: managed 512 MiB\)"
check "the line names D as the likely holder" wait_for 10 grep -qE "$LINE" "$WORK/unat.log"
check_eq "vgpu_container_gpu_memory_unattributed_likely_bytes for D = 512 MiB" \
    "$(series vgpu_container_gpu_memory_unattributed_likely_bytes "$LD")" $((512 * MIB))
out=$(scrape)
check_eq "  ... and for no one else" "$(printf '%s\n' "$out" | grep -c '^vgpu_container_gpu_memory_unattributed_likely_bytes{')" 1
check_match "vgpuctl status names D as the likely holder" \
    " 512 MiB \(past the threshold\) +container ${D:0:12} \(-\): 512 MiB charged past NVML$" "$(gpu_status)"
check_eq "vgpuctl status --json: D, 768 MiB charged, 256 MiB in NVML" \
    "$(FAKE_CUDA_STATE_DIR=$FAKESTATE FAKE_NVML_PROCESS_OMITS_MANAGED=1 "$VGPUCTL" status --json | jq -c '.unattributed[0].likely_holders')" \
    "[{\"container_id\":\"$D\",\"charged\":$((768 * MIB)),\"nvml\":$((256 * MIB)),\"likely\":$((512 * MIB))}]"
plain kill "$D" KILL >/dev/null 2>&1
wait "$PD"
check "D gone: back to 0, logged" wait_for 10 backs_at_least 2

echo "-- bad input: one clear line"
out=$(VGPU_CONFIG=/dev/null "$VGPUCTL" monitor --tolerance 5GB --once 2>&1)
check_match "a decimal tolerance is refused" '^vgpuctl: error: .*tolerance.*' "$out"
check_eq "  ... in one line" "$(printf '%s\n' "$out" | wc -l)" 1
for bad in "--unattributed-threshold 256MB" "--unattributed-threshold lots" "--unattributed-scans 0"; do
    out=$(VGPU_CONFIG=/dev/null "$VGPUCTL" monitor $bad --once 2>&1)
    check_match "$bad is refused" "^vgpuctl: error: \[monitor\] unattributed_(threshold|scans)" "$out"
    check_eq "  ... in one line" "$(printf '%s\n' "$out" | wc -l)" 1
done

for id in "$A" "$C"; do plain kill "$id" KILL >/dev/null 2>&1; done
wait "$PA" "$PC"
check_eq "no state left" "$(state_left)" ""
t_done
