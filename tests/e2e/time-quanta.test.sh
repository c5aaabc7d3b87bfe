#!/usr/bin/env bash
# Time quanta on oversubscribed GPUs (issue 29): `vgpuctl monitor`'s arbiter and the library's turn gate,
# with real runc containers on the fake GPU (one 16 GiB device) and its paging cost: a process's kernels
# take FAKE_CUDA_PAGING_FACTOR (4) times longer while the managed memory of the processes active on the
# device passes it. (a) Two oversubscribed jobs of 10 GiB each finish sooner taking turns than paging
# side by side; (b) two of 6 GiB run together at full speed, no turns; (c) a holder that bypasses the
# library (so never yields) is handed past and frozen (revoked) within quantum + grace + NVML's
# readings, the other runs; (d) a container that forges Hold in its own ledger while another holds is
# frozen out of turn; (e) a monitor killed mid-turn hangs nobody (the library's 3 s bound), a clean stop
# unmanages at once, and a restarted monitor thaws what the killed one left frozen; (f) a container frozen
# out of turn whose queued kernel runs on while frozen is found (busy_while_frozen), reported only by
# default, killed under kill = true; (g) a container that runs no CUDA and forges its ledger (a 12 GiB
# total, moving `launches` and waiting words) gets its honest neighbour neither turns nor freezes (issue 44:
# the arbiter decides from NVML, not from the words). Status and metrics show holder, queue, grants,
# revocations. The monitor's fake NVML lists a process's resident managed pages
# (FAKE_NVML_PROCESS_MANAGED_PAGES, tests/fake-driver.md): the arbiter measures memory by NVML.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
VGPUCTL=$T/release/vgpuctl
UUID0=GPU-fa4ec0de-0000-4000-8000-000000000000
TURN="python3 $(cd "$(dirname "$0")" && pwd)/lib/turn.py"
t_init time-quanta
t_require "$VGPUCTL" "$(command -v curl)" "$CLIENTS_DIR/rt_client" "$CLIENTS_DIR/compute_client"
oci_setup
export FAKE_NVML_PROCESS_MANAGED_PAGES=1
CG2=$(findmnt -n -t cgroup2 -o TARGET | head -1)
[ -n "$CG2" ] || { echo "$SUITE: no cgroup v2 mount"; echo "0 passed, 1 failed"; exit 1; }
# Short turns so a run of a few seconds shows several; the share wall off (no share is set anyway).
cat >>"$VGPU_CONFIG" <<'EOF'
[monitor]
share_wall = "off"
[monitor.turns]
quantum_seconds = 2
idle_seconds = 0.5
grace_seconds = 1
EOF

# job GIB KERNELS [PRE]: a bundle whose client allocates GIB GiB (managed: oversubscribe) and runs
# KERNELS kernels of 1 ms, 50 at a time (each batch synchronised), under a 12 GiB oversubscribe quota;
# PRE: a shell command run first in the container (sh -c).
job() {
    local gib=$1 k=$2 pre=${3:-} ops=() i
    for ((i = 0; i < k / 50; i++)); do ops+=("'!launch' 50"); done
    new_bundle sh -c "$pre rt_client device 0 '!alloc' ${gib}g '!module' ${ops[*]}"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 FAKE_CUDA_KERNEL_US=1000 FAKE_CUDA_PAGING_FACTOR=4
    bundle_annotate "$B" vgpu.io/memory-limit 12Gi
    bundle_annotate "$B" vgpu.io/memory-mode oversubscribe
}
# start NAME: runs the last bundle in the background (output $WORK/NAME.out, pid NAME_pid, id NAME_id).
start() { shim run --bundle "$B" "$ID" >"$WORK/$1.out" 2>&1 </dev/null & eval "$1_pid=$! $1_id=$ID"; }
# ms_since T0: milliseconds since T0 (date +%s%N).
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
# loaded NAME: waits until the job loaded its module (its kernels begin).
loaded() { wait_for 20 grep -q '^op=module' "$WORK/$1.out"; }
# pair GIB KERNELS: two such jobs started together (the second once the first loaded its module); sets
# PAIR_MS, the milliseconds until both ended.
pair() {
    local t0; t0=$(date +%s%N)
    job "$1" "$2"; start p1; loaded p1
    job "$1" "$2"; start p2
    wait "$p1_pid" "$p2_pid"
    PAIR_MS=$(ms_since "$t0")
}
cgroup_of() {
    local pid; pid=$(plain state "$1" | jq .pid)
    echo "$CG2$(awk -F: '$1 == "0" { print $3 }' "/proc/$pid/cgroup")"
}
ok_job() { grep -q 'op=launch .*rc=0' "$WORK/$1.out"; }
status_json() { "$VGPUCTL" status --json --state-root "$STATE"; }

