#!/usr/bin/env bash
# The soak (issue 47; docs/soak.md): tests/soak/soak.c, a seeded random mix of contexts created, reset and
# destroyed, primary retains and releases, fork, threads, streams, events, graphs, pools, VMM, allocations and
# launches, run SOAK_RUNS times under libvgpu.so across the modes, SOAK_PAR runs at a time per mode sharing
# one ledger (and, on the fake driver, one fake GPU). A run fails when it exits non-zero (a CUDA error, a
# charge its own slot kept with nothing held, a fork child that died), is killed by a signal (a crash: its
# core's backtrace is kept when gdb is there), or outlives SOAK_TIMEOUT (a hang). After each mode, once every
# process has exited, its ledger must hold nothing (tests/soak/ledger.py); and a process started every 20 ms
# meanwhile to read NVML's memory figures through the library (nvidia-smi's part) must never fail. Prints a
# table and the closing line "soak: N passed, N failed" (runs; a mode whose ledger kept a charge, or whose
# watcher failed, counts as one failure more).
#
#   bash tests/soak/run.sh                      SOAK_RUNS runs (default 1000), spread evenly over the modes
#   bash tests/soak/run.sh replay MODE SEED     one run of SEED in MODE, alone, each step on stderr
#
# Environment: SOAK_RUNS (1000), SOAK_MODES ("quota share spill oversub tight"; tight: a quota the four
# processes fill, so that every kind of allocation, contexts and modules included, meets out-of-memory;
# also "bare": no library, the program alone), SOAK_PAR (4 runs at a time), SOAK_STEPS (100 steps a run),
# SOAK_SEED0 (first seed, 1: run i of the whole soak has seed SOAK_SEED0+i), SOAK_TIMEOUT (60 s a run),
# SOAK_QUOTA (1g; real driver 4g), SOAK_SHARE (50), SOAK_SPILL (2g), SOAK_TIGHT (512m; real driver 3g),
# SOAK_KERNEL_US (the fake's kernel time, 200; on a GPU soak.c's spin, 50), OUT (results: summary.tsv,
# lib-lines.txt, failures/; default target/soak/results), KEEP_WORK=1 (keep the per-run folders of passing
# runs too), VGPU_LIB (the interposer, default target/vgpu/libvgpu.so).
# SOAK_DRIVER=real: the machine's own driver instead of the fake (tests/gpu/soak.sh): soak.c built with nvcc
# (else gcc) against CUDA_HOME (/usr/local/cuda).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
T=$(realpath -m "${CARGO_TARGET_DIR:-$ROOT/target}")
DRIVER=${SOAK_DRIVER:-fake}
LIB=$(realpath -m "${VGPU_LIB:-$T/vgpu/libvgpu.so}")
FAKE=$T/fake
BIN_DIR=$T/soak$([ "$DRIVER" = real ] && echo -gpu)
BIN=$BIN_DIR/soak
RUNS=${SOAK_RUNS:-1000}
MODES=(${SOAK_MODES:-quota share spill oversub tight})
PAR=${SOAK_PAR:-4}
STEPS=${SOAK_STEPS:-100}
SEED0=${SOAK_SEED0:-1}
TO=${SOAK_TIMEOUT:-60}
QUOTA=${SOAK_QUOTA:-$([ "$DRIVER" = real ] && echo 4g || echo 1g)}
SHARE=${SOAK_SHARE:-50}
SPILL=${SOAK_SPILL:-2g}
TIGHT=${SOAK_TIGHT:-$([ "$DRIVER" = real ] && echo 3g || echo 512m)}
OUT=$(realpath -m "${OUT:-$T/soak/results}")

need=("$LIB" "$(dirname "$LIB")/libvgpu_core.so")
[ "$DRIVER" = fake ] && need+=("$FAKE/libcuda.so.1" "$FAKE/libnvidia-ml.so.1")
for f in "${need[@]}"; do
    [ -e "$f" ] || { echo "soak: $f missing (run make build)"; echo "soak: 0 passed, 1 failed"; exit 1; }
done
mkdir -p "$BIN_DIR"
cflags=(-O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-deprecated-declarations -std=gnu11)
if [ "$DRIVER" = fake ]; then
    gcc "${cflags[@]}" -I"$ROOT/.deps/cuda/include" tests/soak/soak.c -o "$BIN" -L"$FAKE" -lcuda -ldl -lpthread
