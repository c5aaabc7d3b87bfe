#!/usr/bin/env bash
# The elastic compute share on a real GPU (issue 42, item 7): a benchmark that prints numbers, not a test.
# The workload is tests/gpu/compute_case.py's saturating bf16 matmul loop (8192², eager), each process its
# own ledger (as separate containers), requests in CUDA_DEVICE_SM_REQUEST and no limit (the whole GPU):
#   alone     the loop without the library, and under a request of 30 (target: >= 0.95x)
#   pair      two unlimited loops at once (the pair's achievable sum), then floors 30 and 70 at once
#             (target: each within 5 points of 30/70 of that sum)
#   idle      the 70 stops after a third of the run: the 30's throughput after it (target: >= 0.95x alone)
#   trio      floors 20, 30 and 50 at once
#   reclaim   the 30 alone (borrowing the whole GPU), then the 70 starts its loop at a set time: how long
#             until the 30's log says it went back to its floor (LIBCUDA_LOG_LEVEL=3, CLOCK_MONOTONIC);
#             ELASTIC_RECLAIMS times, p50 and p99 (target: 100 ms)
# Writes $OUT/elastic.txt. Environment: VGPU_LIB, OUT, PY (/opt/torch/.venv/bin/python3), ELASTIC_SECONDS
# (9), ELASTIC_RECLAIMS (10), ELASTIC_PARTS (the parts to run: "alone pair idle trio reclaim"; pair and trio
# need alone's and pair's baselines). HAMi-core's policies beside it need HAMi-core's library on the machine
# (HAMI_LIB): with it, the pair runs again under CUDA_DEVICE_SM_LIMIT=30/70 with
# GPU_CORE_UTILIZATION_POLICY=default and =force, and a limit of 30 alone under each, every process its own shared
# region (CUDA_DEVICE_MEMORY_SHARED_CACHE, as separate containers).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
out=$(realpath -m "${OUT:-target/gpu-results}")
py=${PY:-/opt/torch/.venv/bin/python3}
secs=${ELASTIC_SECONDS:-9}
reclaims=${ELASTIC_RECLAIMS:-10}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-elastic.XXXXXX)
trap 'rm -rf "$W"' EXIT
res=$out/elastic.txt
: >"$res"
say() { echo "$*" | tee -a "$res"; }
# tflops FILE: the loop's TFLOP/s from its RESULT line (0 when it failed).
tflops() {
    grep '^RESULT' "$1" 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()[7:])["tflops"])' 2>/dev/null \
        || { tail -3 "${1%.out}.err" >&2; echo 0; }
}
# loop NAME REQUEST ARGS...: the matmul loop under a request ("none": without the library), in the
# background; its pid in $!.
loop() {
    local name=$1 req=$2; shift 2
    if [ "$req" = none ]; then
        $py tests/gpu/compute_case.py matmul "$@" >"$W/$name.out" 2>"$W/$name.err" &
    else
        LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name" CUDA_DEVICE_SM_REQUEST="$req" \
            LIBCUDA_LOG_LEVEL=${LOG:-1} $py tests/gpu/compute_case.py matmul "$@" \
            >"$W/$name.out" 2>"$W/$name.err" &
    fi
}
at() { python3 -c "import time; print(time.time() + $1)"; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "-" }'; }

parts=" ${ELASTIC_PARTS:-alone pair idle trio reclaim} "
part() { case $parts in *" $1 "*) return 0 ;; esac; return 1; }
say "# elastic share, $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
if part alone; then
loop u none --seconds "$secs"; wait
U=$(tflops "$W/u.out")
loop r30 30 --seconds "$secs"; wait
say "alone: unlimited $U TFLOP/s; a request of 30 alone $(tflops "$W/r30.out") ($(pct "$(tflops "$W/r30.out")" "$U")%; target >= 95)"
fi

if part pair; then
t=$(at 8)
loop ua none --seconds "$secs" --start-at "$t"; loop ub none --seconds "$secs" --start-at "$t"; wait
sum=$(awk -v a="$(tflops "$W/ua.out")" -v b="$(tflops "$W/ub.out")" 'BEGIN { print a + b }')
t=$(at 8)
loop p30 30 --seconds "$secs" --start-at "$t"; loop p70 70 --seconds "$secs" --start-at "$t"; wait
a=$(tflops "$W/p30.out") b=$(tflops "$W/p70.out")
say "pair: two unlimited $sum TFLOP/s together; floors 30/70: $a + $b = $(pct "$a" "$sum")% + $(pct "$b" "$sum")% of it (target 30 +- 5, 70 +- 5); of the floors' own sum $(pct "$a" "$(awk -v a="$a" -v b="$b" 'BEGIN { print a + b }')")% / $(pct "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print a + b }')")% (a pair that takes turns loses less to time slicing than two unlimited loops)"
fi

