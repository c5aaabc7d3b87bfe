#!/usr/bin/env bash
# The time-quanta arbiter (issue 29) on a real GPU, in the SAFE regime only: two runc containers with
# oversubscribe quotas (24 GiB each) whose managed working sets fit the GPU together (GIB each, 20 by
# default: 40 GiB in all; the script refuses past 60 GiB in all or when the GPU lacks their memory + 8 GiB
# free: thrashing a real GPU can hang it, so the contended regime is the fake driver's
# (tests/e2e/time-quanta.test.sh)). Each container runs tests/gpu/tq_job.cu: passes over all its managed
# memory for SECS seconds (30), recording each pass's start and end. Measures:
#   solo       one job alone, no monitor: the reference throughput (GiB/s touched);
#   (a)        both together without the arbiter (no monitor), then with it (`vgpuctl monitor`, default
#              turns): their memory fits, so no turns and each at the same throughput (the no-contention
#              cost); the scrape's vgpu_turn_contended and grants must stay 0;
#   (b)        both together with turns forced (`[monitor.turns] force = true`, 2 s quanta): the hand-off
#              cost, the gap between one job's last pass and the other's first after a switch (each pass
#              is a few ms, so a gap is Yield → drain → the arbiter's next tick → Hold → the waiting
#              thread's poll → the first launch), and each job's throughput against its share of the time
#              (GiB/s while it ran / solo).
# Run from the repository root on the GPU machine (device tool), as tests/gpu/share_wall.sh:
#   carry: target/vgpu  .deps/gpu    command: bash tests/gpu/time_quanta.sh   (GIB=20 SECS=30)
# Prints the figures and "N passed, N failed"; writes $OUT/time-quanta.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
export GPU_HOST_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
source tests/gpu/lib.sh
unpack_container_tools
if [ -n "${OUT:-}" ]; then exec > >(tee "$OUT/time-quanta.log") 2>&1; fi
GIB=${GIB:-20}
SECS=${SECS:-30}
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
free=$((total - $(used)))
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); ${free} of ${total} MiB free; runc $("$RUNC" --version | head -1)"
if [ $((2 * GIB)) -gt 60 ] || [ "$free" -lt $(((2 * GIB + 8) * 1024)) ]; then
    echo "time_quanta: two jobs of ${GIB} GiB need $((2 * GIB)) GiB (at most 60) and 8 GiB to spare; ${free} MiB free: not run (safe regime only)"
    exit 2
fi
mkdir -p target/clients
nvcc -O2 -arch=sm_90 -o target/clients/tq_job tests/gpu/tq_job.cu || exit 1

. tests/e2e/lib/common.sh
. tests/e2e/lib/bundle.sh
. tests/e2e/lib/vgpu.sh
. tests/e2e/lib/gpu.sh
t_init gpu-time-quanta
VGPUCTL=$T/release/vgpuctl
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$VGPUCTL" "$CLIENTS_DIR/tq_job"
vgpu_config lower_runtime="\"$RUNC\"" nvml_library='"libnvidia-ml.so.1"'
BASE_CONFIG=$(cat "$VGPU_CONFIG")
R=$WORK/runc-root
mkdir -p "$WORK/out"
N=0

# job NAME: a container running tq_job under a 24 GiB oversubscribe quota, in the background (NAME_pid);
# its result line in $WORK/NAME.out, its timeline in $WORK/out/NAME.tl.
job() {
    N=$((N + 1))
    local b=$WORK/b$N
    gpu_bundle "$b" "$WORK/rootfs$N" tq_job "$GIB" "$SECS" "/out/$1.tl"
    bundle_bind "$b" "$WORK/out" /out
    bundle_annotate "$b" vgpu.io/memory-limit 24Gi
    bundle_annotate "$b" vgpu.io/memory-mode oversubscribe
    "$SHIM" --root "$R" run --bundle "$b" "$1" </dev/null >"$WORK/$1.out" 2>&1 &
    eval "$1_pid=$!"
}
# done_job NAME: waits for its container to end (NAME_pid names the shim's pid), then removes it.
done_job() { local v=$1_pid; wait "${!v}" 2>/dev/null; "$RUNC" --root "$R" delete -f "$1" >/dev/null 2>&1; }
rate() { field gib_per_s "$(grep RESULT "$WORK/$1.out")"; }
# monitor [TOML...]: a monitor with the config plus these lines; its log in $WORK/mon.log.
monitor() {
    { echo "$BASE_CONFIG"; printf '%s\n' "$@"; } >"$VGPU_CONFIG"
    "$VGPUCTL" monitor --listen 127.0.0.1:0 --interval 1 >"$WORK/mon.log" 2>&1 &
    MON=$!
    on_exit "kill $MON 2>/dev/null"
    wait_for 20 grep -q 'serving http://' "$WORK/mon.log" || cat "$WORK/mon.log"
    URL=$(grep -o 'http://[^ ]*/metrics' "$WORK/mon.log" | head -1)
    head -1 "$WORK/mon.log"
}
stop_monitor() { kill "$MON"; wait "$MON" 2>/dev/null; }
metric() { curl -sf "$URL" | grep -E "^$1\{" | head -1 | awk '{print $NF}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "nan" }'; }

