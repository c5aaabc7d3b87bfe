#!/usr/bin/env bash
# vgpu's library under HAMi's scheduler and device plugin, unchanged (issue 45 item 1): a real runc
# container given exactly what HAMi's device plugin answers at Allocate, with the library vgpu builds
# (target/vgpu/libvgpu.so) where HAMi mounts HAMi-core's, on the fake GPU (16 GiB).
#
# HAMi's answer, read from its source (github.com/Project-HAMi/HAMi at 4707fb02, 2026-08-21,
# pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go, Allocate, non-MIG mode; hostHookPath is the
# chart's global.gpuHookPath, /usr/local, given to the plugin as HOOK_PATH):
#   env  CUDA_DEVICE_MEMORY_LIMIT_<i>=<Usedmem>m        one per device of the container, i = 0, 1, ...
#        CUDA_DEVICE_SM_LIMIT=<Usedcores of device 0>
#        CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<random uuid>.cache
#        CUDA_OVERSUBSCRIBE=true                         only when deviceMemoryScaling > 1
#        LIBCUDA_LOG_LEVEL=<scheduler log level>          only when set
#        GPU_CORE_UTILIZATION_POLICY=disable              only when core limits are disabled
#        NVIDIA_VISIBLE_DEVICES=<the GPUs' UUIDs>         (getAllocateResponse, env-var device list strategy)
#   mounts /usr/local/vgpu/libvgpu.so  <- host /usr/local/vgpu/libvgpu.so(.<version>)   ro (GetLibPath)
#          /usr/local/vgpu             <- host /usr/local/vgpu/containers/<podUID>_<ctr> rw (RemoveAll, then
#                                         MkdirAll and Chmod 0777 at every Allocate)
#          /tmp/vgpulock               <- host /tmp/vgpulock (0777)                       rw
#          /etc/ld.so.preload          <- host /usr/local/vgpu/ld.so.preload              ro, unless the
#                                         container's env sets CUDA_DISABLE_CONTROL to a true value
#                                         (strconv.ParseBool: 1, t, T, TRUE, true, True)
#   (and /tmp/license, /usr/bin/vgpuvalidator only where the host has /usr/local/vgpu/license: not here).
# HAMi's docker/vgpu-init.sh writes the host's ld.so.preload as "/usr/local/vgpu/libvgpu.so".
#
# Which file goes where HAMi-core's was: libvgpu-single.so (`make libvgpu`), the preload front carrying its
# engine. vgpu's libvgpu.so is a front that loads its engine, libvgpu_core.so, from the folder it was loaded
# from (libvgpu/preload/src/sys.rs, sibling_path of dladdr's dli_fname); under HAMi's mounts that folder,
# /usr/local/vgpu, is the per-container folder, which holds no engine. libvgpu-single.so loads the engine it
# carries from a memfd instead (docs/engines/hami.md). The plain front there refuses CUDA with one line
# (never run unlimited): the suite's first case.
#
# The node's tools find those containers from HAMi's per-container folders (`[monitor] hami_containers_dir`):
# `vgpuctl monitor`'s metrics and `vgpuctl status` show the containers that ran (and the one running) with
# their pod UID, container name, the quota and usage their ledgers hold and NVML's truth, and a link and an
# oversized file the tenant left beside its ledger are skipped with one line each.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/monitor.sh"
t_init hami-compat
VGPUCTL=$T/release/vgpuctl
SINGLE=$T/vgpu/libvgpu-single.so
# The engine only for the libraries it needs (libpthread, libdl, ...): the rootfs gets them, as a real
# image's glibc has them; it lands in the rootfs's library folder, never beside the mounted front.
CORE=$T/vgpu/libvgpu_core.so
t_require "$LIBVGPU" "$SINGLE" "$CORE" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR/rt_client" \
    "$VGPUCTL" "$(command -v curl)"