else
    cuda_home=${CUDA_HOME:-/usr/local/cuda}
    nvcc=$(command -v nvcc || echo "$cuda_home/bin/nvcc")
    if ! { [ -x "$nvcc" ] && "$nvcc" -O2 -g -o "$BIN" tests/soak/soak.c -lcuda -ldl -lpthread; }; then
        echo "soak: nvcc unavailable or failed; building with gcc" >&2
        gcc "${cflags[@]}" -I"$cuda_home/include" tests/soak/soak.c -o "$BIN" -L"$cuda_home/lib64/stubs" \
            -L"$cuda_home/lib64" -lcuda -ldl -lpthread
    fi
fi
[ -x "$BIN" ] || { echo "soak: could not build tests/soak/soak.c"; echo "soak: 0 passed, 1 failed"; exit 1; }

# mode_env MODE: the library's settings of a mode (environment mode: quota, share, memory mode).
mode_env() {
    case $1 in
        bare) echo "SOAK_LEAK_CHECK=0" ;;
        quota) echo "CUDA_DEVICE_MEMORY_LIMIT=$QUOTA" ;;
        tight) echo "CUDA_DEVICE_MEMORY_LIMIT=$TIGHT" ;;
        share) echo "CUDA_DEVICE_MEMORY_LIMIT=$QUOTA CUDA_DEVICE_SM_LIMIT=$SHARE" ;;
        spill) echo "CUDA_DEVICE_MEMORY_LIMIT=$QUOTA VGPU_MEMORY_MODE=spill VGPU_MEMORY_SPILL=$SPILL" ;;
        oversub) echo "CUDA_DEVICE_MEMORY_LIMIT=$QUOTA VGPU_MEMORY_MODE=oversubscribe VGPU_MEMORY_RESERVE=256m" ;;
        *) echo "soak: unknown mode $1 (quota, share, spill, oversub, tight, bare)" >&2; return 1 ;;
    esac
}

# run_env MODE DIR: the whole environment of a run of MODE whose ledger (and fake GPU) live under DIR.
run_env() {
    # SOAK_PRELOAD_EXTRA: one more object preloaded after the library (tests/gpu/segv_trace.c's backtraces).
    [ "$1" = bare ] || echo "LD_PRELOAD=$LIB${SOAK_PRELOAD_EXTRA:+:$SOAK_PRELOAD_EXTRA}"
    if [ "$DRIVER" = fake ]; then
        echo "LD_LIBRARY_PATH=$FAKE FAKE_CUDA_STATE_DIR=$2/fake FAKE_CUDA_DEVICES=1"
        # An event used after its context died aborts the process, where the real driver reads freed memory
        # (tests/fake-driver.md): every such use is a crash here, never a silent error.
        echo "FAKE_CUDA_CONTEXT_BYTES=64m FAKE_CUDA_KERNEL_US=${SOAK_KERNEL_US:-200} FAKE_CUDA_DEAD_HANDLES=abort"
        # The share's processes take turns on the fake GPU in time slices (2 ms), as on a real one.
        [ "$1" = share ] && echo "FAKE_CUDA_TIMESLICE_US=${SOAK_TIMESLICE_US:-2000}"
    else
        echo "SOAK_REAL_DRIVER=1"
    fi
    echo "CUDA_DEVICE_MEMORY_SHARED_CACHE=$2/ledger/cache SOAK_STEPS=$STEPS"
    mode_env "$1"
}

if [ "${1:-}" = replay ]; then
    mode=${2:?usage: run.sh replay MODE SEED}; seed=${3:?usage: run.sh replay MODE SEED}
    D=$(mktemp -d /tmp/vgpu-soak-replay.XXXXXX)
    mkdir -p "$D/fake" "$D/ledger"
    echo "soak replay: mode $mode seed $seed in $D ($(mode_env "$mode"))"
    # shellcheck disable=SC2046
    env $(run_env "$mode" "$D") SOAK_VERBOSE="${SOAK_VERBOSE:-1}" "$BIN" "$seed"
    rc=$?
    ls "$D"/ledger/cache.* >/dev/null 2>&1 && python3 tests/soak/ledger.py "$D"/ledger/cache.*
    echo "soak replay: exit $rc (folder $D)"
    exit $rc
fi