echo "== solo: one job alone, no monitor"
job solo; done_job solo
cat "$WORK/solo.out"
solo=$(rate solo)
check "the job ran alone (${solo} GiB/s)" test -n "$solo"

echo "== (a) two jobs whose memory fits, together: without the arbiter, then with it"
job a1; job a2; done_job a1; done_job a2
bare1=$(rate a1) bare2=$(rate a2)
echo "without the arbiter: ${bare1} and ${bare2} GiB/s"
monitor
job w1; job w2
sleep $((SECS / 2))
contended=$(metric vgpu_turn_contended) grants=$(metric vgpu_turn_grants_total)
done_job w1; done_job w2
with1=$(rate w1) with2=$(rate w2)
echo "with the arbiter: ${with1} and ${with2} GiB/s; vgpu_turn_contended ${contended:-absent}, grants ${grants:-absent}"
echo "RESULT no-contention ratio (with / without, summed) $(ratio "$(awk -v a="$with1" -v b="$with2" 'BEGIN{print a+b}')" "$(awk -v a="$bare1" -v b="$bare2" 'BEGIN{print a+b}')")"
check_eq "  ... their memory fits: the arbiter lets them run together (not contended)" "${contended:-0}" 0
check_eq "  ... no turn granted" "${grants:-0}" 0
check "  ... at the same throughput as without it (within 5%)" awk -v w="$with1" -v x="$with2" -v a="$bare1" -v b="$bare2" \
    'BEGIN { exit !(w > 0 && x > 0 && a > 0 && b > 0 && (w + x) >= 0.95 * (a + b)) }'
stop_monitor

echo "== (b) turns forced: the hand-off cost and each job's throughput against its share of the time"
monitor '[monitor.turns]' 'force = true' 'quantum_seconds = 2' 'idle_seconds = 1' 'grace_seconds = 5'
job f1; job f2
sleep $((SECS / 2))
grants=$(metric vgpu_turn_grants_total) revoked=$(metric vgpu_turn_revocations_total)
done_job f1; done_job f2
stop_monitor
echo "forced turns: $(rate f1) and $(rate f2) GiB/s over the whole run; grants ${grants:-absent} by mid-run, revocations ${revoked:-absent}"
cat "$WORK/f1.out" "$WORK/f2.out" | grep RESULT
python3 - "$WORK/out/f1.tl" "$WORK/out/f2.tl" "$GIB" "$solo" <<'PY' | tee "$WORK/handoff.txt"
import sys
tl = []
for j, path in enumerate(sys.argv[1:3]):
    for line in open(path):
        a, b = map(int, line.split())
        tl.append((a, b, j))
tl.sort()
gib, solo = float(sys.argv[3]), float(sys.argv[4])
gaps, overlap = [], 0
for (a0, b0, j0), (a1, b1, j1) in zip(tl, tl[1:]):
    if j0 != j1:
        if a1 >= b0:
            gaps.append((a1 - b0) / 1e6)
        else:
            overlap += 1
span = (max(b for _, b, _ in tl) - min(a for a, _, _ in tl)) / 1e9
gaps.sort()
q = lambda p: gaps[min(len(gaps) - 1, int(p * len(gaps)))] if gaps else float("nan")
print(f"RESULT handoffs={len(gaps)} overlapping_switches={overlap} gap_ms_median={q(0.5):.1f} gap_ms_p90={q(0.9):.1f} gap_ms_max={(gaps[-1] if gaps else float('nan')):.1f}")
for j in (0, 1):
    mine = [(a, b) for a, b, k in tl if k == j]
    held = sum(b - a for a, b in mine) / 1e9
    rate_held = len(mine) * gib / held if held else 0
    print(f"RESULT job{j + 1} passes={len(mine)} share_of_time={held / span:.3f} gib_per_s_while_running={rate_held:.1f} vs_solo={rate_held / solo if solo else 0:.3f}")
PY
h=$(grep -o 'handoffs=[0-9]*' "$WORK/handoff.txt" | cut -d= -f2)
check "the jobs took turns (${h:-0} hand-offs, ${grants:-0} grants by mid-run)" test "${h:-0}" -ge 4
check_eq "  ... none was revoked (both drained when told)" "${revoked:-0}" 0
check "  ... each got a share of the time (both ran)" sh -c "grep -q 'RESULT gib' '$WORK/f1.out' && grep -q 'RESULT gib' '$WORK/f2.out'"
echo "-- the monitor's log"; grep 'turns' "$WORK/mon.log" | tail -5
t_done