echo "-- (a) two oversubscribed jobs whose memory passes the device: sooner taking turns than paging together"
pair 10 3000; bare=$PAIR_MS
check "  without the arbiter: both jobs ran (paging side by side, ${bare} ms)" sh -c "grep -q 'rc=0' '$WORK/p1.out' && grep -q 'rc=0' '$WORK/p2.out'"
monitor_start mon && pass "monitor starts with the arbiter" || fail "monitor starts with the arbiter"
check_match "  ... and says so" 'turns on, quantum 2 s, idle 0.5 s, grace 1 s' "$(head -1 "$WORK/mon.log")"
t0=$(date +%s%N)
job 10 3000; start p1; loaded p1
job 10 3000; start p2
check "the arbiter finds the GPU contended and says so" \
    wait_for 15 grep -q "GPU $UUID0: contended: taking turns (2 want it" "$WORK/mon.log"
check_match "vgpuctl status: the GPU takes turns, one holds it, the other waits" \
    "^$UUID0 +taking turns +[^ ]{12} \(for [0-9]+ s\) +[^ ]{12} " "$("$VGPUCTL" status --state-root "$STATE")"
j=$(status_json)
check "  ... --json names the holder and the queue" test "$(echo "$j" | jq -r '.turns[0].holder // empty')" != "" -a "$(echo "$j" | jq '.turns[0].queue | length')" = 1
check_eq "vgpu_turn_contended is 1" "$(series vgpu_turn_contended "device_uuid=\"$UUID0\"")" 1
check "vgpu_turn_holder is 1 for one of them" sh -c "curl -sf '$URL' | grep -E '^vgpu_turn_holder\{' | grep -q ' 1$'"
# The waits are per container: read while both run (a scrape after the jobs ended read 0 s twice on a
# loaded machine, the containers' series gone).
waited_s() { scrape | awk '/^vgpu_turn_wait_seconds_total\{/ { s += $NF } END { print s + 0 }'; }
waited_1s() { awk -v w="$(waited_s)" 'BEGIN { exit !(w >= 1) }'; }
wait_for 30 waited_1s
w=$(waited_s)
check "vgpu_turn_wait_seconds_total sums the waits while they run (${w} s)" awk -v w="$w" 'BEGIN { exit !(w >= 1) }'
wait "$p1_pid" "$p2_pid"
turns=$(ms_since "$t0")
check "  both jobs ran to their end" sh -c "grep -q 'rc=0' '$WORK/p1.out' && grep -q 'rc=0' '$WORK/p2.out'"
check "two 10 GiB jobs on the 16 GiB GPU finish sooner with the arbiter: ${turns} ms taking turns, ${bare} ms paging together" \
    test "$turns" -lt $((bare * 85 / 100))
g=$(series vgpu_turn_grants_total "device_uuid=\"$UUID0\"")
check "vgpu_turn_grants_total counts the turns (${g})" test "${g:-0}" -ge 3
check_eq "no revocation: both drained when told" "$(series vgpu_turn_revocations_total "device_uuid=\"$UUID0\"")" 0

echo "-- (b) two whose memory fits run together at full speed, no turns"
# 4 GiB each (8 of 16): the first one's ledger may show the second's memory too (its library's truth-up
# reads the fake NVML's figure for PID 1, which both containers' clients are), still well within the GPU.
g0=$(series vgpu_turn_grants_total "device_uuid=\"$UUID0\"")
pair 4 2000; fit=$PAIR_MS
for p in p1 p2; do
    per=$(field ns_per_launch "$(cat "$WORK/$p.out")")
    check "  $p ran at full speed (${per} ns per 1 ms kernel)" test "${per:-9999999}" -lt 1500000
done
echo "  (side by side: ${fit} ms for two jobs of 2 s, container starts included)"
check_eq "  ... no turn was granted" "$(series vgpu_turn_grants_total "device_uuid=\"$UUID0\"")" "$g0"
check_eq "  ... not contended" "$(series vgpu_turn_contended "device_uuid=\"$UUID0\"")" 0

