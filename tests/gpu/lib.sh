# Helpers the GPU scripts that sample memory stage by stage share (sourced, not run): the device's used
# memory and NVML's per-process list from nvidia-smi, a probe's output with both after each `stage=` line,
# and a probe run without the library and then under a 1 GiB and an 8 GiB quota.

# used: the device's used memory (MiB).
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
# procs: NVML's per-process figures, "pid, MiB;" each.
procs() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr '\n' ';'; }
# sampled CMD...: its lines, and the device's used memory and NVML's per-process list at each stage.
sampled() {
    "$@" 2>&1 | while IFS= read -r l; do
        echo "  $l"
        case $l in stage=*) echo "  device_used_mib=$(used) per_process=[$(procs)]";; esac
    done
}
# quota_stages PROBE LIB [LIB_BEFORE]: PROBE without the library, then under each library at 1 GiB and
# 8 GiB quotas (ledgers in $work), sampled.
quota_stages() {
    local probe=$1 L q; shift
    echo "== without the library (device used $(used) MiB before)"
    sampled "$probe"
    for L in "$@"; do
        for q in 1G 8G; do
            echo "== $L, quota $q"
            sampled env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_LIMIT=$q CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/c-$q-$RANDOM" \
                LIBCUDA_LOG_LEVEL=1 "$probe"
        done
    done
}

# unpack_container_tools: the container scripts' tools (tests/gpu/container.sh, share_wall.sh) from the
# carried .deps/gpu: Debian's runc and its libraries unpacked to /tmp/vgpu-debs and put on PATH and
# LD_LIBRARY_PATH (RUNC names runc), the glibc-2.28 host binaries copied to target/release.
unpack_container_tools() {
    DEBS=/tmp/vgpu-debs
    mkdir -p "$DEBS" target/release
    for d in .deps/gpu/*.deb; do dpkg -x "$d" "$DEBS"; done
    export PATH=$DEBS/usr/bin:$DEBS/usr/sbin:$PATH LD_LIBRARY_PATH=$DEBS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cp .deps/gpu/bin/* target/release/
    export RUNC=$DEBS/usr/sbin/runc
}
