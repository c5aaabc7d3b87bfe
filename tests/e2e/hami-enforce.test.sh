#!/usr/bin/env bash
# The monitor enforces on HAMi's containers the quota HAMi's device plugin answered, read where the host
# keeps it (issue 45): the container engine writes the Allocate answer into the container's OCI spec, and
# containerd's runc shim keeps that spec in the bundle, <state>/io.containerd.runtime.v2.task/<ns>/<id>/
# config.json, beside init.pid; both root's, which no container mounts ([monitor] hami_task_dir).
#
# A private containerd (its own root and state under $WORK) runs real containers with `ctr run`, given
# exactly what HAMi's Allocate answers (hami-compat.test.sh reads it from HAMi's source: its env, the
# per-container folder at /usr/local/vgpu, the library at /usr/local/vgpu/libvgpu.so, /etc/ld.so.preload,
# /tmp/vgpulock), libvgpu-single.so where HAMi-core's library was, on the fake GPU (16 GiB), in a cgroup as a
# kubelet's cgroupfs driver names a pod's.
#
# The hostile tenant: HAMi's scheduler counted 1024m for it, but its process runs with its own
# CUDA_DEVICE_MEMORY_LIMIT_0=65536m, so the library makes its ledger claiming 64 GiB, and it holds 2 GiB.
# Without the bundles (hami_task_dir missing) the monitor reports the ledger's 64 GiB and says once that
# it enforces nothing; with them, the quota is the spec's 1 GiB, and `vgpuctl monitor --kill` kills the
# process; a container within its 1 GiB beside it is left alone. The compute share likewise: a container
# whose spec says CUDA_DEVICE_SM_LIMIT=10 but whose process sets its own CUDA_DEVICE_SM_LIMIT=0 and runs flat
# out is frozen by the share wall (`--share-wall freeze`) at the spec's 10%, and without the bundles never.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/monitor.sh"
t_init hami-enforce
VGPUCTL=$T/release/vgpuctl
SINGLE=$T/vgpu/libvgpu-single.so
CORE=$T/vgpu/libvgpu_core.so
t_require "$SINGLE" "$CORE" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR/rt_client" \
    "$VGPUCTL" "$(command -v curl)"
for b in containerd ctr containerd-shim-runc-v2 runc; do
    command -v $b > /dev/null || { echo "hami-enforce: $b is not installed"; exit 1; }
done
GIB=1073741824
MIB=1048576
GPU0=GPU-fa4ec0de-0000-4000-8000-000000000000

ROOTFS=$WORK/rootfs
rootfs_busybox "$ROOTFS"
rootfs_add_libs "$ROOTFS" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR"/* "$SINGLE" "$CORE"
mkdir -p "$ROOTFS/usr/local/vgpu" "$ROOTFS/opt/fake" "$ROOTFS/opt/clients" "$ROOTFS/fakestate"
FAKESTATE=$WORK/fakestate
HOSTHOOK=$WORK/host/usr/local/vgpu
VGPULOCK=$WORK/host/tmp/vgpulock
mkdir -p "$FAKESTATE" "$HOSTHOOK/containers" "$VGPULOCK"
chmod 0777 "$VGPULOCK"
cp "$SINGLE" "$HOSTHOOK/libvgpu.so"
echo /usr/local/vgpu/libvgpu.so > "$HOSTHOOK/ld.so.preload"

# A private containerd; its shims outlive it by design, so they are ended by the socket they name.
CTD=$WORK/ctd
mkdir -p "$CTD/root" "$CTD/state"
printf 'version = 2\nroot = "%s"\nstate = "%s"\n[grpc]\n  address = "%s"\n' \
    "$CTD/root" "$CTD/state" "$CTD/c.sock" > "$CTD/config.toml"
containerd --config "$CTD/config.toml" > "$CTD/containerd.log" 2>&1 &
CPID=$!
stop_ctd() {
    local id p
    for id in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s KILL "$id"; done
    sleep 1
    for id in $("${CTR[@]}" containers ls -q 2>/dev/null); do
        "${CTR[@]}" tasks delete "$id"; "${CTR[@]}" containers delete "$id"
    done
    kill "$CPID"; wait "$CPID"
    for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTD/c.sock"); do kill -9 "$p"; done
    grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l
}
CTR=(ctr -a "$CTD/c.sock" -n k8s.io)
on_exit stop_ctd
check "a private containerd starts" wait_for 20 "${CTR[@]}" version
TASKS=$CTD/state/io.containerd.runtime.v2.task