echo "-- (g) a forged ledger beside an honest job: no turns, no freeze, full speed"
# The forger runs no CUDA: it writes 12 GiB into its ledger's total (the commit word's low 46 bits, byte
# 256) and keeps moving its launches (byte 344), waiting (336) and waited_ns (360) words. The old arbiter
# read 12 + 5 GiB charged on the 16 GiB GPU, the forger "wanting" and "working": it took turns and froze
# or slowed the honest job (issue 44: 3.1 s to 9.1 s).
g0=$(series vgpu_turn_grants_total "device_uuid=\"$UUID0\"")
froze0=$(grep -c 'froze' "$WORK/mon.log"); contended0=$(grep -c "GPU $UUID0: contended" "$WORK/mon.log")
L=/run/vgpu/ledgers/$UUID0.ledger
new_bundle sh -c "printf '\\000\\000\\000\\000\\003\\000\\000\\000' | dd of=$L bs=1 seek=256 conv=notrunc 2>/dev/null
    printf '\\001' | dd of=$L bs=1 seek=336 conv=notrunc 2>/dev/null; i=0
    while :; do i=\$(((i + 1) % 200)); b=\$(printf '\\\\%03o' \$((i + 1)))
        printf \"\$b\" | dd of=$L bs=1 seek=344 conv=notrunc 2>/dev/null
        printf \"\$b\" | dd of=$L bs=1 seek=361 conv=notrunc 2>/dev/null; sleep 0.05; done"
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 12Gi
bundle_annotate "$B" vgpu.io/memory-mode oversubscribe
start forger
check "the forger runs" wait_for 10 running "$forger_id"
forged_total() { [ "$("$VGPUCTL" status --json --state-root "$STATE" | jq --arg id "$forger_id" '[.containers[] | select(.id == $id) | .gpus[0].used][0]')" = $((12 << 30)) ]; }
check "  ... its ledger says 12 GiB" wait_for 10 forged_total
sleep 2
job 5 3000; start hj
wait "$hj_pid"
per=$(field ns_per_launch "$(cat "$WORK/hj.out")")
check "the honest job ran at full speed beside the forger (${per} ns per 1 ms kernel)" test "${per:-9999999}" -lt 1500000
check_eq "  ... no turn was granted" "$(series vgpu_turn_grants_total "device_uuid=\"$UUID0\"")" "$g0"
check_eq "  ... nobody was frozen" "$(grep -c 'froze' "$WORK/mon.log")" "$froze0"
check_eq "  ... never contended" "$(grep -c "GPU $UUID0: contended" "$WORK/mon.log")" "$contended0"
plain kill "$forger_id" KILL 2>/dev/null; wait "$forger_pid" 2>/dev/null

echo "-- (c) a holder that bypasses the library never yields: handed past and frozen (revoked)"
# X drops the preload (no /etc/ld.so.preload): its launches never wait, its ledger says nothing; NVML sees it.
cp -a "$ROOTFS" "$WORK/rootfs-x"
job 10 60000 "mv /etc /etc2 &&"
bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-x"
start x
check "X runs" wait_for 10 running "$x_id"
CGX=$(cgroup_of "$x_id")
watch_frozen() {
    while [ -e "$1/cgroup.events" ]; do grep -h '^frozen' "$1/cgroup.events" 2>/dev/null; sleep 0.05; done >"$2" &
    on_exit "kill $! 2>/dev/null"
}
watch_frozen "$CGX" "$WORK/x.frozen"
sleep 2
t0=$(date +%s%N)
job 10 3000; start y
check "X, the first to want the GPU, is revoked: handed past undrained, then frozen" \
    wait_for 20 grep -q "container $x_id revoked: .*; froze .* until its turn" "$WORK/mon.log"
rev=$(ms_since "$t0")
check "  ... within quantum + grace + NVML's readings (${rev} ms; at most 2 s + 1 s + 3 s after Y came)" test "$rev" -lt 9000
check "  ... its cgroup is frozen" wait_for 2 grep -q 'frozen 1' "$WORK/x.frozen"
check "vgpu_turn_revocations_total counts it" test "$(series vgpu_turn_revocations_total "device_uuid=\"$UUID0\"")" -ge 1
check_eq "vgpuctl status --json counts it" "$(status_json | jq '.turns[0].revocations >= 1')" true
wait "$y_pid"
check "Y, under the library, ran to its end meanwhile" ok_job y
check "X is thawed when its turn comes again (frozen 0 after frozen 1)" \
    wait_for 15 sh -c "grep -A100000 'frozen 1' '$WORK/x.frozen' | grep -q 'frozen 0'"

