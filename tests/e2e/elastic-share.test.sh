#!/usr/bin/env bash
# The elastic compute share (issue 42) on the fake GPU: a request (CUDA_DEVICE_SM_REQUEST, the floor)
# below the limit (CUDA_DEVICE_SM_LIMIT, the cap; none: the whole GPU). The fake GPU time-slices busy
# processes in 5 ms slices (FAKE_CUDA_TIMESLICE_US), as a real GPU does contexts, and the fake NVML
# reports each process's part of the GPU's time: the library learns who is busy from that alone.
# - alone, a floor runs at its limit; a hard cap (a limit alone) keeps today's meaning;
# - two or three busy tenants whose floors fill the GPU get their floors; floors that leave time idle
#   share it in proportion to the requests;
# - one goes idle: the other runs as if alone;
# - a floor that becomes busy beside a borrower has its time back fast: the borrower's log dates the
#   moment it went back to its floor (CLOCK_MONOTONIC), against the floor's start;
# - through the OCI side (real runc, the shim): vgpu.io/compute-request in a container, beside a
#   neighbour.
# Each tenant's share is its launches x kernel time / wall time; the bounds are wide for a loaded 2-core
# machine but exclude the hard cap (a request held at its floor alone) and a GPU split evenly.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
t_init elastic-share
t_require "$LIBVGPU" "$CLIENTS_DIR/rt_client" "$FAKE_DIR/libcuda.so.1"
export LD_LIBRARY_PATH=$FAKE_DIR FAKE_CUDA_STATE_DIR=$WORK/fake FAKE_CUDA_CONTEXT_BYTES=64m
export FAKE_CUDA_KERNEL_US=2000 FAKE_CUDA_TIMESLICE_US=5000
mkdir -p "$FAKE_CUDA_STATE_DIR"
RT=$CLIENTS_DIR/rt_client
# Windows of 200 ms: a run of a few seconds spans many of them.
export VGPU_COMPUTE_WINDOW=200ms

# share OUTPUT: percent of wall time the launches of the last loop kept the fake GPU busy.
share() {
    local l s
    l=$(field launched "$1"); s=$(field seconds "$1")
    [ -n "$l" ] && [ -n "$s" ] || { echo -1; return; }
    awk -v l="$l" -v s="$s" -v us="$FAKE_CUDA_KERNEL_US" 'BEGIN { printf "%d", l * us / 1e4 / s }'
}
between() {
    if [ "$2" -ge "$3" ] && [ "$2" -le "$4" ]; then pass "$1 ($2%)"; else fail "$1: $2% not in [$3, $4]"; fi
}
# tenant BUCKET REQUEST LIMIT CMD...: CMD under the library with that request and limit ("": none).
tenant() {
    local c=$1 req=$2 lim=$3; shift 3
    LD_PRELOAD=$LIBVGPU CUDA_DEVICE_MEMORY_SHARED_CACHE=$c CUDA_DEVICE_SM_REQUEST=$req CUDA_DEVICE_SM_LIMIT=$lim \
        "$@" 2>&1
}

# --- alone ---------------------------------------------------------------------------------------------------
out=$(tenant "$WORK/a1" 30 "" "$RT" module work 3)
alone=$(share "$out")
between "a request of 30 alone (no limit) runs at the whole GPU" "$alone" 85 100
out=$(tenant "$WORK/a2" 30 60 "$RT" module work 3)
between "a request of 30 under a limit of 60, alone, runs at its limit" "$(share "$out")" 48 66
out=$(tenant "$WORK/a3" "" 30 "$RT" module work 3)
between "a limit of 30 alone (no request) keeps its meaning: a hard cap" "$(share "$out")" 22 36