replay="bash tests/soak/run.sh replay"
[ "$DRIVER" = real ] && replay="SOAK_DRIVER=real bash tests/soak/run.sh replay"
W=$(mktemp -d /tmp/vgpu-soak.XXXXXX)
[ "${KEEP_WORK:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT/failures"
rm -rf "$OUT/failures"/* "$OUT/summary.tsv" "$OUT/lib-lines.txt"
printf 'mode\truns\tpassed\tfailed\tcrashes\thangs\terrors\tleaks\tleft_behind\tlib_errors\tlib_warns\toom\twall_s\tmax_run_s\twatcher_runs/failed\n' >"$OUT/summary.tsv"
ulimit -c unlimited 2>/dev/null || true

ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# one MODE DIR SEED: one run in its own folder (its core file lands there); writes rc, out, err, ms.
one() {
    local mode=$1 dir=$2 seed=$3 r=$2/runs/$3 t0 rc
    mkdir -p "$r"
    t0=$(ms)
    # shellcheck disable=SC2046
    (cd "$r" && exec env $(run_env "$mode" "$dir") timeout -k 5 "$TO" "$BIN" "$seed" >out 2>err)
    rc=$?
    echo "$rc" >"$r/rc"
    echo $(($(ms) - t0)) >"$r/ms"
}

# The watcher: what `nvidia-smi` in the container does while the programs run, a process that starts, reads
# NVML's memory figures (the ledger, under the library) and exits, every 20 ms through a mode. A crash
# (a signal: a SIGBUS is a mapping read past its file's end), a hang or an error there fails the mode.
WATCHER=()
if [ "$DRIVER" = fake ] && [ -x "$T/clients/nvml_client" ]; then WATCHER=("$T/clients/nvml_client")
elif [ "$DRIVER" = real ] && command -v nvidia-smi >/dev/null; then WATCHER=(nvidia-smi --query-gpu=memory.used,memory.total --format=csv)
fi
watch() {
    local mode=$1 dir=$2 n=0 bad=0 rc
    mkdir -p "$dir/watch"
    while [ ! -e "$dir/watch/stop" ]; do
        # shellcheck disable=SC2046
        (cd "$dir/watch" && ulimit -c unlimited && exec env $(run_env "$mode" "$dir") timeout -k 5 20 "${WATCHER[@]}" >/dev/null 2>>"$dir/watch/err")
        rc=$?
        n=$((n + 1))
        if ((rc != 0)); then bad=$((bad + 1)); echo "exit $rc" >>"$dir/watch/bad"; fi
        sleep 0.02
    done
    echo "$n $bad" >"$dir/watch/count"
}

total_pass=0; total_fail=0; failures=()
per_mode=$(( (RUNS + ${#MODES[@]} - 1) / ${#MODES[@]} ))
idx=0
for mode in "${MODES[@]}"; do
    mode_env "$mode" >/dev/null || exit 2
    D=$W/$mode
    mkdir -p "$D/fake" "$D/ledger" "$D/runs"
    n=$per_mode; left=$((RUNS - idx)); ((n > left)) && n=$left
    ((n <= 0)) && continue
    echo "== $mode: $n runs, $PAR at a time ($(mode_env "$mode"))"
    t0=$(ms)
    wpid=
    if ((${#WATCHER[@]})); then watch "$mode" "$D" & wpid=$!; disown "$wpid"; fi
    seeds=()
    for ((i = 0; i < n; i++)); do
        seed=$((SEED0 + idx + i))
        seeds+=("$seed")
        while (($(jobs -rp | wc -l) >= PAR)); do wait -n; done
        one "$mode" "$D" "$seed" &
    done
    wait
    idx=$((idx + n))
    wall=$(($(ms) - t0))
    watched=-
    if [ -n "$wpid" ]; then
        touch "$D/watch/stop"
        while kill -0 "$wpid" 2>/dev/null; do sleep 0.05; done
        read -r wn wbad <"$D/watch/count"
        watched="$wn/$wbad"
    fi
    pass=0 crash=0 hang=0 err=0 leak=0 liberr=0 libwarn=0 oom=0 maxs=0
    for seed in "${seeds[@]}"; do
        r=$D/runs/$seed
        rc=$(cat "$r/rc" 2>/dev/null || echo 255)
        s=$(cat "$r/ms" 2>/dev/null || echo 0)
        ((s > maxs)) && maxs=$s
        s=$(secs "$s")
        o=$(sed -n 's/.* oom=\([0-9]*\) ok$/\1/p' "$r/out" 2>/dev/null)
        oom=$((oom + ${o:-0}))
        nerr=$(grep -c '^\[vgpu ERROR' "$r/err" 2>/dev/null); nerr=${nerr:-0}
        liberr=$((liberr + nerr))
        nwarn=$(grep -c '^\[vgpu WARN' "$r/err" 2>/dev/null); nwarn=${nwarn:-0}
        libwarn=$((libwarn + nwarn))
        # the library's lines, without pids and numbers, for the record (lib-lines.txt)
        grep '^\[vgpu ' "$r/err" 2>/dev/null | sed "s/^\[vgpu \([A-Z]*\) pid [0-9]*\]/$mode \1/; s/[0-9][0-9]*/N/g" >>"$D/lines"
        ls "$r"/core* >/dev/null 2>&1 && cores=1 || cores=0
        if [ "$rc" = 0 ] && [ "$cores" = 0 ]; then
            pass=$((pass + 1))
            [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$r"
            continue
        fi
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then kind=hang; hang=$((hang + 1))
        elif ((rc > 128)) || [ "$cores" = 1 ]; then kind="crash"; crash=$((crash + 1))
        elif [ "$rc" = 4 ]; then kind=leak; leak=$((leak + 1))
        else kind=error; err=$((err + 1))
        fi
        sig=""
        ((rc > 128 && rc != 137)) && sig=" signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null))"
        f=$OUT/failures/$mode-$seed
        mkdir -p "$f"
        cp "$r"/{out,err,rc,ms} "$f/" 2>/dev/null
        for c in "$r"/core*; do
            [ -e "$c" ] || continue
            gdb -batch -ex "info signals SIGBUS" -ex bt -ex "thread apply all bt" "$BIN" "$c" >"$f/$(basename "$c").bt" 2>&1
            sig="$sig, core $(basename "$c")"
        done
        echo "$kind mode=$mode seed=$seed exit=$rc$sig (${s}s); replay: $replay $mode $seed" | tee "$f/what"
        tail -5 "$r/err" | sed 's/^/    | /'
        for c in "$f"/*.bt; do [ -e "$c" ] && grep -m6 '^#' "$c" | sed 's/^/    bt | /'; done
        failures+=("$kind $mode seed=$seed exit=$rc$sig")
    done
    fail=$((n - pass))
    if [ -n "$wpid" ] && ((wbad > 0)); then
        fail=$((fail + 1))
        f=$OUT/failures/$mode-watcher
        mkdir -p "$f"
        cp "$D/watch/bad" "$D/watch/err" "$f/" 2>/dev/null
        for c in "$D"/watch/core*; do
            [ -e "$c" ] && gdb -batch -ex bt -ex "thread apply all bt" "${WATCHER[0]}" "$c" >"$f/$(basename "$c").bt" 2>&1
        done
        echo "watcher mode=$mode: $wbad of $wn reads of NVML's figures failed ($(sort "$D/watch/bad" | uniq -c | tr -s ' ' | tr '\n' ';'))" | tee "$f/what"
        tail -3 "$D/watch/err" | sed 's/^/    | /'
        failures+=("watcher $mode: $wbad of $wn failed")
    fi
    # After every process of the mode has exited: nothing left in its ledger.
    left="0"
    if ls "$D"/ledger/cache.* >/dev/null 2>&1; then
        lout=$(python3 tests/soak/ledger.py "$D"/ledger/cache.*)
        lrc=$?
        echo "$lout" | sed 's/^/  /'
        if ((lrc != 0)); then
            left=$(echo "$lout" | sed -n 's/.* total=\([0-9]*\).*/\1/p' | head -1)
            left=${left:-?}
            fail=$((fail + 1))
            failures+=("left-behind mode=$mode: $lout")
        fi
    else
        echo "  (no ledger file for $mode)"
    fi
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    [ -s "$D/lines" ] && sort "$D/lines" | uniq -c | sort -rn >>"$OUT/lib-lines.txt"
    printf '%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n' "$mode" "$n" "$pass" "$((n - pass))" "$crash" "$hang" \
        "$err" "$leak" "$left" "$liberr" "$libwarn" "$oom" "$(secs "$wall")" "$(secs "$maxs")" "$watched" >>"$OUT/summary.tsv"
done

echo
{ column -t -s $'\t' "$OUT/summary.tsv" 2>/dev/null || cat "$OUT/summary.tsv"; }
if [ -s "$OUT/lib-lines.txt" ]; then
    echo "the library's lines on stderr (count, mode, level, text with numbers as N; all in lib-lines.txt):"
    head -12 "$OUT/lib-lines.txt" | cut -c1-220
fi
((${#failures[@]})) && printf 'FAILED: %s\n' "${failures[@]}"
echo "(results in $OUT)"
echo "soak: $total_pass passed, $total_fail failed"
((total_fail == 0))
