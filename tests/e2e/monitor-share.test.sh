#!/usr/bin/env bash
# The compute share's host wall (vgpuctl monitor) with real runc containers on the fake driver. The
# library's token bucket lives in the container's ledger, which the tenant can write, and a process that
# drops the preload is not throttled by it at all. The monitor measures each container's GPU time itself
# (NVML's per-process utilisation, the fake reporting each process's busy fraction), and a container that
# runs past its share + tolerance over the window is frozen (cgroup v2 `cgroup.freeze`) for the time it ran
# over, then thawed: a bypassing process at a 10% share is held near its share, the finding is logged once,
# the metrics say so; a container under the library at its share is never frozen; with the wall set to
# report only, the bypassing container is reported and never frozen. A monitor killed outright while a
# container is frozen leaves its record in the state root, and the next one thaws it at its start. Freezing
# cannot stop GPU work already queued: a container whose kernel runs on through its freezes is found
# (`busy_while_frozen`, logged once, counted) and left running by default; under `kill = true` its busy
# process is killed, its neighbour under the library untouched. A container whose state an older release
# wrote without its cgroup is found from its recorded init and frozen all the same. Floors (issue 42): a
# container with a request alone borrows an idle neighbour's floor freely, and once that neighbour runs
# (the GPU saturated, its use below its floor by NVML) the borrower is frozen down to its entitlement
# (`over_entitlement`) and the floor gets its time back; the floor's container is never frozen.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
VGPUCTL=$T/release/vgpuctl
t_init monitor-share
t_require "$VGPUCTL" "$(command -v curl)" "$CLIENTS_DIR/compute_client"
oci_setup
# A short window, so a run of a few windows shows the duty cycle.
printf '[monitor]\nshare_window_seconds = 5\n' >>"$VGPU_CONFIG"
CG2=$(findmnt -n -t cgroup2 -o TARGET | head -1)
[ -n "$CG2" ] || { echo "$SUITE: no cgroup v2 mount"; echo "0 passed, 1 failed"; exit 1; }
SECS=24

# cgroup_of ID: the container's cgroup v2 directory (its init process's `0::` line).
cgroup_of() {
    local pid; pid=$(plain state "$1" | jq .pid)
    echo "$CG2$(awk -F: '$1 == "0" { print $3 }' "/proc/$pid/cgroup")"
}
# watch_frozen DIR OUT: records every 50 ms whether DIR's cgroup.events says frozen 1, until DIR is gone.
watch_frozen() {
    while [ -e "$1/cgroup.events" ]; do grep -h '^frozen' "$1/cgroup.events" 2>/dev/null; sleep 0.05; done >"$2" &
    on_exit "kill $! 2>/dev/null"
}
# bypassing ID SECONDS [SHARE]: a bundle whose process renames /etc (no /etc/ld.so.preload) and runs the
# compute client on the fake libcuda directly, under a share (10%).
bypassing() {
    cp -a "$ROOTFS" "$WORK/rootfs-$1"
    new_bundle sh -c "mv /etc /etc2 && exec compute_client plain $2"
    bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-$1"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=${3:-10} FAKE_CUDA_KERNEL_US=2000
}
# share_of OUT: percent of its wall time the client's launches kept the fake GPU busy, from its launch count
# and the kernels' 2 ms (FAKE_CUDA_KERNEL_US above), not its own `unit_ms`: that one timed launch is its
# first, which also carries the library's set-up on the host (ledger, NVML), and read 2.4-3.3 ms on a loaded
# machine, putting a 30% neighbour at 40-55%.
share_of() {
    local l s
    l=$(field launched "$(cat "$1")"); s=$(field seconds "$(cat "$1")")
    awk -v l="${l:-0}" -v s="${s:-0}" 'BEGIN { if (s > 0) printf "%d", l * 2 / s / 10; else print 0 }'
}
# under_library SECONDS: a bundle whose process runs the compute client under the library at a 30% share.
under_library() {
    new_bundle compute_client plain "$1"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=30 FAKE_CUDA_KERNEL_US=2000
}