# One process of the 30 throughout: the 70 runs its 3 s warm-up and a third of the run, then stops; the
# 30's measured part starts 1.5 s after that (the library takes the GPU alone after 1 s of quiet). A new
# process of the 30 would show nothing: with no neighbour before, it is alone from its start.
if part idle; then
t=$(at 8)
loop i70 70 --seconds "$(awk -v s="$secs" 'BEGIN { print s / 3 }')" --start-at "$t"
loop i30 30 --seconds "$secs" --warmup "$(awk -v s="$secs" 'BEGIN { print 3 + s / 3 + 1.5 }')" --start-at "$t"
wait
say "idle: the 30 from 1.5 s after its neighbour stopped: $(tflops "$W/i30.out") ($(pct "$(tflops "$W/i30.out")" "$U")% of alone; target >= 95)"
fi

if part trio; then
t=$(at 8)
loop t20 20 --seconds "$secs" --start-at "$t"; loop t30 30 --seconds "$secs" --start-at "$t"
loop t50 50 --seconds "$secs" --start-at "$t"; wait
say "trio: floors 20/30/50: $(pct "$(tflops "$W/t20.out")" "$sum")% / $(pct "$(tflops "$W/t30.out")" "$sum")% / $(pct "$(tflops "$W/t50.out")" "$sum")% of the unlimited pair's sum"
fi

if part reclaim; then
: >"$W/reclaims"
for k in $(seq 1 "$reclaims"); do
    t=$(at 10)
    LOG=3 loop rb$k 30 --seconds 6 --start-at "$(python3 -c "print($t - 2)")" --warmup 0
    loop ra$k 70 --seconds 2 --start-at "$t" --warmup 0
    wait
    # The 70's first matmul at wall time t: in CLOCK_MONOTONIC ms, the clock of the 30's log.
    mono=$(python3 -c "import time; print(int(($t - time.time() + time.monotonic()) * 1000))")
    awk -v s="$mono" '/compute share: entitled 30% \(was 100%\) at / {
        for (i = 1; i <= NF; i++) if ($i == "at") { t = $(i + 1); if (t >= s) { print t - s; exit } } }' \
        "$W/rb$k.err" >>"$W/reclaims"
done
# ELASTIC_LOGS: a folder to keep the 30's traces in (the entitlement's log lines say what woke it).
[ -n "${ELASTIC_LOGS:-}" ] && mkdir -p "$ELASTIC_LOGS" && cp "$W"/rb*.err "$ELASTIC_LOGS"/
say "reclaim (ms from the 70's first matmul to the 30 at its floor, $(wc -l <"$W/reclaims") of $reclaims runs): $(sort -n "$W/reclaims" | python3 -c '
import sys
v = [float(x) for x in sys.stdin if x.strip()]
q = lambda p: v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")
top = max(v) if v else float("nan")
print(f"p50 {q(0.5):.0f}, p99 {q(0.99):.0f}, max {top:.0f}")') (target 100)"
fi

if [ -n "${HAMI_LIB:-}" ]; then
    # Its baselines on this machine when the parts that give them did not run.
    if [ -z "${U:-}" ]; then loop u none --seconds "$secs"; wait; U=$(tflops "$W/u.out"); fi
    if [ -z "${sum:-}" ]; then
        t=$(at 8)
        loop ua none --seconds "$secs" --start-at "$t"; loop ub none --seconds "$secs" --start-at "$t"; wait
        sum=$(awk -v a="$(tflops "$W/ua.out")" -v b="$(tflops "$W/ub.out")" 'BEGIN { print a + b }')
    fi
    # hami NAME LIMIT POLICY ARGS...: one loop under HAMi-core, its own shared region (its own container).
    hami() {
        local name=$1 lim=$2 pol=$3; shift 3
        LD_PRELOAD=$HAMI_LIB CUDA_DEVICE_SM_LIMIT=$lim GPU_CORE_UTILIZATION_POLICY=$pol \
            CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name.cache" \
            $py tests/gpu/compute_case.py matmul --seconds "$secs" "$@" >"$W/$name.out" 2>"$W/$name.err" &
    }
    for pol in default force; do
        hami h30a 30 "$pol"; wait
        t=$(at 8)
        hami h30 30 "$pol" --start-at "$t"; hami h70 70 "$pol" --start-at "$t"; wait
        say "HAMi-core $pol: a limit of 30 alone $(pct "$(tflops "$W/h30a.out")" "$U")% of unlimited; 30/70 at once: $(pct "$(tflops "$W/h30.out")" "$sum")% + $(pct "$(tflops "$W/h70.out")" "$sum")% of the unlimited pair's sum"
    done
else
    say "HAMi-core: not run (no HAMI_LIB)"
fi