# --- pairs and a trio, all busy ------------------------------------------------------------------------------
# pair NAME REQ_A REQ_B SECS: both tenants' loops at once; sets sa and sb.
pair() {
    tenant "$WORK/$1a" "$2" "" "$RT" module work "$4" >"$WORK/$1a.out" &
    local a=$!
    tenant "$WORK/$1b" "$3" "" "$RT" module work "$4" >"$WORK/$1b.out"
    wait $a
    sa=$(share "$(cat "$WORK/$1a.out")"); sb=$(share "$(cat "$WORK/$1b.out")")
}
# (On this fake two paced tenants lose time where their pauses meet, more on a loaded machine: a 30% hard
# cap beside a busy neighbour reads 21% in compute.test.sh. The 70 read 55-64% here; what it does not use
# is idle time, lent.)
pair p1 30 70 5
between "floors 30 and 70 both busy: the 30 gets ~30% (70 beside it: $sb%)" "$sa" 22 40
between "  ... the 70 gets ~70%" "$sb" 50 78
check "  ... the 70 at least 1.5x the 30 ($sb% vs $sa%)" awk -v a="$sa" -v b="$sb" 'BEGIN { exit !(b >= 1.5 * a) }'
# The 40 they leave goes 1:2 in the simulation (lend/tests.rs); on this fake, whose paced tenants lose time
# where their pauses meet, a 6 s run split it from 1:1 to 1:3 (the 40 read 43-62%): its floor and its
# order are checked here, the proportion on the GPU (tests/gpu/elastic.sh).
pair p2 20 40 6
between "floors 20 and 40 both busy: the 40% they leave is lent; the 20 gets its floor at least" "$sa" 18 48
between "  ... the 40 gets its floor at least" "$sb" 38 80
check "  ... the 40 gets at least what the 20 gets ($sb% vs $sa%), and together they keep the GPU busy ($((sa + sb))%)" \
    awk -v a="$sa" -v b="$sb" 'BEGIN { exit !(b >= a && a + b >= 75) }'
tenant "$WORK/t1" 20 "" "$RT" module work 5 >"$WORK/t1.out" &
t1=$!
tenant "$WORK/t2" 30 "" "$RT" module work 5 >"$WORK/t2.out" &
t2=$!
tenant "$WORK/t3" 50 "" "$RT" module work 5 >"$WORK/t3.out"
wait $t1 $t2
s1=$(share "$(cat "$WORK/t1.out")"); s2=$(share "$(cat "$WORK/t2.out")"); s3=$(share "$(cat "$WORK/t3.out")")
# The 20 reads below its floor on this fake (15% on an idle machine, 20% loaded): its loop waits for
# its kernels every 16 launches, each behind two neighbours' 5 ms timeslices, so it cannot spend what
# its bucket holds. What the trio checks is the order no floors would give (~33% each): the 20 at most
# 28, the 50 at least 40.
between "a trio of floors 20, 30 and 50, all busy: the 20 gets ~20%" "$s1" 10 28
between "  ... the 30 gets ~30%" "$s2" 22 38
between "  ... the 50 gets ~50%" "$s3" 40 60

# --- one idle: the other runs as if alone -----------------------------------------------------------------
# The 70 runs 1 s beside the 30 and stops; the 30 takes the GPU alone once it stays quiet a second (a
# paced neighbour pauses for most of each window); its second loop (2 s) is measured.
tenant "$WORK/i1a" 70 "" "$RT" module work 1 >"$WORK/i1a.out" &
a=$!
out=$(tenant "$WORK/i1b" 30 "" "$RT" module work 2.5 work 2)
wait $a
idle=$(share "$out")
check "its neighbour gone idle, a floor of 30 runs at 0.95x its alone throughput ($idle% vs $alone% alone)" \
    awk -v s="$idle" -v a="$alone" 'BEGIN { exit !(s >= 0.95 * a - 2) }'

# --- taken back: a floor waking beside a borrower ------------------------------------------------------------
# The 30 borrows the whole GPU alone for 1 s; then the 70 starts (and ends before the 30 does). The 30's log dates each change of its
# entitlement (CLOCK_MONOTONIC ms); the 70's start is dated by the same clock just before its exec.
LIBCUDA_LOG_LEVEL=3 tenant "$WORK/r1b" 30 "" "$RT" module work 4 >"$WORK/r1b.out" &
b=$!
sleep 1
start_ms=$(python3 -c 'import time; print(time.monotonic_ns() // 1000000)')
# The 70 runs 2.5 s (1.5 s read 58-62%: its start and the reclaim are a larger part of a short run).
out=$(tenant "$WORK/r1a" 70 "" "$RT" module work 2.5)
wait $b
back=$(awk -v s="$start_ms" '/compute share: entitled 30% \(was / {
    for (i = 1; i <= NF; i++) if ($i == "at") { t = $(i + 1); if (t >= s) { print t - s; exit } } }' "$WORK/r1b.out")
check "a borrower (a floor of 30 alone at the whole GPU) went back to its floor within 300 ms of the 70's start on this fake (${back:-never} ms; the GPU's figure is in docs/gpu-results.md)" \
    awk -v b="${back:-99999}" 'BEGIN { exit !(b <= 300) }'
between "  ... so the 70 got ~70% over its 2.5 s" "$(share "$out")" 55 78