# hami_run POD CTR MEM_MIB CMD...: a container started by containerd with HAMi's Allocate answer for one
# device of MEM_MIB (no compute limit, or $SM percent), its output in $WORK/<ctr>.out. Sets $CDIR (its HAMi
# folder).
hami_run() {
    local pod=$1 ctr=$2 mem=$3; shift 3
    CDIR=$HOSTHOOK/containers/${pod}_$ctr
    mkdir -p "$CDIR"; chmod 0777 "$CDIR"
    local bind="type=bind,options=rbind"
    "${CTR[@]}" run -d --log-uri "file://$WORK/$ctr.out" \
        --cgroup "/kubepods/besteffort/pod$pod/$ctr" \
        --env LD_LIBRARY_PATH=/opt/fake --env FAKE_CUDA_STATE_DIR=/fakestate --env PATH=/opt/clients:/bin \
        --env "CUDA_DEVICE_MEMORY_LIMIT_0=${mem}m" --env "CUDA_DEVICE_SM_LIMIT=${SM:-0}" \
        --env "CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/$(cat /proc/sys/kernel/random/uuid).cache" \
        --env "NVIDIA_VISIBLE_DEVICES=$GPU0" \
        --mount "$bind:ro,src=$FAKE_DIR,dst=/opt/fake" \
        --mount "$bind:ro,src=$CLIENTS_DIR,dst=/opt/clients" \
        --mount "$bind:rw,src=$FAKESTATE,dst=/fakestate" \
        --mount "$bind:rw,src=$CDIR,dst=/usr/local/vgpu" \
        --mount "$bind:ro,src=$HOSTHOOK/libvgpu.so,dst=/usr/local/vgpu/libvgpu.so" \
        --mount "$bind:rw,src=$VGPULOCK,dst=/tmp/vgpulock" \
        --mount "$bind:ro,src=$HOSTHOOK/ld.so.preload,dst=/etc/ld.so.preload" \
        --rootfs "$ROOTFS" "$ctr" "$@" > "$WORK/$ctr.run" 2>&1
}
task_running() { "${CTR[@]}" tasks ls | grep -qE "^$1 +[0-9]+ +RUNNING"; }

