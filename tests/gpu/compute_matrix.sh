#!/usr/bin/env bash
# The compute share's precision matrix on a real GPU (issue 24): a benchmark that prints numbers, not a
# test. For each kernel length (bf16 matmuls of 2048², 4096², 8192²) and each of eager, CUDA graphs and
# torch.compile, tests/gpu/compute_matrix.py runs alone without the library, then as two unlimited
# processes at once, then as a 30/70 pair under the library (two ledgers, as two containers), then (with
# MATRIX_ALONE) alone under each share, all in this one run. Each result is a throughput against the same
# loop alone (percent); the target is each capped tenant within 5 points of its share of what the GPU
# gave the pair (the larger of the two pairs' sums: two unlimited loops lose time to time slicing, and a
# capped pair that takes turns loses less and shares what it saved), the capped pair's sum not below the
# unlimited pair's, and alone within 3 points of the share. Each line ends with its verdict (met, or what
# missed) and also says what part of the capped pair's own sum each tenant had.
# Writes $OUT/compute-matrix.txt and, with MATRIX_TRACE=1, every process's output and the library's
# debug trace (LIBCUDA_LOG_LEVEL=3) into $OUT/matrix-logs/ (tests/gpu/compute_trace.py reads a pair's).
# Environment: VGPU_LIB, OUT, MATRIX_WORK (matmul, or conv: a family the share was never tuned on, cuDNN
# convolutions; compute_matrix.py), MATRIX_SECONDS (10: a 30% share's bucket, 0.21 s full, moves a
# cell's GPU time by up to 0.21 s, ±4 points in 5 s; docs/libvgpu.md, "Precision"), MATRIX_SIZES ("2048 4096 8192"), MATRIX_MODES
# ("eager graph compile"), MATRIX_ALONE (shares run alone, e.g. "30"; none by default) in the cells
# MATRIX_ALONE_CELLS names (e.g. "2048-eager 2048-compile"; all by default), PY (/opt/torch/.venv/bin/python3),
# MATRIX_CPUS ("A B": each process pinned with taskset, the alone runs and a pair's first tenant to CPU A,
# the second to B; a loop bound by its launch rate changes speed by a third when the scheduler moves it),
# MATRIX_ALONE_TWICE=1 (the loop alone is run again after the pairs and the faster of the two runs is the
# baseline: on an H200 one pinned 2048² torch.compile baseline ran at 22,916/s where the calls before it
# ran ~29,000, and every percentage of its cell is of it), MATRIX_REPEAT (1: how many times the unlimited
# and the capped pair run, alternately; a cell is judged on their means, each repeat's line printed too:
# a 10 s cell's capped sum moved by ±1.5 points between runs on an H200, more than some cells' margin).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${MATRIX_SECONDS:-10}
reps=${MATRIX_REPEAT:-1}
work=${MATRIX_WORK:-matmul}
py=${PY:-/opt/torch/.venv/bin/python3}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-matrix.XXXXXX)
export W
trap 'rm -rf "$W"' EXIT
export TORCHINDUCTOR_CACHE_DIR=$W/inductor
res=$out/compute-matrix.txt
logs=$out/matrix-logs
[ "${MATRIX_TRACE:-0}" = 1 ] && mkdir -p "$logs"
read -r cpu_a cpu_b <<<"${MATRIX_CPUS:-}"
# pin A|B: the taskset prefix of a process (none without MATRIX_CPUS).
pin() { local c; [ "$1" = A ] && c=$cpu_a || c=$cpu_b; [ -n "$c" ] && echo "taskset -c $c"; }
# run NAME SM ARGS...: SM "none" without the library; prints matmuls per second. The first tenant of a
# pair (names ua-, c30-) and the alone runs on CPU A, the second on B (MATRIX_CPUS).
run() {
    local name=$1 sm=$2 side=A; shift 2
    case $name in ub-* | c70-*) side=B ;; esac
    local py="$(pin $side) $py"
    if [ "$sm" = none ]; then
        $py tests/gpu/compute_matrix.py --work "$work" --seconds "$secs" "$@" >"$W/$name.out" 2>"$W/$name.err"
    else
        LD_PRELOAD="$lib" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name" CUDA_DEVICE_SM_LIMIT="$sm" \
            LIBCUDA_LOG_LEVEL=$([ "${MATRIX_TRACE:-0}" = 1 ] && echo 3 || echo 1) \
            $py tests/gpu/compute_matrix.py --work "$work" --seconds "$secs" "$@" >"$W/$name.out" 2>"$W/$name.err"
    fi
    [ -d "$logs" ] && cp "$W/$name.out" "$W/$name.err" "$logs/"
    grep '^RESULT' "$W/$name.out" | tail -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()[7:])["per_s"])' 2>/dev/null \
        || { tail -3 "$W/$name.err" >&2; echo 0; }
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "-" }'; }
echo "work: $work (compute_matrix.py --work)" | tee "$res"
printf '%-6s %-7s %8s | %-13s | %-13s | %s\n' size mode alone/s "unlimited a/b" "capped 30/70" "targets 30/70 (share x the larger sum)" | tee -a "$res"
for mode in ${MATRIX_MODES:-eager graph compile}; do
    for n in ${MATRIX_SIZES:-2048 4096 8192}; do
        t0=$(date +%s)
        alone=$(run "alone-$n-$mode" none --n "$n" --mode "$mode")
        # The pairs, MATRIX_REPEAT times alternately (unlimited, capped, unlimited, ...): each rate is their
        # mean; the logs of repeat K > 1 are named ...-rK.
        : >"$W/reps"
        for k in $(seq "$reps"); do
            sfx=; [ "$k" -gt 1 ] && sfx=-r$k
            run "ua-$n-$mode$sfx" none --n "$n" --mode "$mode" --barrier "$W/b-u-$n-$mode$sfx" >"$W/ua" &
            run "ub-$n-$mode$sfx" none --n "$n" --mode "$mode" --barrier "$W/b-u-$n-$mode$sfx" >"$W/ub"; wait
            run "c30-$n-$mode$sfx" 30 --n "$n" --mode "$mode" --barrier "$W/b-c-$n-$mode$sfx" >"$W/c30" &
            run "c70-$n-$mode$sfx" 70 --n "$n" --mode "$mode" --barrier "$W/b-c-$n-$mode$sfx" >"$W/c70"; wait
            echo "$(cat "$W/ua") $(cat "$W/ub") $(cat "$W/c30") $(cat "$W/c70")" >>"$W/reps"
        done
        awk '{ for (i = 1; i <= 4; i++) t[i] += $i; n++ } END { for (i = 1; i <= 4; i++) print t[i] / n > (ENVIRON["W"] "/" (i == 1 ? "ua" : i == 2 ? "ub" : i == 3 ? "c30" : "c70")) }' "$W/reps"
        if [ "${MATRIX_ALONE_TWICE:-0}" = 1 ]; then
            again=$(run "again-$n-$mode" none --n "$n" --mode "$mode")
            echo "alone $n $mode: $alone and, after the pairs, $again matmuls/s" >>"$res"
            alone=$(awk -v a="$alone" -v b="$again" 'BEGIN { print (b > a ? b : a) }')
        fi
        if [ "$reps" -gt 1 ]; then
            k=0
            while read -r a b c d; do
                k=$((k + 1))
                echo "repeat $k of $n $mode: unlimited $(pct "$a" "$alone") / $(pct "$b" "$alone"), capped $(pct "$c" "$alone") / $(pct "$d" "$alone"), sums $(awk -v a="$(pct "$a" "$alone")" -v b="$(pct "$b" "$alone")" 'BEGIN { print a + b }') / $(awk -v c="$(pct "$c" "$alone")" -v d="$(pct "$d" "$alone")" 'BEGIN { print c + d }') (unlimited / capped)" >>"$res"
            done <"$W/reps"
        fi
        ua=$(pct "$(cat "$W/ua")" "$alone"); ub=$(pct "$(cat "$W/ub")" "$alone")
        c30=$(pct "$(cat "$W/c30")" "$alone"); c70=$(pct "$(cat "$W/c70")" "$alone")
        sum=$(awk -v a="$ua" -v b="$ub" 'BEGIN { print a + b }')
        solo=; unset solo_shares
        case " ${MATRIX_ALONE_CELLS:-$n-$mode} " in *" $n-$mode "*) ;; *) solo_shares= ;; esac
        for s in ${solo_shares-${MATRIX_ALONE:-}}; do
            solo="$solo ${s}%-alone $(pct "$(run "s$s-$n-$mode" "$s" --n "$n" --mode "$mode")" "$alone")"
        done
        csum=$(awk -v a="$c30" -v b="$c70" 'BEGIN { print a + b }')
        verdict=$(awk -v a="$c30" -v b="$c70" -v u="$sum" -v c="$csum" 'BEGIN {
            s = u > c ? u : c; m = ""
            if (a < 0.3 * s - 5 || a > 0.3 * s + 5) m = m " 30%-tenant"
            if (b < 0.7 * s - 5 || b > 0.7 * s + 5) m = m " 70%-tenant"
            if (c < u) m = m " capped-sum"
            print m == "" ? "met" : "MISS:" m }')
        printf '%-6s %-7s %8s | %5s / %5s | %5s / %5s | %.1f / %.1f (capped sum %.1f, unlimited %.1f; of the capped sum %.1f / %.1f)%s [%ss] %s\n' "$n" "$mode" "$alone" \
            "$ua" "$ub" "$c30" "$c70" "$(awk -v s="$sum" -v c="$csum" 'BEGIN { print 0.3 * (s > c ? s : c) }')" "$(awk -v s="$sum" -v c="$csum" 'BEGIN { print 0.7 * (s > c ? s : c) }')" \
            "$csum" "$sum" "$(awk -v a="$c30" -v s="$csum" 'BEGIN { print (s > 0 ? 100 * a / s : 0) }')" \
            "$(awk -v b="$c70" -v s="$csum" 'BEGIN { print (s > 0 ? 100 * b / s : 0) }')" "$solo" "$(($(date +%s) - t0))" "$verdict" | tee -a "$res"
    done
done