echo "-- a process that bypasses the library at a 10% share is frozen for its excess (the wall acts by default)"
monitor_start mon && pass "monitor starts (share wall: freeze)" || fail "monitor starts"
check_match "  ... and says so" 'share wall freeze, window 5 s, tolerance 5 points' "$(head -1 "$WORK/mon.log")"
bypassing a $SECS
A=$ID
shim run --bundle "$B" "$A" >"$WORK/a.out" 2>&1 &
PA=$!
# Beside it, a container under the library at a 30% share: held by its own bucket, never by the wall.
under_library $SECS
H=$ID
shim run --bundle "$B" "$H" >"$WORK/h.out" 2>&1 &
PH=$!
check "both containers run" wait_for 10 running "$A"
check "  ... (H too)" wait_for 10 running "$H"
CGA=$(cgroup_of "$A") CGH=$(cgroup_of "$H")
watch_frozen "$CGA" "$WORK/a.frozen"
watch_frozen "$CGH" "$WORK/h.frozen"
LA="container_id=\"$A\",vdevice_index=\"0\"" LH="container_id=\"$H\",vdevice_index=\"0\""
check "the monitor logs one line: A ran past its share (NVML), freezing its cgroup" \
    wait_for 15 grep -q "over its compute share: container $A GPU 0 .*: its processes used .* of GPU time in the last .* (NVML), share 10% + 5 points: freezing $CGA for " "$WORK/mon.log"
check "A's cgroup is frozen (cgroup.events: frozen 1)" wait_for 10 grep -q 'frozen 1' "$WORK/a.frozen"
check_eq "vgpu_container_frozen for A is 1 while it is" "$(for _ in $(seq 50); do v=$(series vgpu_container_frozen "$LA"); [ "$v" = 1 ] && { echo 1; break; }; sleep 0.2; done)" 1
check "  ... and thawed again (duty cycling: frozen 0 after frozen 1)" \
    wait_for 15 sh -c "grep -A1000 'frozen 1' '$WORK/a.frozen' | grep -q 'frozen 0'"
ex=$(series vgpu_compute_share_excess_seconds_total "$LA")
check "vgpu_compute_share_excess_seconds_total for A counts its excess (${ex} s)" awk -v e="${ex:-0}" 'BEGIN { exit !(e > 0.2) }'
used=$(series vgpu_compute_share_used_ratio "$LA")
check "vgpu_compute_share_used_ratio for A: its use over the window, held near the share (${used})" \
    awk -v u="${used:-1}" 'BEGIN { exit !(u < 0.4) }'
wait "$PA"; rc=$?
check_eq "A's client ran to its end (exit 0)" "$rc" 0
sa=$(share_of "$WORK/a.out")
check "A's achieved share is held near its 10% (+ tolerance) by the freezes: ${sa}% (bare: ~100%)" \
    test "${sa:-100}" -ge 3 -a "${sa:-100}" -le 35
wait "$PH"
sh=$(share_of "$WORK/h.out")
check "H, under the library at 30%, got its share: ${sh}%" test "${sh:-0}" -ge 20 -a "${sh:-0}" -le 40
check_not "  ... and its cgroup was never frozen" grep -q 'frozen 1' "$WORK/h.frozen"
check_eq "  ... and no finding names it" "$(grep -c "container $H" "$WORK/mon.log")" 0
check_eq "the finding is logged once for A's run, not at every freeze" "$(grep -c "over its compute share: container $A" "$WORK/mon.log")" 1
check "A's freezes and thaws are counted" \
    awk -v n="$(scrape | awk '/^vgpu_compute_share_freezes_total /{print $2}')" 'BEGIN { exit !(n >= 2) }'
check_match "vgpu_watchdog_events_total counts one over_share finding" 'vgpu_watchdog_events_total\{finding="over_share"\} 1' "$(scrape)"
check_eq "no freeze failed" "$(scrape | awk '/^vgpu_compute_share_freeze_failures_total /{print $2}')" 0
# The monitor stops (SIGTERM) while a container is frozen: it thaws it first. At a 1% share the first
# freeze lasts a whole window (5 s), so a thaw within a second of the stop is the monitor's.
bypassing s 10 1
X=$ID
shim run --bundle "$B" "$X" >"$WORK/x.out" 2>&1 &
PX=$!
wait_for 10 running "$X"
CGX=$(cgroup_of "$X")
check "a second bypassing container is frozen" wait_for 15 grep -q 'frozen 1' "$CGX/cgroup.events"
kill "$mon_PID"
sleep 1
check "  ... and thawed when the monitor stops (SIGTERM)" grep -q 'frozen 0' "$CGX/cgroup.events"
wait "$PX"