echo "-- (e) the monitor killed mid-turn: nobody hangs; the next monitor thaws what it left frozen"
job 10 3000; start j1; loaded j1
job 10 3000; start j2
waits() { [ "$($TURN get "$STATE/containers/$1/ledgers/$UUID0.ledger" waiting 2>/dev/null)" -gt 0 ] 2>/dev/null; }
j_waits() { waits "$j1_id" || waits "$j2_id"; }
check "J1 or J2 waits for its turn" wait_for 20 j_waits
wait_for 15 grep -q 'frozen 1' "$CGX/cgroup.events"
kill -9 "$mon_PID"; wait "$mon_PID" 2>/dev/null
t0=$(date +%s%N)
frozen_then=$(grep -c 'frozen 1' "$CGX/cgroup.events")
wait "$j1_pid" "$j2_pid"
ms=$(ms_since "$t0")
check "both ran to their end after the arbiter died (${ms} ms)" sh -c "grep -q 'op=launch .*rc=0' '$WORK/j1.out' && grep -q 'op=launch .*rc=0' '$WORK/j2.out'"
check "  ... in bounded time (the library goes after a heartbeat still for 3 s)" test "$ms" -lt 30000
said=$(cat "$WORK/j1.out" "$WORK/j2.out" | grep -c 'heartbeat stood still')
check "  ... the ones that waited said why, once each (${said} lines)" test "$said" -ge 1 -a "$said" -le 2
# The next monitor takes 5 s turns: (d) below needs a holder that keeps the GPU while the forger is caught.
sed 's/^quantum_seconds = 2$/quantum_seconds = 5/' "$VGPU_CONFIG" >"$WORK/config5.toml"
VGPU_CONFIG=$WORK/config5.toml monitor_start mon2 && pass "a new monitor starts" || fail "a new monitor starts"
if [ "$frozen_then" = 1 ]; then
    check "  ... and thaws X, which the killed one left frozen" wait_for 10 grep -q "thawed container $x_id" "$WORK/mon2.log"
else
    pass "  (X was between freezes when the monitor was killed: nothing to thaw)"
fi
plain kill "$x_id" KILL 2>/dev/null; wait "$x_pid" 2>/dev/null

echo "-- (d) a forged Hold while another holds: frozen out of turn"
job 10 8000; start h; loaded h
job 10 8000; start h2
has_queue() { [ "$(status_json | jq '.turns[0].queue | length')" -ge 1 ]; }
check "two jobs take turns" wait_for 15 has_queue
L=/run/vgpu/ledgers/$UUID0.ledger
job 10 8000 "(while :; do printf '\\002' | dd of=$L bs=1 seek=320 conv=notrunc 2>/dev/null; done) &"
start f
check "the forging container, third in the queue, is frozen for using the GPU out of turn" \
    wait_for 10 grep -q "container $f_id used the GPU out of turn" "$WORK/mon2.log"
check "vgpu_turn_out_of_turn_total counts it" test "$(series vgpu_turn_out_of_turn_total "device_uuid=\"$UUID0\"")" -ge 1
CGF=$(cgroup_of "$f_id")

echo "-- (e) a clean stop: Unmanaged at once, everything thawed"
wait_for 10 grep -q 'frozen 1' "$CGF/cgroup.events"
kill "$mon2_PID"; wait "$mon2_PID" 2>/dev/null
check "  ... the forging container is thawed" grep -q 'frozen 0' "$CGF/cgroup.events"
check_eq "  ... the others' ledgers say unmanaged (the forger's says what it writes)" \
    "$($TURN get "$STATE/containers/$h_id/ledgers/$UUID0.ledger" mode)/$($TURN get "$STATE/containers/$h2_id/ledgers/$UUID0.ledger" mode)" unmanaged/unmanaged
check_eq "  ... no status file left" "$(ls "$STATE/turns" 2>/dev/null | grep -c '^gpu-')" 0
plain kill "$f_id" KILL 2>/dev/null
wait "$h_pid" "$h2_pid"
check "the others ran to their end" sh -c "grep -q 'op=launch .*rc=0' '$WORK/h.out' && grep -q 'op=launch .*rc=0' '$WORK/h2.out'"
wait "$f_pid" 2>/dev/null