command -v runc > /dev/null || { echo "hami-compat: runc is not installed"; exit 1; }
GIB=1073741824
MIB=1048576
GPU0=GPU-fa4ec0de-0000-4000-8000-000000000000

ROOTFS=$WORK/rootfs
rootfs_busybox "$ROOTFS"
rootfs_add_libs "$ROOTFS" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR"/* "$SINGLE" "$CORE"
mkdir -p "$ROOTFS/usr/local/vgpu"
FAKESTATE=$WORK/fakestate
mkdir -p "$FAKESTATE" "$WORK/rt"
# The node as HAMi's device plugin leaves it: its hook path (HOOK_PATH=/usr/local, here under $WORK), the
# library HAMi-core's image would have copied there (vgpu's single-file build instead), the preload file
# vgpu-init.sh writes.
HOSTHOOK=$WORK/host/usr/local/vgpu
VGPULOCK=$WORK/host/tmp/vgpulock
mkdir -p "$HOSTHOOK/containers"
cp "$SINGLE" "$HOSTHOOK/libvgpu.so"
echo /usr/local/vgpu/libvgpu.so > "$HOSTHOOK/ld.so.preload"
on_exit 'for id in $(runc --root "$WORK/rt" list -q 2>/dev/null); do runc --root "$WORK/rt" delete -f "$id"; done'

N=0
# hami_allocate POD CTR MEM_MIB CORES [CONTAINER_ENV...]: a bundle running CMD (set in $CMD) with exactly
# HAMi's Allocate answer for one device of MEM_MIB and CORES; the container's own env (its pod spec) after.
# Sets $B, $ID and $CDIR (the per-container host folder).
hami_allocate() {
    local pod=$1 ctr=$2 mem=$3 cores=$4; shift 4
    N=$((N + 1)); ID=hami-$N; B=$WORK/b$N
    CDIR=$HOSTHOOK/containers/${pod}_$ctr
    rm -rf "$CDIR"; mkdir -p "$CDIR"; chmod 0777 "$CDIR"
    mkdir -p "$VGPULOCK"; chmod 0777 "$VGPULOCK"
    bundle_new "$B" "$ROOTFS" "${CMD[@]}"
    bundle_jq "$B" '.mounts += [{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","nodev","mode=1777"]}]'
    bundle_bind "$B" "$FAKE_DIR" /opt/fake ro
    bundle_bind "$B" "$CLIENTS_DIR" /opt/clients ro
    bundle_bind "$B" "$FAKESTATE" /fakestate
    bundle_env "$B" LD_LIBRARY_PATH=/opt/fake FAKE_CUDA_STATE_DIR=/fakestate PATH=/opt/clients:/bin
    bundle_env "$B" "CUDA_DEVICE_MEMORY_LIMIT_0=${mem}m" "CUDA_DEVICE_SM_LIMIT=$cores" \
        "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/$(cat /proc/sys/kernel/random/uuid).cache" \
        "NVIDIA_VISIBLE_DEVICES=$GPU0" "$@"
    # HAMi lists the library's file before the folder; containerd's CRI sorts a container's mounts by path
    # depth (its WithMounts: "high level mounts don't shadow other mounts"), so runc mounts the folder first.
    bundle_bind "$B" "$CDIR" /usr/local/vgpu
    bundle_bind "$B" "$HOSTHOOK/libvgpu.so" /usr/local/vgpu/libvgpu.so ro
    bundle_bind "$B" "$VGPULOCK" /tmp/vgpulock
    local kv disable=false
    for kv in "$@"; do
        case ${kv#CUDA_DISABLE_CONTROL=} in
            1 | t | T | TRUE | true | True) [ "${kv%%=*}" = CUDA_DISABLE_CONTROL ] && disable=true ;;
        esac
    done
    [ "$disable" = true ] || bundle_bind "$B" "$HOSTHOOK/ld.so.preload" /etc/ld.so.preload ro
}
run_it() { runc --root "$WORK/rt" run --bundle "$B" "$ID" < /dev/null 2>&1; }