echo "-- the monitor killed outright (SIGKILL, the OOM killer) while a container is frozen: the next one thaws it"
# Issue 44: the share wall kept what it froze in memory only, and a killed monitor left the container
# frozen for good. Now each freeze is recorded in the state root and a starting monitor thaws what is
# recorded, whatever its own mode: the next monitor here only reports, so any thaw is the record's.
monitor_start mk && pass "monitor starts (share wall: freeze)" || fail "monitor starts (to be killed)"
bypassing y 10 1
Y=$ID
shim run --bundle "$B" "$Y" >"$WORK/y.out" 2>&1 &
PY=$!
wait_for 10 running "$Y"
CGY=$(cgroup_of "$Y")
check "a bypassing container is frozen" wait_for 15 grep -q 'frozen 1' "$CGY/cgroup.events"
check "  ... and its freeze is recorded in the state root" \
    wait_for 2 jq -e --arg id "$Y" --arg cg "$CGY" 'any(.[]; .container == $id and .cgroup == $cg)' "$STATE/share-wall/frozen.json"
{ kill -KILL "$mk_PID"; wait "$mk_PID"; } 2>/dev/null
sleep 2
check "  ... the monitor is SIGKILLed: the container stays frozen (nothing thawed it)" grep -q 'frozen 1' "$CGY/cgroup.events"
monitor_start rep --share-wall report && pass "monitor with --share-wall report starts" || fail "monitor with --share-wall report starts"
check "  ... the next monitor thaws it at its start" wait_for 3 grep -q 'frozen 0' "$CGY/cgroup.events"
check "  ... and says so in one line" \
    grep -q "share wall: thawed container $Y ($CGY), left frozen by a previous run" "$WORK/rep.log"
check_not "  ... the record is cleared" test -e "$STATE/share-wall/frozen.json"
wait "$PY"

echo "-- report only: the bypassing container is reported, never frozen"
bypassing r 8
R=$ID
shim run --bundle "$B" "$R" >"$WORK/r.out" 2>&1 &
PR=$!
wait_for 10 running "$R"
watch_frozen "$(cgroup_of "$R")" "$WORK/r.frozen"
check "the finding is logged, reporting only" \
    wait_for 15 grep -q "over its compute share: container $R GPU 0 .*share 10% + 5 points: reporting only" "$WORK/rep.log"
check_eq "  ... vgpu_container_frozen for it is 0" "$(series vgpu_container_frozen "container_id=\"$R\"")" 0
wait "$PR"
sr=$(share_of "$WORK/r.out")
check "  ... and nothing held it: ${sr}%" test "${sr:-0}" -ge 70
check_not "  ... its cgroup was never frozen" grep -q 'frozen 1' "$WORK/r.frozen"

