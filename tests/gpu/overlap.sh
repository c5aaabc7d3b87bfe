#!/usr/bin/env bash
# Issue 41's attack 3 on a real GPU (a benchmark that prints numbers, not a test; tests/gpu/overlap.py):
#   pipeline  kernels/s of 1 and 4 streams of 50 small matmuls a round, bare, under the library with a
#             memory quota only, and under a 50% share: the 4-stream speed-up kept under the share (target:
#             within 10% of bare's); with the share's trace (LIBCUDA_LOG_LEVEL=3) summed by trace_sum.py, so
#             that what each launch was charged stands beside its kernel's time
#   flood     ~0.7 ms matmuls, synchronised every 100, bare and at 50%: the GPU time it got (its rate against
#             bare's) beside the device's utilisation as NVML reads it (nvidia-smi, every 100 ms; target 50 +- 3)
#             and the GPU time it got by the kernel's own time (events around each round) at 50% duty
#             without the library, times its rate: a half-idle GPU runs its kernels faster than a busy one
# Writes $OUT/overlap.txt. Environment: VGPU_LIB (target/vgpu/libvgpu.so), VGPU_LIB_BEFORE, OUT, PY,
# OVERLAP_SECONDS (6), OVERLAP_PARTS ("pipeline flood"), OVERLAP_KINDS ("matmul spin": the pipeline's kernels,
# 512² matmuls, launch-bound from Python, or one-thread spins of OVERLAP_SPIN_US, 50 us, that surely overlap).
set -u
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
py=${PY:-/opt/torch/.venv/bin/python3}
secs=${OVERLAP_SECONDS:-6}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-overlap.XXXXXX)
trap 'rm -rf "$W"' EXIT
res=$out/overlap.txt
: >"$res"
say() { echo "$*" | tee -a "$res"; }
rate() { field per_s "$1"; }
field() { grep '^RESULT' "$2" | tail -1 | python3 -c "import json,sys; print(json.loads(sys.stdin.read()[7:])['$1'])" 2>/dev/null || { tail -3 "${2%.out}.err" >&2; echo 0; }; }
# go NAME LIB SM ARGS...: one run (LIB "none": bare; SM "none": a memory quota only).
go() {
    local name=$1 l=$2 sm=$3; shift 3
    if [ "$l" = none ]; then
        $py tests/gpu/overlap.py "$@" --seconds "$secs" >"$W/$name.out" 2>"$W/$name.err"
    elif [ "$sm" = none ]; then
        LD_PRELOAD="$l" CUDA_DEVICE_MEMORY_LIMIT=16g CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name.c" \
            $py tests/gpu/overlap.py "$@" --seconds "$secs" >"$W/$name.out" 2>"$W/$name.err"
    else
        LD_PRELOAD="$l" CUDA_DEVICE_MEMORY_LIMIT=16g CUDA_DEVICE_SM_LIMIT="$sm" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$name.c" \
            LIBCUDA_LOG_LEVEL=${LOG:-1} $py tests/gpu/overlap.py "$@" --seconds "$secs" >"$W/$name.out" 2>"$W/$name.err"
    fi
    rate "$W/$name.out"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }

say "# overlap, $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
libs="none:bare $lib:library"
[ -n "$before" ] && libs="$libs $before:before"
parts=${OVERLAP_PARTS:-pipeline flood}
kinds=${OVERLAP_KINDS:-matmul spin}
for entry in $libs; do
    case " $parts " in *" pipeline "*) ;; *) break ;; esac
    l=${entry%%:*} tag=${entry##*:}
    for sm in none 50; do
        [ "$l" = none ] && [ "$sm" = 50 ] && continue
        [ "$tag" = before ] && [ "$sm" = none ] && continue
        for kind in $kinds; do
            spin=; [ "$kind" = spin ] && spin="--spin-us ${OVERLAP_SPIN_US:-50}"
            one=$(go "p1-$kind-$tag-$sm" "$l" "$sm" pipeline --streams 1 $spin)
            four=$(LOG=3 go "p4-$kind-$tag-$sm" "$l" "$sm" pipeline --streams 4 $spin)
            say "pipeline ($kind), $tag, share $sm: 1 stream $one kernels/s, 4 streams $four: speed-up $(ratio "$four" "$one")"
            if [ "$sm" = 50 ]; then
                python3 tests/gpu/trace_sum.py "$W/p4-$kind-$tag-$sm.err" 2>&1 | head -12 | sed 's/^/    /' | tee -a "$res"
            fi
        done
    done
done
# flood: bare, then at 50% (each library), NVML's device utilisation sampled during the timed part.
case " $parts " in *" flood "*) ;; *) exit 0 ;; esac
go f-duty none none flood --duty 0.5 >/dev/null
k50=$(field gpu_us_per_kernel "$W/f-duty.out")
say "flood kernel time without the library: $(field gpu_us_per_kernel "$W/f-duty.out" 2>/dev/null) us at 50% duty"
for entry in $libs; do
    l=${entry%%:*} tag=${entry##*:}
    sm=50; [ "$l" = none ] && sm=none
    # Each sample with its time (nvidia-smi delivers them slower than asked): those of the timed part's
    # middle are averaged, by the run's own start and end.
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100 >"$W/util-$tag" &
    smi=$!
    r=$(go "f-$tag" "$l" "$sm" flood)
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    [ "$l" = none ] && bare=$r
    # The timed part is the last $secs s: the samples of its middle (skip the first and last second).
    u=$(python3 - "$W/util-$tag" "$(field t0 "$W/f-$tag.out")" "$(field t1 "$W/f-$tag.out")" <<'PY'
import datetime, sys
lo, hi = float(sys.argv[2]) + 1, float(sys.argv[3]) - 1
v = []
for line in open(sys.argv[1]):
    try:
        ts, u = [x.strip() for x in line.split(",")]
        t = datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        continue
    if lo <= t <= hi:
        v.append(float(u))
print(f"{sum(v) / len(v):.1f} ({len(v)} samples)" if v else "- (no samples)")
PY
)
    got=$(awk -v r="$r" -v k="$k50" 'BEGIN { printf "%.1f", r * k / 1e4 }')
    say "flood, $tag, share $sm: $r kernels/s ($(ratio "$r" "${bare:-0}") of bare; kernel $(field gpu_us_per_kernel "$W/f-$tag.out") us by its events), GPU time got ${got}% (rate x the 50%-duty kernel time), NVML device utilisation ${u} in the timed part less its first and last second"
done