# --- taken back within 100 ms: the median of several wakes ---------------------------------------------------
# NVML's samples come as an H200's do for the library (FAKE_NVML_SAMPLE_MS: every 400 ms; it answered every
# 200 ms with every other query empty), so NVML alone gives the floor back 0-400 ms late; the borrower's own
# work, stretched by the neighbour's slices, answers first (docs/libvgpu.md, the elastic share). Kernels of
# 0.5 ms in 0.25 ms slices: every timed launch of the borrower's sees the neighbour's slices, as on the
# H200. Each trial: the 30 alone as a borrower, the 70 wakes at a random phase of NVML's samples; the time
# from the 70's first launch (its loop's start, CLOCK_MONOTONIC) to the 30's log dating its floor.
# (With the 64 ms stretch of the charge alone, before: medians of 129 and 133 ms, worst 311 and 545 ms.)
backs=()
for i in 1 2 3 4 5 6 7; do
    FAKE_NVML_SAMPLE_MS=400 FAKE_CUDA_KERNEL_US=500 FAKE_CUDA_TIMESLICE_US=250 LIBCUDA_LOG_LEVEL=3 \
        tenant "$WORK/w${i}b" 30 "" "$RT" module work 2.2 >"$WORK/w${i}b.out" &
    b=$!
    sleep "1.$((RANDOM % 400 + 100))"
    out=$(FAKE_NVML_SAMPLE_MS=400 FAKE_CUDA_KERNEL_US=500 FAKE_CUDA_TIMESLICE_US=250 \
        tenant "$WORK/w${i}a" 70 "" "$RT" module work 0.5)
    wait $b
    started=$(field started_ms "$out")
    back=$(awk -v s="${started:-0}" '/compute share: entitled 30% \(was / {
        for (i = 1; i <= NF; i++) if ($i == "at") { t = $(i + 1); if (t >= s) { print t - s; exit } } }' "$WORK/w${i}b.out")
    backs+=("${back:-99999}")
done
read -r p50 worst < <(printf '%s\n' "${backs[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[NR] }')
check "a waking floor has its time back within 100 ms at the median of 7 wakes, 200 ms at worst (${backs[*]} ms; median $p50, worst $worst)" \
    awk -v m="$p50" -v w="$worst" 'BEGIN { exit !(m <= 100 && w <= 200) }'

# --- through the OCI side -----------------------------------------------------------------------------------
oci_setup
# share_bundle CMD...: a container with the fake GPU, its kernel time and time slicing; its context holds
# CTX_BYTES (64m: memory, as a real one does; the library finds its process in NVML's list by it).
share_bundle() {
    new_bundle "$@"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 FAKE_CUDA_KERNEL_US=$FAKE_CUDA_KERNEL_US FAKE_CUDA_CONTEXT_BYTES=${CTX_BYTES:-64m} \
        FAKE_CUDA_TIMESLICE_US=$FAKE_CUDA_TIMESLICE_US
}
share_bundle rt_client module work 3
bundle_annotate "$B" vgpu.io/compute-request 30
out=$(shim run --bundle "$B" "$ID" 2>&1)
between "shim: vgpu.io/compute-request=30, alone: the container runs at the whole GPU" "$(share "$out")" 80 100
share_bundle rt_client module work 4
bundle_annotate "$B" vgpu.io/compute-request 30
FAKE_CUDA_STATE_DIR=$FAKESTATE tenant "$WORK/o1" 70 "" "$RT" module work 4.5 >"$WORK/o1.out" &
n=$!
sleep 0.3
out=$(shim run --bundle "$B" "$ID" 2>&1)
wait $n
# Held near its 30: what this checks is the upper bound (a container not held reads ~50%, lent as when
# alone); below, it may read under its floor where the fake's timeslices make its loop wait (19-25%).
between "  ... beside a busy neighbour with a floor of 70, it is held near its 30" "$(share "$out")" 15 42
between "  ... and the neighbour gets ~70%" "$(share "$(cat "$WORK/o1.out")")" 55 80
# A tenant whose PID the library never learns (its context holds no memory: no process appears in NVML's
# list by it) counts its own use among the others': it is never alone, so it gains nothing by hiding.
CTX_BYTES=0 share_bundle rt_client module work 4
bundle_annotate "$B" vgpu.io/compute-request 30
FAKE_CUDA_STATE_DIR=$FAKESTATE tenant "$WORK/o2" 70 "" "$RT" module work 4.5 >"$WORK/o2.out" &
n=$!
sleep 0.3
out=$(shim run --bundle "$B" "$ID" 2>&1)
wait $n
between "  ... one whose PID the library never learns, beside the same neighbour, is held near its 30 too" "$(share "$out")" 15 44
check_eq "  ... poststop removed the state" "$(state_left)" ""

t_done