echo "-- a kernel that runs on while its container is frozen: found (busy_while_frozen); killed only under kill = true"
# Freezing stops the container's CPU threads, not GPU work already queued: a process that queues seconds of
# work and waits keeps the GPU busy through every freeze. The fake's timeline is wall-clock based, so a
# frozen process's kernel still runs (and its NVML figure says so). `short 1` times one kernel, then queues
# one more and synchronises: 2 x 8 s of work. The shell stays a few seconds after the client (it holds no
# GPU work), so the container's use can be read after a kill.
kill "$rep_PID" 2>/dev/null
# runaway ID: a bypassing container (no preload) at a 10% share whose client queues 16 s of work.
runaway() {
    cp -a "$ROOTFS" "$WORK/rootfs-$1"
    new_bundle sh -c 'mv /etc /etc2 && compute_client short 1 1; echo client_rc=$?; exec sleep 4'
    bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-$1"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=10 FAKE_CUDA_KERNEL_US=8000000
}
# used_while_frozen LABELS: the container's use over the window, read while it is frozen.
used_while_frozen() {
    for _ in $(seq 50); do
        local t; t=$(scrape)
        if printf '%s\n' "$t" | grep -qE "^vgpu_container_frozen\{[^}]*$1[^}]*\} 1$"; then
            printf '%s\n' "$t" | grep -E "^vgpu_compute_share_used_ratio\{[^}]*$1" | awk '{print $NF}'
            return
        fi
        sleep 0.2
    done
}
# idle LABELS: NVML's SM utilisation of the container's processes reads 0 (the series is there).
idle() { [ "$(series vgpu_container_sm_utilization_ratio "$1")" = 0.0 ]; }
monitor_start run && pass "monitor starts (share wall: freeze, no kill)" || fail "monitor starts (no kill)"
runaway k
K=$ID
shim run --bundle "$B" "$K" >"$WORK/k.out" 2>&1 &
PK=$!
check "the runaway container runs" wait_for 10 running "$K"
CGK=$(cgroup_of "$K")
watch_frozen "$CGK" "$WORK/k.frozen"
LK="container_id=\"$K\",vdevice_index=\"0\""
check "the wall freezes it (over_share)" \
    wait_for 15 grep -q "over its compute share: container $K GPU 0 .*: freezing $CGK for " "$WORK/run.log"
check "  ... its cgroup is frozen" wait_for 10 grep -q 'frozen 1' "$WORK/k.frozen"
# A window (5 s) after the first freeze, frozen nearly throughout, its use over the window is still its
# kernel's: near the whole GPU, far above 10% + 5 points (a bypass of short kernels is held under 40%).
sleep 5
used=$(used_while_frozen "$LK")
check "  ... yet its use over the window, read while it is frozen, stays far above 15%: ${used}" \
    awk -v u="${used:-0}" 'BEGIN { exit !(u >= 0.8) }'
check "the monitor logs that its work runs on while it is frozen, reporting only (no kill policy)" \
    wait_for 10 grep -q "busy while frozen: container $K GPU 0 .*: its processes used .* of GPU time in the last .* s while it was frozen .* s of it (NVML).*: reporting only" "$WORK/run.log"
check_match "vgpu_watchdog_events_total counts one busy_while_frozen finding" \
    'vgpu_watchdog_events_total\{finding="busy_while_frozen"\} 1' "$(scrape)"
check_match "  ... open in vgpu_watchdog_findings" \
    "vgpu_watchdog_findings\{[^}]*container_id=\"$K\"[^}]*finding=\"busy_while_frozen\"[^}]*\} 1" "$(scrape)"
fb=$(series vgpu_compute_share_frozen_busy_seconds_total "$LK")
check "vgpu_compute_share_frozen_busy_seconds_total counts its GPU time while frozen (${fb} s)" \
    awk -v e="${fb:-0}" 'BEGIN { exit !(e > 1) }'
wait "$PK"
check_eq "  ... not killed: its client ran its work to the end (exit 0)" "$(field client_rc "$(cat "$WORK/k.out")")" 0
check_eq "  ... the finding is logged once for its run" "$(grep -c "busy while frozen: container $K" "$WORK/run.log")" 1
check_eq "  ... and nothing was killed" "$(grep -c 'killed pid' "$WORK/run.log")" 0
kill "$run_PID"

echo "-- ... with kill = true: its busy process is killed, its neighbour under the library untouched"
monitor_start kil --kill && pass "monitor with --kill starts" || fail "monitor with --kill starts"
runaway q
Q=$ID
shim run --bundle "$B" "$Q" >"$WORK/q.out" 2>&1 &
PQ=$!
under_library 14
NB=$ID
shim run --bundle "$B" "$NB" >"$WORK/n.out" 2>&1 &
PN=$!
check "the runaway container and its neighbour run" wait_for 10 running "$Q"
check "  ... (the neighbour too)" wait_for 10 running "$NB"
watch_frozen "$(cgroup_of "$NB")" "$WORK/n.frozen"
LQ="container_id=\"$Q\",vdevice_index=\"0\""
check "the wall freezes it (over_share)" \
    wait_for 15 grep -q "over its compute share: container $Q GPU 0 .*: freezing " "$WORK/kil.log"
