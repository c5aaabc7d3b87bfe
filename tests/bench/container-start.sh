#!/usr/bin/env bash
# What vgpu adds to starting a container: the median wall time of `runc run` of a trivial container
# (a dynamically linked `true`), plain runc against the same through vgpu-container-runtime without a quota
# (pass-through) and with a quota (spec edit, NVML lookup, state provisioning, createRuntime and poststop
# hooks, the bind mounts). Fake NVML; runs as root. Prints one table.
#   BENCH_RUNS    runs per configuration (default 60), after 5 warm-up runs
#   BENCH_OUT     folder for hyperfine's JSON (default target/bench)
set -euo pipefail
. "$(dirname "$0")/../e2e/lib/common.sh"
. "$(dirname "$0")/../e2e/lib/rootfs.sh"
. "$(dirname "$0")/../e2e/lib/bundle.sh"
. "$(dirname "$0")/../e2e/lib/vgpu.sh"
runs=${BENCH_RUNS:-60}
out=$(realpath -m "${BENCH_OUT:-$REPO/target/bench}")
mkdir -p "$out"
t_init bench-start
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$FAKE_DIR/libnvidia-ml.so.1"
command -v hyperfine >/dev/null || { echo "container-start: hyperfine missing (tests/setup/deps.sh installs it)"; exit 1; }

rootfs_busybox "$WORK/rootfs"
rootfs_add_libs "$WORK/rootfs" /bin/true "$LIBVGPU" "$T/vgpu/libvgpu_core.so"
cp /bin/true "$WORK/rootfs/bin/true-dyn"
# The state root on tmpfs, as /run/vgpu is on a node (on a disk, the fsync of limits.json alone costs ms).
STATE_TMPFS=$WORK/state-tmpfs
mkdir -p "$STATE_TMPFS"
mount -t tmpfs -o size=64m,mode=711 vgpu-bench "$STATE_TMPFS"
on_exit "umount '$STATE_TMPFS'"
vgpu_config state_root="\"$STATE_TMPFS\""
STATE=$STATE_TMPFS
mk() { # mk NAME [ENV...]
    local b=$WORK/$1; shift
    bundle_new "$b" "$WORK/rootfs" /bin/true-dyn
    bundle_jq "$b" 'del(.linux.namespaces[] | select(.type == "network"))'
    [ $# -gt 0 ] && bundle_env "$b" "$@"
    return 0
}
mk plain
mk passthrough NVIDIA_VISIBLE_DEVICES=0
mk quota NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
R=$WORK/rt
hyperfine -N --warmup 5 --runs "$runs" --export-json "$out/container-start.json" --style none \
    -n "runc" "runc --root $R run --bundle $WORK/plain bench-plain" \
    -n "shim, no quota" "$SHIM --root $R run --bundle $WORK/passthrough bench-pass" \
    -n "shim, quota 1G" "$SHIM --root $R run --bundle $WORK/quota bench-quota" >/dev/null
[ -z "$(state_left)" ] || { echo "container-start: state left behind: $(state_left)"; exit 1; }
echo "container start, median of $runs runs each ($(nproc) CPUs, $(runc --version | head -1)):"
jq -r '.results as $r | ($r[0].median) as $base | $r[] |
    "  \(.command | . + " " * (16 - length)) \(.median * 1000 * 100 | round / 100) ms   (+\((.median - $base) * 1000 * 100 | round / 100) ms over runc; min \(.min * 1000 * 100 | round / 100) ms)"' \
    "$out/container-start.json"
