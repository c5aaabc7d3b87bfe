#!/usr/bin/env bash
# `make bench`: what libvgpu.so adds to the CUDA calls it intercepts and to process start, measured with
# and without LD_PRELOAD=libvgpu.so. Prints a table and writes $BENCH_OUT/results.md (+ raw.jsonl).
#
# Every figure comes from the C programs in this folder; the same script runs on the GPU machine against
# the real driver (tests/gpu/run.sh calls it with BENCH_DRIVER=system). Overrides (environment):
#   BENCH_DRIVER      fake (default: target/fake/libcuda.so.1) | system (the installed libcuda.so.1)
#   BENCH_FAKE_DIR    the fake driver's folder (default target/fake)
#   BENCH_LIBVGPU     the interposer (default target/vgpu/libvgpu.so)
#   BENCH_OUT         output folder (default target/bench)
#   BENCH_ROUNDS      with/without runs alternate this many times; the best round counts (default 5)
#   BENCH_ITERS       calls per repetition for the per-call figures (default 20000)
#   BENCH_PAIR_ITERS  the same for alloc/free pairs (default BENCH_ITERS)
#   BENCH_REPS        repetitions per run, median taken (default 7)
#   BENCH_BYTES       bytes per allocation (default 4096)
#   BENCH_PROCS       process counts for the throughput figure (default "1 8 32")
#   BENCH_PROC_ITERS  alloc/free pairs per process (default 20000)
#   BENCH_START_RUNS  spawns per configuration and round (default 1000)
#   BENCH_LIMIT       the quota while measuring with the library, large enough never to refuse (64Gi)
#   BENCH_SKIP        space-separated parts to leave out: pair meminfo launch start procs ledger
#   CC, PYTHON        compiler (gcc) and Python 3 (python3) to use
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

driver=${BENCH_DRIVER:-fake}
libvgpu=$(realpath -m "${BENCH_LIBVGPU:-target/vgpu/libvgpu.so}")
out=$(realpath -m "${BENCH_OUT:-target/bench}")
rounds=${BENCH_ROUNDS:-5}
iters=${BENCH_ITERS:-20000}
pair_iters=${BENCH_PAIR_ITERS:-$iters}
reps=${BENCH_REPS:-7}
bytes=${BENCH_BYTES:-4096}
procs=${BENCH_PROCS:-1 8 32}
proc_iters=${BENCH_PROC_ITERS:-20000}
start_runs=${BENCH_START_RUNS:-1000}
limit=${BENCH_LIMIT:-64Gi}
skip=" ${BENCH_SKIP:-} "
cc=${CC:-$(command -v gcc || command -v cc || echo gcc)}
python=${PYTHON:-python3}

die() { echo "bench: $*" >&2; exit 1; }
skipped() { [[ "$skip" == *" $1 "* ]]; }

[ -f "$libvgpu" ] || die "no interposer at $libvgpu (run make build, or set BENCH_LIBVGPU)"
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/vgpu-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Headers: the project's copy here, the toolkit's on the GPU machine.
inc=""
for d in "${CUDA_INCLUDE:-}" .deps/cuda/include "${CUDA_HOME:-/usr/local/cuda}/include" /usr/local/cuda/include /usr/include; do
    if [ -n "$d" ] && [ -f "$d/cuda.h" ]; then inc=$d; break; fi
done
[ -n "$inc" ] || die "no cuda.h found (run make deps, or set CUDA_INCLUDE)"
$cc -O2 -Wall -I"$inc" -o "$out/allocbench" tests/bench/allocbench.c -ldl
$cc -O2 -Wall -o "$out/startbench" tests/bench/startbench.c
$cc -shared -fPIC -o "$out/empty.so" -x c /dev/null
# The same empty object, but needing libpthread and libdl as a glibc-2.17 build of libvgpu.so does: shows
# how much of the library's start cost is loading those two objects.
$cc -shared -fPIC -o "$out/empty-deps.so" -x c /dev/null -Wl,--no-as-needed -lpthread -ldl

# Environment of each configuration. The fake driver keeps device-global state in a folder of its own.
common_env=()
case "$driver" in
    fake)
        fake=$(realpath -m "${BENCH_FAKE_DIR:-$root/target/fake}")
        [ -f "$fake/libcuda.so.1" ] || die "no fake driver at $fake (run make build)"
        common_env=(LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                    FAKE_CUDA_DEVICES=1x80Gi FAKE_CUDA_STATE_DIR="$work/fake")
        mkdir -p "$work/fake" ;;
    system) ;;
    *) die "BENCH_DRIVER must be fake or system, not '$driver'" ;;