# Bound: within two windows (10 s) of the first freeze; it comes a window or less after it (8 s of work left).
check "its busy process is killed within two windows of the freeze (SIGKILL, pidfd-checked)" \
    wait_for 10 grep -q "killed pid [0-9]* (SIGKILL) of container $Q on GPU GPU-[^ ]*: its work ran on while the container was frozen" "$WORK/kil.log"
check "  ... after the finding, which says so" \
    grep -q "busy while frozen: container $Q GPU 0 .*: killing its busy processes under the kill policy" "$WORK/kil.log"
# Its shell lives on (it holds no GPU work) while the neighbour runs: NVML has samples, its share is 0.0.
check "  ... and the GPU goes idle for it: NVML's SM utilisation of its processes reads 0" wait_for 5 idle "$LQ"
check "  ... its client died of SIGKILL (137) before its work was done" \
    wait_for 10 grep -q '^client_rc=137$' "$WORK/q.out"
# The scrape shows the count from the collection after the kill's: waited for, not read once.
kills_counted() { scrape | grep -q "^vgpu_watchdog_kills_total $1\$"; }
check "vgpu_watchdog_kills_total counts the kill" wait_for 10 kills_counted 1
wait "$PQ"
wait "$PN"
sn=$(share_of "$WORK/n.out")
check "the neighbour under the library at 30% ran to its end and got its share: ${sn}%" \
    test "${sn:-0}" -ge 20 -a "${sn:-0}" -le 40
check_not "  ... its cgroup was never frozen" grep -q 'frozen 1' "$WORK/n.frozen"
check_eq "  ... and no finding names it (over its share, busy while frozen, a kill)" \
    "$(grep -cE "(over its compute share|busy while frozen): container $NB |of container $NB on" "$WORK/kil.log")" 0
check_eq "one kill in all" "$(grep -c 'killed pid' "$WORK/kil.log")" 1

echo "-- older state: a container whose state lacks its cgroup (an older release's) is found and frozen"
# Issue 44 item 7: the wall freezes the cgroup a container's limits.json records, and state an older release
# wrote before the cgroup was recorded was never frozen (0 of 100 samples). The monitor now finds the
# cgroup from the recorded init (its start time checked before and after) and records it.
{ kill "$kil_PID"; wait "$kil_PID"; } 2>/dev/null
bypassing o 14 1
O=$ID
shim run --bundle "$B" "$O" >"$WORK/o.out" 2>&1 &
PO=$!
check "a bypassing container runs" wait_for 10 running "$O"
CGO=$(cgroup_of "$O")
# The state as the older release left it: every key but the cgroup (written in place, as the file is mounted).
jq -c 'del(.cgroup)' "$STATE/containers/$O/limits.json" >"$WORK/o.limits" && cat "$WORK/o.limits" >"$STATE/containers/$O/limits.json"
check_not "  ... its state records no cgroup (as an older release wrote it)" jq -e '.cgroup' "$STATE/containers/$O/limits.json"
monitor_start old && pass "monitor starts (share wall: freeze)" || fail "monitor starts (older state)"
check "  ... which records the container's cgroup, found from its init" \
    wait_for 10 jq -e --arg cg "${CGO#"$CG2"}" '.cgroup == $cg' "$STATE/containers/$O/limits.json"
check "  ... and the wall freezes it" wait_for 20 grep -q 'frozen 1' "$CGO/cgroup.events"
{ kill "$old_PID"; wait "$old_PID"; } 2>/dev/null
check "  ... thawed when the monitor stops" wait_for 5 grep -q 'frozen 0' "$CGO/cgroup.events"
wait "$PO"