echo "-- containers containerd started with HAMi's answer, their specs in the shim's bundles"
PE=7c0e3d1a-0000-4000-8000-0000000000e1
PW=7c0e3d1a-0000-4000-8000-0000000000e2
# The hostile tenant's process: its own CUDA_DEVICE_MEMORY_LIMIT_0 over HAMi's (its ledger claims 64 GiB).
hami_run "$PE" hostile 1024 sh -c 'CUDA_DEVICE_MEMORY_LIMIT_0=65536m exec rt_client device 0 "!alloc" 2Gi sleep 120'
EDIR=$CDIR
hami_run "$PW" within 1024 rt_client device 0 '!alloc' 300Mi sleep 120
WDIR=$CDIR
check "the hostile container holds 2 GiB" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/hostile.out"
check "the other holds 300 MiB" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/within.out"
check "its ledger is in its HAMi folder" \
    grep -q . <(ls "$EDIR"/*.cache.$GPU0 2>/dev/null)
spec=$TASKS/k8s.io/hostile/config.json
check "its bundle's spec holds HAMi's CUDA_DEVICE_MEMORY_LIMIT_0=1024m" \
    jq -e '.process.env | index("CUDA_DEVICE_MEMORY_LIMIT_0=1024m")' "$spec"
check "  ... and mounts its HAMi folder at /usr/local/vgpu" \
    jq -e --arg s "$EDIR" '.mounts | any(.destination == "/usr/local/vgpu" and .source == $s)' "$spec"
check "  ... beside init.pid, root's, in a folder of mode 0700" \
    test "$(stat -c %U:%a "$TASKS/k8s.io/hostile")" = root:700 -a -s "$TASKS/k8s.io/hostile/init.pid"

vgpu_config
cfg() { cp "$WORK/config.toml" "$WORK/$1.toml"; printf '[monitor]\nhami_containers_dir = "%s"\nhami_task_dir = "%s"\n' \
    "$HOSTHOOK/containers" "$2" >> "$WORK/$1.toml"; }
LE="pod=\"$PE\",container=\"hostile\",container_id=\"hami/${PE}_hostile\",vdevice_index=\"0\",device_uuid=\"$GPU0\""
LW="pod=\"$PW\",container=\"within\",container_id=\"hami/${PW}_within\",vdevice_index=\"0\",device_uuid=\"$GPU0\""

echo "-- no bundles where hami_task_dir says: report only, said once, nothing killed under --kill"
cfg nobundle "$WORK/none"
VGPU_CONFIG=$WORK/nobundle.toml monitor_start rmon --kill && pass "the monitor starts" || fail "the monitor starts"
check_eq "vgpu_memory_limit_bytes of the hostile container: its ledger's 64 GiB claim" \
    "$(series vgpu_memory_limit_bytes "$LE")" $((64 * GIB))
check_eq "NVML's truth: 2 GiB and its 256 MiB context" "$(series vgpu_container_gpu_memory_nvml_bytes "$LE")" \
    $((2304 * MIB))
sleep 3
check_eq "one line says HAMi's quotas are reported only, once over several collections" \
    "$(grep -c "HAMi's containers: no bundle of the host's to read their quotas from ($WORK/none: .*): their quotas are reported, never enforced on" "$WORK/rmon.log")" 1
check_eq "no process killed" "$(grep -c 'killed pid' "$WORK/rmon.log")" 0
check "the hostile container still runs" task_running hostile
kill "$rmon_PID"; wait "$rmon_PID" 2>/dev/null

echo "-- vgpuctl status with the same config: the spec's quota, not the ledger's"
out=$(FAKE_CUDA_STATE_DIR=$FAKESTATE VGPU_CONFIG=$WORK/nobundle.toml "$VGPUCTL" status 2>/dev/null)
check_match "without the bundles: the ledger's 64 GiB" "^hami/${PE}_hostile +0 +$GPU0 +64.0 GiB " "$out"
cfg bundles "$TASKS"
out=$(FAKE_CUDA_STATE_DIR=$FAKESTATE VGPU_CONFIG=$WORK/bundles.toml "$VGPUCTL" status 2>/dev/null)
check_match "with them: the spec's 1 GiB, said" "^hami/${PE}_hostile +0 +$GPU0 +1.00 GiB .*quota of its OCI spec$" "$out"
check_eq "  ... --json names the spec" "$(FAKE_CUDA_STATE_DIR=$FAKESTATE VGPU_CONFIG=$WORK/bundles.toml "$VGPUCTL" status --json 2>/dev/null |
    jq -r --arg id "hami/${PE}_hostile" '.containers[] | select(.id == $id) | .hami.spec')" "$TASKS/k8s.io/hostile/config.json"

echo "-- the bundles of the private containerd: the spec's quota, enforced"
VGPU_CONFIG=$WORK/bundles.toml monitor_start emon --kill && pass "the monitor starts" || fail "the monitor starts"
check "the hostile container's process is killed" wait_for 15 grep -q "killed pid" "$WORK/emon.log"
line=$(grep -m1 "over quota: container hami/${PE}_hostile" "$WORK/emon.log")
check_match "over quota against the spec's 1 GiB, not the ledger's 64 GiB, the spec named" \
    "its processes hold 2.25 GiB \(NVML\), quota 1.00 GiB, .*killing under the kill policy \(HAMi's container: the quota its OCI spec holds, \"$TASKS/k8s.io/hostile/config.json\"\)" \
    "$line"
check "  ... its task ends" wait_for 15 bash -c "! $(printf '%q ' "${CTR[@]}") tasks ls | grep -qE '^hostile +[0-9]+ +RUNNING'"
check_eq "the container within its quota is never killed" "$(grep -c "hami/${PW}_within" "$WORK/emon.log")" 0
check "  ... and still runs" task_running within
check_eq "its vgpu_memory_limit_bytes: the spec's 1 GiB" "$(series vgpu_memory_limit_bytes "$LW")" "$GIB"
check_eq "its NVML truth, by its init's cgroup: 556 MiB" "$(series vgpu_container_gpu_memory_nvml_bytes "$LW")" \
    $((556 * MIB))
check_eq "the hostile one's series: the spec's 1 GiB" "$(series vgpu_memory_limit_bytes "$LE")" "$GIB"
check_eq "nothing said about reporting only" "$(grep -c 'reported, never enforced' "$WORK/emon.log")" 0

echo "-- the compute share: a container past its spec's CUDA_DEVICE_SM_LIMIT=10 is frozen (the share wall)"
# HAMi's scheduler counted 10% of the GPU for it, but its process runs with its own CUDA_DEVICE_SM_LIMIT=0:
# the library throttles nothing and 2 ms kernels keep the fake GPU busy. The monitor's share wall (a 5 s
# window) takes the share from the bundle's spec and freezes the container's cgroup (the kubelet-style one
# containerd made) for its excess. Without the bundles, the same container is never frozen.
kill "$emon_PID"; wait "$emon_PID" 2>/dev/null
PS=7c0e3d1a-0000-4000-8000-0000000000e3
CGS=$(findmnt -n -t cgroup2 -o TARGET | head -1)/kubepods/besteffort/pod$PS/spinner
LS="pod=\"$PS\",container=\"spinner\",container_id=\"hami/${PS}_spinner\",vdevice_index=\"0\",device_uuid=\"$GPU0\""
# spinner SECONDS OUT: the spinner's container started afresh; OUT records every 50 ms whether its cgroup is
# frozen, until the cgroup is gone.
spinner() {
    "${CTR[@]}" tasks kill -s KILL spinner > /dev/null 2>&1 && sleep 1
    "${CTR[@]}" tasks delete spinner > /dev/null 2>&1; "${CTR[@]}" containers delete spinner > /dev/null 2>&1
    SM=10 hami_run "$PS" spinner 1024 sh -c "CUDA_DEVICE_SM_LIMIT=0 FAKE_CUDA_KERNEL_US=2000 exec compute_client plain $1"
    wait_for 10 test -e "$CGS/cgroup.events" || return 1
    while [ -e "$CGS/cgroup.events" ]; do grep -h '^frozen' "$CGS/cgroup.events" 2>/dev/null; sleep 0.05; done >"$2" &
    on_exit "kill $! 2>/dev/null"
}
# share_cfg NAME BASE: BASE's config with a 5 s share window.
share_cfg() { cp "$WORK/$2.toml" "$WORK/$1.toml"; echo 'share_window_seconds = 5' >> "$WORK/$1.toml"; }
spinner 30 "$WORK/s.frozen"
check "the spinner runs, in its own cgroup v2" task_running spinner
check "its bundle's spec holds HAMi's CUDA_DEVICE_SM_LIMIT=10" \
    jq -e '.process.env | index("CUDA_DEVICE_SM_LIMIT=10")' "$TASKS/k8s.io/spinner/config.json"
share_cfg share bundles
VGPU_CONFIG=$WORK/share.toml monitor_start smon --share-wall freeze && pass "the monitor starts" || fail "the monitor starts"
check "vgpu_compute_limit_ratio of the spinner: its spec's 10%" \
    wait_for 10 sh -c "curl -sf '$URL' | grep -qxF 'vgpu_compute_limit_ratio{namespace=\"\",$LS} 0.1'"
check "the monitor logs one line: the spinner ran past its share (NVML), freezing its cgroup" \
    wait_for 20 grep -q "over its compute share: container hami/${PS}_spinner (HAMi: pod UID $PS, container spinner) GPU 0 ($GPU0): its processes used .* (NVML), share 10% + 5 points: freezing $CGS for " "$WORK/smon.log"
check "its cgroup is frozen (cgroup.events: frozen 1)" wait_for 10 grep -q 'frozen 1' "$WORK/s.frozen"
check "  ... and thawed again (duty cycling)" wait_for 15 sh -c "grep -A1000 'frozen 1' '$WORK/s.frozen' | grep -q 'frozen 0'"
check "its freezes are counted" \
    awk -v n="$(scrape | awk '/^vgpu_compute_share_freezes_total /{print $2}')" 'BEGIN { exit !(n >= 1) }'
check_eq "no freeze failed" "$(scrape | awk '/^vgpu_compute_share_freeze_failures_total /{print $2}')" 0
check_eq "  ... once for its run, not at every freeze" "$(grep -c 'over its compute share' "$WORK/smon.log")" 1
check_eq "the finding names no other container" "$(grep 'over its compute share' "$WORK/smon.log" | grep -vc "hami/${PS}_spinner")" 0
kill "$smon_PID"; wait "$smon_PID" 2>/dev/null
check "the monitor thaws it when it stops" grep -q 'frozen 0' "$CGS/cgroup.events"

echo "-- without the bundles the spinner is reported only: never frozen"
spinner 20 "$WORK/n.frozen"
check "the spinner runs again" task_running spinner
share_cfg noshare nobundle
VGPU_CONFIG=$WORK/noshare.toml monitor_start nmon --share-wall freeze && pass "the monitor starts" || fail "the monitor starts"
sleep 12
check "  ... and still runs" task_running spinner
check_eq "no share finding" "$(grep -c 'over its compute share' "$WORK/nmon.log")" 0
check_not "its cgroup was never frozen" grep -q 'frozen 1' "$WORK/n.frozen"
check_eq "no freeze" "$(scrape | awk '/^vgpu_compute_share_freezes_total /{print $2}')" 0

t_done
