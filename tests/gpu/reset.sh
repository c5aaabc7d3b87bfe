#!/usr/bin/env bash
# Issue 47 on a real GPU (reset_probe.cu): a program that resets its device between rounds, RUNS times
# (default 21) under a 4 GiB quota and a 50% share with VGPU_LIB (default target/vgpu/libvgpu.so), then
# BARE_RUNS times (default 5) bare and RUNS_BEFORE times (default 5; a run of the old library took
# minutes) with VGPU_LIB_BEFORE if set; each run stopped after 90 s (a hang). Per library: how many runs crashed (a signal) or failed, and the
# rounds' iteration time and launch cost, first round (before any reset) against the later ones. After
# each library's runs, the ledger's usage (0: no charge left behind). Run from the repository root.
set -u
root=$PWD
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
runs=${RUNS:-21}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nvcc -O2 -arch=sm_90 -o "$work/reset_probe" "$root/tests/gpu/reset_probe.cu" -lcuda || exit 1
ulimit -c 0
# summary NAME LOGS...: crashes, failures and the rounds' medians over the runs.
summary() {
    local name=$1; shift
    awk -v name="$name" '
        /^exit=/ { split($1, e, "="); n++; if (e[2] == 137) hung++; else if (e[2] >= 128) crash++; else if (e[2] != 0) fail++ }
        /^round=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                    k = (v["round"] == 0) ? "first" : "later"
                    it[k] += v["iter_ms"]; lu[k] += v["launch_us"]; c[k]++
                    if (!(v["primary"] in seen)) { seen[v["primary"]] = 1; handles++ } }
        END { printf "%s: runs=%d crashed=%d killed_after_90s=%d failed=%d", name, n, crash, hung, fail
              for (k in c) printf " %s_iter_ms=%.3f %s_launch_us=%.2f", k, it[k] / c[k], k, lu[k] / c[k]
              printf " primary_handles_seen=%d\n", handles }' "$@"
}
run_all() {
    local name=$1 n=$2; shift 2
    local log=$work/$name.log
    : >"$log"
    for i in $(seq "$n"); do
        timeout -s KILL 90 "$@" "$work/reset_probe" 5 20 >>"$log" 2>"$work/$name.$i.err"
        echo "exit=$?" >>"$log"
        grep -q . "$work/$name.$i.err" && sed "s/^/  [$name run $i] /" "$work/$name.$i.err" | head -3
    done
    summary "$name" "$log"
}
n=0
for L in "$lib" ${VGPU_LIB_BEFORE:+"$(realpath -m "$VGPU_LIB_BEFORE")"}; do
    n=$((n + 1))
    cache=$work/c$n
    [ "$n" = 1 ] || runs=${RUNS_BEFORE:-5}
    run_all "lib$n" "$runs" env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT=4G CUDA_DEVICE_SM_LIMIT=50 \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$cache"
    echo "  lib$n = $L"
    python3 - "$cache" <<'PY'
import glob, struct, sys
for f in sorted(glob.glob(sys.argv[1] + ".GPU-*")):
    t = struct.unpack_from("<qQQQQ", open(f, "rb").read(), 192)
    print("  bucket charged_ms=%.1f held_ms=%.1f launches=%d" % (t[2] / 1e6, t[3] / 1e6, t[4]))
PY
    # What the container holds once every run exited: the quota's view through NVML (0 MiB: nothing
    # left charged).
    echo "  after the runs, quota view used,total: $(env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT=4G \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$cache" nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | head -1)"
    [ "$n" = 1 ] && run_all bare "${BARE_RUNS:-5}" env
done