esac
bare_env=(env -u LD_PRELOAD -u CUDA_DEVICE_MEMORY_LIMIT "${common_env[@]}")
vgpu_env=(env "${common_env[@]}" LD_PRELOAD="$libvgpu" CUDA_DEVICE_MEMORY_LIMIT="$limit"
          CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger")
nolimit_env=(env -u CUDA_DEVICE_MEMORY_LIMIT "${common_env[@]}" LD_PRELOAD="$libvgpu"
             CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger-nolimit")
# The launch under a compute share (the throttled path: the fake's kernels take no time, so every launch
# finds nothing in flight, one in eight is timed with two events, and nothing is held back).
sm_env=(env "${vgpu_env[@]:1}" CUDA_DEVICE_SM_LIMIT=50)
# The same under a 99% share with unmeasured launches allowed (VGPU_COMPUTE_METERED=0, opt-in): a loop well
# inside it goes unmeasured once the driver's figure of the process is read (`compute::Share::meter`: the bucket can absorb the whole GPU until the next reading is charged),
# and pays no event at all.
sm99_env=(env "${vgpu_env[@]:1}" CUDA_DEVICE_SM_LIMIT=99 VGPU_COMPUTE_METERED=0 CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger-sm99")
# The launch on an oversubscribed GPU (the time-quanta turn gate, issue 29): with no arbiter (the ledger's
# turn Unmanaged), and with the arbiter's Free written into the ledger (tests/e2e/lib/turn.py): one load of
# the mode byte per launch either way.
over_env=(env "${vgpu_env[@]:1}" CUDA_OVERSUBSCRIBE=true CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger-over")
free_env=(env "${vgpu_env[@]:1}" CUDA_OVERSUBSCRIBE=true CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ledger-free")

raw=$out/raw.jsonl
: >"$raw"
rm -f "$out/ledger.txt"
# run CONFIG ROUND CMD...: runs one measurement, tags its JSON line with the configuration and round.
run() {
    local config=$1 round=$2; shift 2
    local line
    if ! line=$("$@" 2>"$work/stderr"); then
        cat "$work/stderr" >&2
        die "failed: $config: ${*: -6}"
    fi
    printf '%s\n' "$line" | sed "s/^{/{\"config\":\"$config\",\"round\":$round,/" | tee -a "$raw" >/dev/null
}

echo "bench: driver=$driver libvgpu=$libvgpu rounds=$rounds (progress on stderr)" >&2
if ! skipped launch; then
    # The Free configuration's ledgers exist once a process opened them; then the arbiter's word goes in.
    "${free_env[@]}" "$out/allocbench" launch -n 1 -r 1 >/dev/null 2>"$work/stderr" || { cat "$work/stderr" >&2; die "failed: the Free ledger"; }
    for l in "$work"/ledger-free.*; do "$python" tests/e2e/lib/turn.py set "$l" free 1; done
fi
for part in pair meminfo launch; do
    skipped $part && continue
    n=$iters; [ $part = pair ] && n=$pair_iters
    for r in $(seq 1 "$rounds"); do
        echo "bench: $part round $r" >&2
        run bare "$r" "${bare_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
        run vgpu "$r" "${vgpu_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
        run vgpu-nolimit "$r" "${nolimit_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
        if [ $part = launch ]; then
            run vgpu-sm50 "$r" "${sm_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
            run vgpu-sm99 "$r" "${sm99_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
            run vgpu-over "$r" "${over_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
            run vgpu-over-free "$r" "${free_env[@]}" "$out/allocbench" $part -n "$n" -r "$reps" -s "$bytes"
        fi
    done
done

if ! skipped start; then
    for r in $(seq 1 "$rounds"); do
        echo "bench: process start round $r" >&2
        # the configurations interleaved spawn by spawn; startbench names each line's config
        "$out/startbench" -n "$start_runs" -c none= -c empty="$out/empty.so" -c vgpu="$libvgpu" \
            -c empty-deps="$out/empty-deps.so" -- /bin/true \
            | sed "s/^{/{\"round\":$r,/" >>"$raw" || die "failed: startbench"
    done
fi

if ! skipped procs; then
    for p in $procs; do
        for r in $(seq 1 "$rounds"); do
            echo "bench: $p processes round $r" >&2
            run bare "$r" "${bare_env[@]}" "$out/allocbench" procs -p "$p" -n "$proc_iters" -s "$bytes"
            run vgpu "$r" "${vgpu_env[@]}" "$out/allocbench" procs -p "$p" -n "$proc_iters" -s "$bytes"
        done
    done
fi

# The ledger's own cost, from its micro-benchmark (needs Rust: only where the project is built).
if ! skipped ledger && [ "$driver" = fake ] && [ -f ledger/examples/bench.rs ] && command -v cargo >/dev/null; then
    echo "bench: ledger micro-benchmark" >&2
    if cargo build -q --release -p vgpu-ledger --example bench 2>"$work/stderr"; then
        # JSON lines go into the table; any other output is kept verbatim beside it.
        "$root/target/release/examples/bench" >"$out/ledger.txt" 2>"$work/stderr" || cat "$work/stderr" >&2
        grep '^{' "$out/ledger.txt" | sed 's/^{/{"config":"ledger","round":1,/' >>"$raw" || true
    else
        cat "$work/stderr" >&2
        echo "bench: the ledger example did not build; its row is left out" >&2
    fi
fi

"$python" tests/bench/report.py "$raw" "$out/results.md" --driver "$driver" --ledger-text "$out/ledger.txt"
cat "$out/results.md"