echo "-- floors (issue 42): a borrower of an idle floor runs free, and is held to its entitlement once the floor is busy"
# Two bypassing containers (no preload: the wall alone decides) on a time-sliced fake GPU
# (FAKE_CUDA_TIMESLICE_US: both running, each gets half): R asks a request of 30, F one of 70, each with no
# limit (the whole GPU). F's process idles 8 s, then runs 16 s; R runs throughout.
monitor_start flo && pass "monitor starts (share wall: freeze)" || fail "monitor starts (floors)"
# floor_bundle NAME REQUEST CMD: a bypassing container at a request alone on the sliced GPU.
floor_bundle() {
    cp -a "$ROOTFS" "$WORK/rootfs-$1"
    new_bundle sh -c "mv /etc /etc2 && $3"
    bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-$1"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_REQUEST=$2 FAKE_CUDA_KERNEL_US=2000 FAKE_CUDA_TIMESLICE_US=5000
}
floor_bundle fl 70 "sleep 8; exec compute_client plain 16"
F=$ID
shim run --bundle "$B" "$F" >"$WORK/fl.out" 2>&1 &
PF=$!
floor_bundle bo 30 "exec compute_client plain 28"
BO=$ID
shim run --bundle "$B" "$BO" >"$WORK/bo.out" 2>&1 &
PB=$!
check "both run (requests 70 + 30: admitted)" wait_for 10 running "$F"
check "  ... (the borrower too)" wait_for 10 running "$BO"
CGF=$(cgroup_of "$F") CGB=$(cgroup_of "$BO")
watch_frozen "$CGF" "$WORK/fl.frozen"
watch_frozen "$CGB" "$WORK/bo.frozen"
LF="container_id=\"$F\",vdevice_index=\"0\"" LB="container_id=\"$BO\",vdevice_index=\"0\""
sleep 5
check_eq "the borrower's request and limit are exported (0.3, 1.0: a request alone)" \
    "$(series vgpu_compute_request_ratio "$LB") $(series vgpu_compute_limit_ratio "$LB")" "0.3 1.0"
br=$(series vgpu_compute_share_borrowed_ratio "$LB")
check "while F idles, the borrower uses its time: past its request over the window (${br})" \
    awk -v b="${br:-0}" 'BEGIN { exit !(b >= 0.4) }'
check_not "  ... and is not frozen" grep -q 'frozen 1' "$WORK/bo.frozen"
check "once F runs, the borrower is frozen: over its entitlement while F's floor is starved" \
    wait_for 15 grep -q "over its compute entitlement while a floor is starved: container $BO GPU 0 .*entitled to 30% + 5 points (request 30%, limit 100%) while container $F got [0-9]*% of its floor of 70% of the saturated GPU: freezing $CGB for " "$WORK/flo.log"
check "  ... its cgroup is frozen" wait_for 10 grep -q 'frozen 1' "$WORK/bo.frozen"
wait "$PF"
sf=$(share_of "$WORK/fl.out")
check "F got its floor back, less the tolerance: ${sf}% of the GPU over its run (sliced, unheld: ~50%)" test "${sf:-0}" -ge 55
check_not "  ... F was never frozen" grep -q 'frozen 1' "$WORK/fl.frozen"
check_eq "  ... and no finding names F" "$(grep -cE "over its compute (share|entitlement)[^:]*: container $F " "$WORK/flo.log")" 0
check_eq "the finding is logged once" "$(grep -c "over its compute entitlement while a floor is starved: container $BO" "$WORK/flo.log")" 1
check_match "vgpu_watchdog_events_total counts one over_entitlement finding" 'vgpu_watchdog_events_total\{finding="over_entitlement"\} 1' "$(scrape)"
bt=$(series vgpu_compute_share_borrowed_seconds_total "$LB")
check "vgpu_compute_share_borrowed_seconds_total counts the borrower's time past its request (${bt} s)" \
    awk -v b="${bt:-0}" 'BEGIN { exit !(b >= 2) }'
wait "$PB"
{ kill "$flo_PID"; wait "$flo_PID"; } 2>/dev/null

echo "-- bad input: one clear line"
out=$(VGPU_CONFIG=/dev/null "$VGPUCTL" monitor --share-wall stop --once 2>&1)
check_match "an unknown share wall mode is refused" '^vgpuctl: error: .*share.wall.*' "$out"
check_eq "  ... in one line" "$(printf '%s\n' "$out" | wc -l)" 1
printf '[monitor]\nshare_tolerance = 150\n' >"$WORK/bad.toml"
out=$(VGPU_CONFIG=$WORK/bad.toml "$VGPUCTL" monitor --once 2>&1)
check_match "a tolerance past 100 points is refused, naming the key" '^vgpuctl: error: .*share_tolerance.*' "$out"

check_eq "no state left" "$(state_left)" ""
t_done