echo "-- (f) work queued before the freeze runs on while frozen: found (busy_while_frozen); killed only under kill = true"
# A freeze stops CPU threads, not GPU work already queued. Y, under the library, comes first and holds the
# GPU (force: turns whenever two want it; 8 s quanta, so X stays frozen for seconds); X drops the preload and
# queues one long kernel at once (fake: 15 s; `short 1` times one kernel, then queues one more). X is told to
# yield, does not, and is frozen out of turn; its kernel runs on through the freeze (the fake's timeline is
# wall-clock based), so NVML keeps showing it busy.
sed 's/^quantum_seconds = 2$/quantum_seconds = 8/' "$VGPU_CONFIG" >"$WORK/config-f.toml"
echo 'force = true' >>"$WORK/config-f.toml"
# runs_on NAME MONITOR-ARGS...: a monitor NAME, then Y (fy) and X (fx, frozen out of turn).
runs_on() {
    local name=$1; shift
    VGPU_CONFIG=$WORK/config-f.toml monitor_start "$name" "$@" && pass "a monitor starts ($name $*)" || fail "a monitor starts ($name $*)"
    job 4 30000; start fy; loaded fy
    cp -a "$ROOTFS" "$WORK/rootfs-$name"
    new_bundle sh -c 'mv /etc /etc2 && compute_client short 1 1; echo client_rc=$?; exec sleep 30'
    bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-$name"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 FAKE_CUDA_KERNEL_US=15000000
    bundle_annotate "$B" vgpu.io/memory-limit 12Gi
    bundle_annotate "$B" vgpu.io/memory-mode oversubscribe
    start fx
    check "  X, its long kernel queued, is frozen out of turn" \
        wait_for 15 grep -q "container $fx_id used the GPU out of turn" "$WORK/$name.log"
}
# ends: X and Y killed, waited for.
ends() {
    plain kill "$fx_id" KILL 2>/dev/null; plain kill "$fy_id" KILL 2>/dev/null
    wait "$fx_pid" "$fy_pid" 2>/dev/null
}
runs_on mon3
# Found at the first reading that covers only time from the grace (1 s) on after the freeze: about 2 to 3 s
# after it, while Y's 8 s quantum keeps X frozen.
check "the arbiter finds X's work running on while frozen, reporting only (no kill policy)" \
    wait_for 10 grep -q "GPU $UUID0: container $fx_id busy while frozen: NVML shows its processes using the GPU .* after it was frozen .*: reporting only" "$WORK/mon3.log"
check "  ... and keeps it frozen" grep -q 'frozen 1' "$(cgroup_of "$fx_id")/cgroup.events"
# The scrape shows a count from the collection after the one that logged it: waited for, not read once.
frozen_busy_counted() { [ "$(series vgpu_turn_busy_while_frozen_total "device_uuid=\"$UUID0\"")" = "$1" ]; }
kills_counted() { scrape | grep -q "^vgpu_watchdog_kills_total $1\$"; }
check "vgpu_turn_busy_while_frozen_total counts it" wait_for 10 frozen_busy_counted 1
ran_frozen_shown() { [ "$(status_json | jq --arg u "$UUID0" '[.turns[] | select(.uuid == $u) | .busy_while_frozen][0]')" = "$1" ]; }
check "  ... and vgpuctl status shows it (busy_while_frozen in --json, RAN FROZEN in the table)" wait_for 10 ran_frozen_shown 1
check_eq "  ... logged once" "$(grep -c "container $fx_id busy while frozen" "$WORK/mon3.log")" 1
check_eq "  ... nothing killed" "$(grep -c 'killed pid' "$WORK/mon3.log")" 0
ends
kill "$mon3_PID"; wait "$mon3_PID" 2>/dev/null
runs_on mon4 --kill
check "under kill = true its busy process is killed (SIGKILL, pidfd-checked)" \
    wait_for 10 grep -q "killed pid [0-9]* (SIGKILL) of container $fx_id on GPU $UUID0: its work ran on while the container was frozen (the time-quanta arbiter)" "$WORK/mon4.log"
check "  ... after the finding, which says so" \
    grep -q "container $fx_id busy while frozen: .*: killing its busy processes under the kill policy" "$WORK/mon4.log"
check "  ... its client died of SIGKILL (137) before its work was done (seen once its turn thaws it)" \
    wait_for 15 grep -q '^client_rc=137$' "$WORK/fx.out"
check "vgpu_watchdog_kills_total counts the kill" wait_for 10 kills_counted 1
check_eq "  ... Y is never named" "$(grep -c "container $fy_id busy while frozen" "$WORK/mon4.log")" 0
ends
kill "$mon4_PID"; wait "$mon4_PID" 2>/dev/null

echo "-- bad settings: one clear line"
printf '[monitor.turns]\nquantum_seconds = 0\n' >"$WORK/bad.toml"
out=$(VGPU_CONFIG=$WORK/bad.toml "$VGPUCTL" monitor --once 2>&1)
check_match "a zero quantum is refused, naming the key" '^vgpuctl: error: .*quantum_seconds' "$out"
check_eq "  ... in one line" "$(printf '%s\n' "$out" | wc -l)" 1

check_eq "no state left" "$(state_left)" ""
t_done