echo "-- the plain front where HAMi-core's was: its engine is not beside it"
CMD=(rt_client device 0 info fill 64Mi)
hami_allocate 7c0e3d1a-0000-4000-8000-000000000001 main 1024 0
bundle_bind "$B" "$LIBVGPU" /usr/local/vgpu/libvgpu.so ro
out=$(run_it)
check_match "never unlimited: CUDA is refused with one line naming the missing engine" \
    'vgpu: cannot load the quota engine /usr/local/vgpu/libvgpu_core.so' "$out"
check_not "  ... and no allocation got through" grep -q 'op=fill .*bytes=[1-9]' <<< "$out"

echo "-- exactly HAMi's answer, libvgpu-single.so where HAMi-core's was"
hami_allocate 7c0e3d1a-0000-4000-8000-000000000002 main 1024 0
out=$(run_it)
check_eq "the container sees HAMi's CUDA_DEVICE_MEMORY_LIMIT_0=1024m as the GPU's size" "$(field total "$out")" "$GIB"
check_eq "cuDeviceTotalMem = 1 GiB" "$(field devtotal "$out")" "$GIB"
check_match "an allocation past it is refused with out-of-memory" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
bytes=$(field bytes "$out")
check "  ... after at most the 1 GiB HAMi's scheduler counted (${bytes:-?} bytes)" test "${bytes:-$((2 * GIB))}" -le "$GIB"
check "  ... with no engine file in the container's folder (the one the library carries)" test ! -e "$CDIR/libvgpu_core.so"
ledger=$(ls "$CDIR"/*.cache.$GPU0 2>/dev/null | head -1)
check "the ledger is <CUDA_DEVICE_MEMORY_SHARED_CACHE>.<GPU uuid> in HAMi's per-container host folder" test -f "$ledger"
check_eq "  ... created mode 0600 by the container's process" "$(stat -c %a "$ledger" 2>/dev/null)" 600

echo "-- a non-root container user under HAMi's 0777 folder"
hami_allocate 7c0e3d1a-0000-4000-8000-000000000003 main 1024 0
bundle_jq "$B" '.process.user = {"uid": 65534, "gid": 65534}'
out=$(run_it)
check_eq "uid 65534 sees the 1 GiB too" "$(field total "$out")" "$GIB"
check_match "  ... and is refused past it" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"

echo "-- the compute share HAMi's scheduler counted (CUDA_DEVICE_SM_LIMIT)"
SECS=2 KUS=2000
CMD=(rt_client module work $SECS)
share_of() {
    local l s
    l=$(field launched "$1"); s=$(field seconds "$1")
    [ -n "$l" ] && [ -n "$s" ] || { echo -1; return; }
    awk -v l="$l" -v s="$s" -v us="$KUS" 'BEGIN { printf "%d", l * us / 1e4 / s }'
}
between() { if [ "$2" -ge "$3" ] && [ "$2" -le "$4" ]; then pass "$1 ($2%)"; else fail "$1: $2% not in [$3, $4]"; fi; }
hami_allocate 7c0e3d1a-0000-4000-8000-000000000004 main 4096 30 FAKE_CUDA_KERNEL_US=$KUS
out=$(run_it)
between "a saturating launch loop at CUDA_DEVICE_SM_LIMIT=30 gets about 30% of the fake GPU" "$(share_of "$out")" 15 45
hami_allocate 7c0e3d1a-0000-4000-8000-000000000005 main 4096 30 FAKE_CUDA_KERNEL_US=$KUS GPU_CORE_UTILIZATION_POLICY=disable
out=$(run_it)
between "GPU_CORE_UTILIZATION_POLICY=disable (HAMi's core limits off): not held back" "$(share_of "$out")" 70 100

echo "-- CUDA_DISABLE_CONTROL=true: HAMi mounts no /etc/ld.so.preload, so nothing is enforced (as HAMi intends)"
CMD=(rt_client device 0 info fill 64Mi)
hami_allocate 7c0e3d1a-0000-4000-8000-000000000006 main 1024 0 CUDA_DISABLE_CONTROL=true
check_not "the answer has no /etc/ld.so.preload mount" jq -e '.mounts | any(.destination == "/etc/ld.so.preload")' "$B/config.json"
out=$(run_it)
check_eq "the container sees the whole 16 GiB GPU" "$(field total "$out")" $((16 * GIB))
bytes=$(field bytes "$out")
check "  ... and allocates past HAMi's 1024m (${bytes:-?} bytes)" test "${bytes:-0}" -gt "$GIB"
hami_allocate 7c0e3d1a-0000-4000-8000-000000000007 main 1024 0 CUDA_DISABLE_CONTROL=false
out=$(run_it)
check_eq "CUDA_DISABLE_CONTROL=false keeps the preload and the quota" "$(field total "$out")" "$GIB"

echo "-- vgpuctl monitor and vgpuctl status find HAMi's containers in HAMi's per-container folders"
# The node's config: an empty state root (no container of vgpu's runtime), the fake NVML, and HAMi's
# containers folder under this suite's hook path.
vgpu_config
# containerd's task folder, empty: runc alone keeps no bundle where containerd's shim would
# (hami-enforce.test.sh enforces from those).
mkdir -p "$WORK/tasks"
printf '[monitor]\nhami_containers_dir = "%s"\nhami_task_dir = "%s"\n' "$HOSTHOOK/containers" "$WORK/tasks" >>"$WORK/config.toml"
POD=7c0e3d1a-0000-4000-8000-000000000008
# The tenant leaves, where its ledger is, a link to the host's /etc/shadow and a 64 MiB file, both named as
# ledgers are, then holds 300 MiB. Its cgroup as a kubelet's cgroupfs driver names a pod's.
CMD=(sh -c "ln -s /etc/shadow /usr/local/vgpu/evil.cache.$GPU0 && head -c 67108864 /dev/zero >/usr/local/vgpu/big.cache.$GPU0 && exec rt_client device 0 '!alloc' 300Mi sleep 60")
hami_allocate "$POD" main 1024 0
bundle_jq "$B" '.linux.cgroupsPath = $c' --arg c "/kubepods/besteffort/pod$POD/$ID"
HCDIR=$CDIR
runc --root "$WORK/rt" run --bundle "$B" "$ID" </dev/null >"$WORK/h.out" 2>&1 &
check "a container HAMi allocated holds 300 MiB" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/h.out"
monitor_start hmon && pass "the monitor starts with [monitor] hami_containers_dir" || fail "the monitor starts with [monitor] hami_containers_dir"
check_match "  ... and says where it looks" "HAMi's folders $HOSTHOOK/containers\$" "$(head -1 "$WORK/hmon.log")"
LH="namespace=\"\",pod=\"$POD\",container=\"main\",container_id=\"hami/${POD}_main\",vdevice_index=\"0\",device_uuid=\"$GPU0\""
# The context is charged as measured (256 MiB on the fake GPU), then 300 MiB of data.
check_eq "vgpu_memory_used_bytes of pod $POD, container main = 556 MiB (its ledger)" \
    "$(series vgpu_memory_used_bytes "$LH")" $((556 * MIB))
check_eq "vgpu_memory_limit_bytes = HAMi's 1024m, as its library recorded it" "$(series vgpu_memory_limit_bytes "$LH")" "$GIB"
check_eq "usage by kind: data 300 MiB" "$(series vgpu_memory_used_by_kind_bytes "$LH.*kind=\"data\"")" $((300 * MIB))
check_eq "one process holds a slot" "$(series vgpu_ledger_processes "$LH")" 1
check_eq "NVML's truth: its process's 556 MiB (its own slot, in its PID namespace)" \
    "$(series vgpu_container_gpu_memory_nvml_bytes "$LH")" $((556 * MIB))
check_eq "  ... nothing untracked" "$(series vgpu_container_gpu_memory_untracked_bytes "$LH")" 0
HH="zone=\"vGPU\",namespace=\"\",pod=\"$POD\",container=\"main\",vdevice_index=\"0\",device_uuid=\"$GPU0\""
check_eq "hami_vgpu_memory_used_bytes (HAMi's labels, the pod by its UID)" "$(series hami_vgpu_memory_used_bytes "$HH")" $((556 * MIB))
check_eq "hami_vgpu_memory_limit_bytes" "$(series hami_vgpu_memory_limit_bytes "$HH")" "$GIB"
P2=7c0e3d1a-0000-4000-8000-000000000002
check_eq "a container that ran and exited (pod ...0002): its quota" \
    "$(series vgpu_memory_limit_bytes "pod=\"$P2\",container=\"main\",container_id=\"hami/${P2}_main\"")" "$GIB"
check_eq "  ... and no process" "$(series vgpu_ledger_processes "pod=\"$P2\"")" 0
check_not "a folder without a ledger (CUDA_DISABLE_CONTROL=true: no preload) is no container" \
    grep -q 'pod="7c0e3d1a-0000-4000-8000-000000000006"' <<<"$(scrape)"
check_eq "the link and the oversized file are skipped (vgpu_hami_skipped_files)" "$(scrape | grep '^vgpu_hami_skipped_files ' | awk '{print $2}')" 2
evil="skipped in HAMi's folders: vgpu ledger \"$HCDIR/evil.cache.$GPU0\": is a symbolic link, which vgpu never follows here"
big="skipped in HAMi's folders: vgpu ledger \"$HCDIR/big.cache.$GPU0\": is 67108864 bytes, more than such a file can be"
check "the link is logged" wait_for 5 grep -qF "$evil" "$WORK/hmon.log"
check "the oversized file is logged" wait_for 5 grep -qF "$big" "$WORK/hmon.log"
sleep 3
check_eq "  ... the link once, over several collections" "$(grep -cF "$evil" "$WORK/hmon.log")" 1
check_eq "  ... the oversized file once" "$(grep -cF "$big" "$WORK/hmon.log")" 1
check_eq "one line says no bundle mounts the running container's folder: reported, never enforced on" \
    "$(grep -cF "HAMi's container hami/${POD}_main: no bundle under $WORK/tasks mounts its folder: its quota is reported, never enforced on" "$WORK/hmon.log")" 1
check_eq "nothing else is skipped or logged about HAMi's folders" "$(grep -c "HAMi" "$WORK/hmon.log")" 4
check_eq "no process was killed, no cgroup frozen" "$(grep -cE 'killed pid|froze' "$WORK/hmon.log")" 0
vstatus() { FAKE_CUDA_STATE_DIR=$FAKESTATE "$VGPUCTL" status "$@"; }
out=$(vstatus 2>"$WORK/status.err")
line=$(grep "^hami/${POD}_main " <<<"$out")
check_match "vgpuctl status: the container, its quota and its usage" \
    "^hami/${POD}_main +0 +$GPU0 +1.00 GiB +556 MiB \(54%\) +context=256 MiB data=300 MiB" "$line"
check_match "  ... its process, host PID and PID 1 inside, and its pod UID and container" \
    " [0-9]+/1 +HAMi pod UID $POD, container main$" "$line"
check_eq "  ... the link and the oversized file one stderr line each" \
    "$(grep -cF -e "vgpuctl status: $evil" -e "vgpuctl status: $big" "$WORK/status.err")" 2
check_eq "vgpuctl status --json: its pod UID" \
    "$(vstatus --json 2>/dev/null | jq -r --arg id "hami/${POD}_main" '.containers[] | select(.id == $id) | .hami.pod_uid')" "$POD"

t_done
