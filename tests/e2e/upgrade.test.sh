#!/usr/bin/env bash
# Upgrade with containers running (issue 26 item 7): `make package`'s .deb installed as the "old" package,
# a container started through it (installed shim, hook and interposer, runc, fake driver) and left running,
# then a "new" package installed over it with dpkg -i (the same build repacked with a higher version: dpkg's
# upgrade path, prerm upgrade and postinst configure, with every installed file replaced while the container
# runs). The new vgpuctl's status, monitor and gc then read the old container's state, a process started in
# it after the upgrade still charges its quota, and its poststop, run by the new hook, removes its state.
# Then a format skew: state a newer vgpu would write (limits.json version 2, as after a downgrade) is shown
# as an error, counted by the monitor, kept by gc, and removed by its poststop (docs/upgrade.md).
# Like package.test.sh, it installs the package on this machine: the two never run at once.
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
t_init upgrade
t_require "$T/vgpu/libvgpu.so" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$CLIENTS_DIR/rt_client"
for c in dpkg-deb cargo-deb runc jq; do
    command -v "$c" >/dev/null || { echo "upgrade: $c missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done
if dpkg-query -W -f='${Status}' vgpu 2>/dev/null | grep -q installed; then
    echo "upgrade: a vgpu package is already installed on this machine; remove it first (dpkg --purge vgpu)"
    echo "0 passed, 1 failed"; exit 1
fi
# Docker's daemon.json is configured by the old package's vgpuctl and must survive the upgrade.
DAEMON=/etc/docker/daemon.json
mkdir -p "$WORK/saved"
[ -e "$DAEMON" ] && cp -a "$DAEMON" "$WORK/saved/daemon.json"
restore_daemon() { if [ -e "$WORK/saved/daemon.json" ]; then cp -a "$WORK/saved/daemon.json" "$DAEMON"; else rm -f "$DAEMON"; fi; }
on_exit "dpkg --purge vgpu; restore_daemon"

echo "-- the old and the new package"
bash "$REPO/packaging/build.sh" > "$WORK/built" 2> "$WORK/build.err"
OLD=$(grep '\.deb$' "$WORK/built")
ok_if "the .deb builds" test -f "$OLD"
((FAILED)) && { tail -30 "$WORK/build.err"; t_done; }
OLDV=$(dpkg-deb -f "$OLD" Version)
NEWV=${OLDV%-*}+upgrade-${OLDV##*-}
dpkg-deb -R "$OLD" "$WORK/repack"
sed -i "s/^Version: .*/Version: $NEWV/" "$WORK/repack/DEBIAN/control"
dpkg-deb -b "$WORK/repack" "$WORK/vgpu_new.deb" > /dev/null
NEW=$WORK/vgpu_new.deb
check "the new package's version ($NEWV) is higher than the old's ($OLDV)" dpkg --compare-versions "$NEWV" gt "$OLDV"

echo "-- the old package installed, Docker configured, a container running"
check "dpkg -i the old package" dpkg -i "$OLD"
check "docker configured by the old vgpuctl" /usr/bin/vgpuctl runtime configure --runtime=docker
RUNTIME=runc
HOOK=/usr/bin/vgpu-hook SHIM=/usr/bin/vgpu-container-runtime LIBVGPU=/usr/lib/vgpu/libvgpu.so
oci_setup
# Holds 128 MiB of its 1 GiB quota (and its context's 256 MiB, as the fake driver charges one) while the
# whole upgrade happens; killed at the end.
new_bundle rt_client device 0 !alloc 128Mi sleep 300
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 1Gi
OLD_ID=$ID
shim run --bundle "$B" "$ID" < /dev/null > "$WORK/old-container.out" 2>&1 &
RUN_PID=$!
used() { /usr/bin/vgpuctl status --json | jq -r --arg id "$OLD_ID" '.containers[] | select(.id == $id) | .gpus[0].used'; }
holds() { [ "$(used 2>/dev/null)" = $((384 * MIB)) ]; }
wait_for 20 holds
check_eq "the old vgpuctl sees the running container's 128 MiB and its context" "$(used)" $((384 * MIB))
limits_before=$(sha256sum < "$STATE/containers/$OLD_ID/limits.json")
init=$(jq -r .init_pid "$STATE/containers/$OLD_ID/limits.json")
hook_ino=$(stat -c %i /usr/bin/vgpu-hook); lib_ino=$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)
check_eq "the container's interposer is the installed file" "$(stat -c %i "/proc/$init/root/usr/local/vgpu/libvgpu_core.so")" "$lib_ino"

echo "-- dpkg -i the new package while it runs"
dpkg -i "$NEW" > "$WORK/upgrade.out" 2>&1
check_eq "dpkg -i upgrades (rc)" "$?" 0
check_eq "  ... to the new version" "$(dpkg-query -W -f='${Version}' vgpu)" "$NEWV"
check_not "  ... without taking vgpu out of the engines (prerm upgrade)" grep -q 'removing the vgpu runtime' "$WORK/upgrade.out"
check "  ... daemon.json still names the shim" grep -q /usr/bin/vgpu-container-runtime "$DAEMON"
check "  ... the gc timer still enabled" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
check "the container still runs" kill -0 "$RUN_PID"
check_not "  ... every file replaced (the hook is another file now)" test "$(stat -c %i /usr/bin/vgpu-hook)" = "$hook_ino"
check_not "  ... the interposer too" test "$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)" = "$lib_ino"
check_eq "  ... while the container keeps the one it started with" "$(stat -c %i "/proc/$init/root/usr/local/vgpu/libvgpu_core.so")" "$lib_ino"
check_eq "  ... its limits.json untouched" "$(sha256sum < "$STATE/containers/$OLD_ID/limits.json")" "$limits_before"

echo "-- the new binaries on the old container's state"
"/usr/bin/vgpuctl" status > "$WORK/status.txt" 2>&1
check_match "status (new) shows it with its 1 GiB quota" "^${OLD_ID:0:12} +0 +GPU-[^ ]+ +1.00 GiB +[0-9]" "$(cat "$WORK/status.txt")"
/usr/bin/vgpuctl monitor --once > "$WORK/metrics.txt" 2>&1
check_match "monitor (new) serves its limit" "^vgpu_memory_limit_bytes\\{.*container_id=\"$OLD_ID\".*\\} $GIB\$" "$(cat "$WORK/metrics.txt")"
check_match "  ... and no state error" '^vgpu_state_errors 0$' "$(cat "$WORK/metrics.txt")"
check_match "gc (new) keeps it: its container runs" '^0 removed' "$(/usr/bin/vgpuctl gc 2>&1)"
check "  ... its state is there" test -f "$STATE/containers/$OLD_ID/limits.json"
# A process started in the old container after the upgrade: the container's library (the old file, still
# mounted) charges the same ledger, against the same quota.
out=$(plain exec "$OLD_ID" rt_client device 0 info alloc 256Mi alloc 256Mi 2>&1)
check_eq "a process started after the upgrade sees the 1 GiB quota" "$(field total "$out")" "$GIB"
check_match "  ... gets 256 MiB beside the first's 384 and its own context" 'op=alloc size=268435456 .*rc=0' "$out"
check_match "  ... and is refused 256 MiB more (1152 MiB > 1 GiB)" 'op=alloc size=268435456 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"

echo "-- the container ends: the new hook's poststop removes the old state"
plain kill "$OLD_ID" KILL > /dev/null 2>&1
wait "$RUN_PID"
check_eq "its state is gone" "$(state_left)" ""

echo "-- format skew: state a newer vgpu wrote (limits.json version 2)"
new_bundle rt_client device 0 !alloc 64Mi sleep 30
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 1Gi
SKEW_ID=$ID
shim run --bundle "$B" "$ID" < /dev/null > "$WORK/skew-container.out" 2>&1 &
RUN_PID=$!
L=$STATE/containers/$SKEW_ID/limits.json
wait_for 20 grep -q '"init_pid"' "$L"
jq '.version = 2' "$L" > "$WORK/v2.json" && cat "$WORK/v2.json" > "$L"
out=$(/usr/bin/vgpuctl status 2>&1)
check_match "status shows it as an error naming the version" "^${SKEW_ID:0:12} .*error: vgpu limits file .*format version 2 is not supported" "$out"
/usr/bin/vgpuctl monitor --once > "$WORK/metrics2.txt" 2>&1
check_match "the monitor counts a state error" '^vgpu_state_errors [1-9]' "$(cat "$WORK/metrics2.txt")"
check_match "gc keeps it (its container may run) and says why" 'format version 2.*kept: its container may still be running' "$(/usr/bin/vgpuctl gc 2>&1)"
check "  ... its state is there" test -d "$STATE/containers/$SKEW_ID"
plain kill "$SKEW_ID" KILL > /dev/null 2>&1
wait "$RUN_PID"
check_eq "its poststop removes it all the same (by id)" "$(state_left)" ""
t_done
