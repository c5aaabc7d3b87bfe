#!/usr/bin/env bash
# Upgrade with containers running (issue 26 item 7), from a real older build to this one, and back.
# The old packages are those of commit $OLD_COMMIT, the last before `vgpuctl update` landed: its limits.json
# has no `updates`, `updated_at` or `shrunk_from`, its containers no second name for their mounted limits
# file, its ledger header no generation word (docs/upgrade.md). lib/old-package.sh builds them from a git
# worktree of that commit with the commit's own recipe; the new ones are this build's `make package`.
#   .deb: the old package installed, Docker configured by its vgpuctl, a container started through its shim
#         (runc, fake driver) with a 1 GiB quota and left running; this build's package installed over it
#         (dpkg -i: prerm upgrade, postinst configure, every file replaced). The new status, monitor and gc
#         read the old container's state, a process started in it after the upgrade is held to its quota,
#         the new `vgpuctl update` refuses it in one line and changes nothing, a new container gets the new
#         library (which follows a live update), the old container's poststop (the new hook) removes its
#         state. A format skew (limits.json version 2). Then the downgrade: the old package over the new
#         one while the new container runs; the old tools read its state and its poststop removes it.
#   .rpm: the same upgrade with rpm (Debian's, a private database, --nodeps: Debian's libc is no rpm), then
#         rpm -e.
# Like package.test.sh, it installs the packages on this machine: the two never run at once.
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/old-package.sh"
# The last commit before `vgpuctl update` (merge a99032d): the formats it changed predate it.
OLD_COMMIT=963fba5d365dad5f441d31910c55c11789b77d84
t_init upgrade
t_require "$T/vgpu/libvgpu.so" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$CLIENTS_DIR/rt_client"
for c in git dpkg-deb rpm cargo-deb cargo-generate-rpm runc jq; do
    command -v "$c" >/dev/null || { echo "upgrade: $c missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done
if dpkg-query -W -f='${Status}' vgpu 2>/dev/null | grep -q installed || [ -e /usr/bin/vgpuctl ]; then
    echo "upgrade: vgpu is already installed on this machine (/usr/bin/vgpuctl); remove it first (dpkg --purge vgpu)"
    echo "0 passed, 1 failed"; exit 1
fi
# Docker's daemon.json is configured by the old package's vgpuctl and must survive the upgrade.
DAEMON=/etc/docker/daemon.json
mkdir -p "$WORK/saved"
[ -e "$DAEMON" ] && cp -a "$DAEMON" "$WORK/saved/daemon.json"
restore_daemon() { if [ -e "$WORK/saved/daemon.json" ]; then cp -a "$WORK/saved/daemon.json" "$DAEMON"; else rm -f "$DAEMON"; fi; }
RPMDB=$WORK/rpmdb
# Debian's rpm warns that rpm packages are for alien on every install; that warning is all --nodeps hides
# besides libc, which dpkg provides here.
rpmx() { rpm --dbpath "$RPMDB" --nodeps "$@"; }
# rpm_installed: the installed vgpu's version-release; nothing when rpm has none.
rpm_installed() { local v; v=$(rpm --dbpath "$RPMDB" -q --qf '%{VERSION}-%{RELEASE}' vgpu 2>/dev/null) && echo "$v"; }
on_exit "dpkg --purge vgpu; rpmx -e vgpu; rm -f /etc/vgpu/config.toml.rpmsave /etc/vgpu/config.toml.rpmnew; rmdir /etc/vgpu; restore_daemon"

echo "-- the new package (this build) and the old one (commit ${OLD_COMMIT:0:12})"
bash "$REPO/packaging/build.sh" > "$WORK/built" 2> "$WORK/build.err"
NEW=$(grep '\.deb$' "$WORK/built"); NEW_RPM=$(grep '\.rpm$' "$WORK/built")
ok_if "this build's .deb and .rpm build" test -f "$NEW" -a -f "$NEW_RPM"
((FAILED)) && { tail -30 "$WORK/build.err"; t_done; }
t0=$(date +%s)
if ! old_package "$OLD_COMMIT"; then
    fail "the old commit's .deb and .rpm build (above)"
    [ -f "$WORK/old-package.log" ] && tail -30 "$WORK/old-package.log"
    t_done
fi
pass "the old commit's .deb and .rpm build ($(($(date +%s) - t0)) s; kept in ${OLD_DEB%/*})"
OLDV=$(dpkg-deb -f "$OLD_DEB" Version); NEWV=$(dpkg-deb -f "$NEW" Version)
check "the new .deb's version ($NEWV) is higher than the old's ($OLDV)" dpkg --compare-versions "$NEWV" gt "$OLDV"
rpmv() { rpm -qp --qf '%{VERSION}-%{RELEASE}' "$1" 2>/dev/null; }
OLD_RPMV=$(rpmv "$OLD_RPM"); NEW_RPMV=$(rpmv "$NEW_RPM")
check_eq "the new .rpm's version ($NEW_RPMV) is higher than the old's ($OLD_RPMV)" \
    "$(rpm --eval "%{lua: print(rpm.vercmp('$NEW_RPMV', '$OLD_RPMV'))}")" 1
OLD_CORE=$WORK/old-files/usr/lib/vgpu/libvgpu_core.so
dpkg-deb -x "$OLD_DEB" "$WORK/old-files"
dpkg-deb -x "$NEW" "$WORK/new-files"
check_not "  ... their interposers differ" cmp -s "$OLD_CORE" "$WORK/new-files/usr/lib/vgpu/libvgpu_core.so"

# The containers: the installed shim, hook and interposer, runc, the fake driver.
RUNTIME=runc
HOOK=/usr/bin/vgpu-hook SHIM=/usr/bin/vgpu-container-runtime LIBVGPU=/usr/lib/vgpu/libvgpu.so
CTL=/usr/bin/vgpuctl
used() { "$CTL" status --json | jq -r --arg id "$1" '.containers[] | select(.id == $id) | .gpus[0].used'; }
# run_holder QUOTA CMD...: a container with QUOTA on GPU 0 running rt_client CMD... in the background, which
# first holds 128 MiB (with its context's 256 MiB, as the fake driver charges one: 384 MiB used); sets ID,
# RUN_PID, INIT (its init's host PID) and LOG.
run_holder() {
    local quota=$1; shift
    new_bundle rt_client device 0 !alloc 128Mi "$@"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    bundle_annotate "$B" vgpu.io/memory-limit "$quota"
    LOG=$WORK/$ID.out
    shim run --bundle "$B" "$ID" < /dev/null > "$LOG" 2>&1 &
    RUN_PID=$!
    wait_for 20 eval '[ "$(used "$ID" 2>/dev/null)" = $((384 * MIB)) ]'
    INIT=$(jq -r .init_pid "$STATE/containers/$ID/limits.json")
}
# reads_state WHO ID QUOTA TEXT: the installed status, monitor and gc on container ID's state.
reads_state() {
    local who=$1 id=$2 quota=$3 text=$4 out
    out=$("$CTL" status 2>&1)
    check_match "status ($who) shows it with its $text quota" "^${id:0:12} +0 +GPU-[^ ]+ +$text +[0-9]" "$out"
    out=$("$CTL" monitor --once 2>&1)
    check_match "monitor ($who) serves its limit" "^vgpu_memory_limit_bytes\\{.*container_id=\"$id\".*\\} $quota\$" "$out"
    check_match "  ... and no state error" '^vgpu_state_errors 0$' "$out"
    check_match "gc ($who) keeps it: its container runs" '^0 removed' "$("$CTL" gc 2>&1)"
    check "  ... its state is there" test -f "$STATE/containers/$id/limits.json"
}
# quota_holds WHO ID QUOTA: a process started in container ID now (its library: the file mounted at its
# creation) sees QUOTA, gets all of it but 64 MiB beside the holder's 384 MiB and its own 256 MiB context,
# and is refused 128 MiB more.
quota_holds() {
    local who=$1 id=$2 quota=$3 half=$((($3 - 704 * MIB) / 2)) out
    out=$(plain exec "$id" rt_client device 0 info alloc $half alloc $half alloc 128Mi 2>&1)
    check_eq "a process started in it $who sees its quota" "$(field total "$out")" "$quota"
    check_match "  ... gets all but 64 MiB of the rest" "op=alloc size=$half .*rc=0" "$(grep op=alloc <<< "$out" | sed -n 2p)"
    check_match "  ... and is refused 128 MiB more" 'op=alloc size=134217728 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
}
ends() {
    plain kill "$1" KILL > /dev/null 2>&1
    wait "$2"
}

echo "-- the old .deb installed, Docker configured, a container running"
check "dpkg -i the old package" dpkg -i "$OLD_DEB"
check_match "its vgpuctl is the old commit's" "\\(commit ${OLD_COMMIT:0:12}\\)" "$("$CTL" --version)"
check "docker configured by the old vgpuctl" "$CTL" runtime configure --runtime=docker
oci_setup
run_holder 1Gi sleep 300
OLD_ID=$ID OLD_PID=$RUN_PID OLD_INIT=$INIT
check_eq "the old vgpuctl sees the running container's 128 MiB and its context" "$(used "$OLD_ID")" $((384 * MIB))
limits_before=$(sha256sum < "$STATE/containers/$OLD_ID/limits.json")
hook_ino=$(stat -c %i "$HOOK"); lib_ino=$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)
check_eq "the container's interposer is the installed file" "$(stat -c %i "/proc/$OLD_INIT/root/usr/local/vgpu/libvgpu_core.so")" "$lib_ino"
check_not "its state is the old format: no second name for the mounted limits file" \
    test -e "$STATE/containers/$OLD_ID/limits.mounted.json"

echo "-- dpkg -i the new package while it runs"
dpkg -i "$NEW" > "$WORK/upgrade.out" 2>&1
check_eq "dpkg -i upgrades (rc)" "$?" 0
check_eq "  ... to the new version" "$(dpkg-query -W -f='${Version}' vgpu)" "$NEWV"
check_match "  ... vgpuctl is this build's" "\\(commit $(git -C "$REPO" rev-parse --short=12 HEAD)\\)" "$("$CTL" --version)"
check_not "  ... without taking vgpu out of the engines (prerm upgrade)" grep -q 'removing the vgpu runtime' "$WORK/upgrade.out"
check "  ... daemon.json still names the shim" grep -q /usr/bin/vgpu-container-runtime "$DAEMON"
check "  ... the gc timer still enabled" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
check "the container still runs" kill -0 "$OLD_PID"
check_not "  ... every file replaced (the hook is another file now)" test "$(stat -c %i "$HOOK")" = "$hook_ino"
check_not "  ... the interposer too" test "$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)" = "$lib_ino"
check_eq "  ... while the container keeps the one it started with" "$(stat -c %i "/proc/$OLD_INIT/root/usr/local/vgpu/libvgpu_core.so")" "$lib_ino"
check "  ... which is the old commit's" cmp "/proc/$OLD_INIT/root/usr/local/vgpu/libvgpu_core.so" "$OLD_CORE"
check_eq "  ... its limits.json untouched" "$(sha256sum < "$STATE/containers/$OLD_ID/limits.json")" "$limits_before"

echo "-- the new binaries on the old container's state"
reads_state new "$OLD_ID" "$GIB" "1.00 GiB"
quota_holds "after the upgrade" "$OLD_ID" "$GIB"
L=$STATE/containers/$OLD_ID/limits.json
jq -S . "$L" > "$WORK/old-limits.json"
out=$("$CTL" update "$OLD_ID" --memory-limit 2Gi 2>&1); rc=$?
check "vgpuctl update (new) refuses the old container (its library cannot follow)" test "$rc" != 0
check_match "  ... in one line saying to recreate it" \
    "^vgpuctl: error: container $OLD_ID: .*limits.mounted.json: missing: the container was created before live updates were possible; recreate it to change its limits\$" "$out"
check_eq "  ... its limits.json says the same as before" "$(jq -S . "$L")" "$(cat "$WORK/old-limits.json")"
check_match "  ... and status the same quota" "^${OLD_ID:0:12} +0 +GPU-[^ ]+ +1.00 GiB " "$("$CTL" status 2>&1)"

echo "-- a new container gets the new library"
run_holder 1Gi watch-total 2Gi 60 sleep 300
NEW_ID=$ID NEW_PID=$RUN_PID NEW_INIT=$INIT NEW_LOG=$LOG
check_eq "its interposer is the new installed file" "$(stat -c %i "/proc/$NEW_INIT/root/usr/local/vgpu/libvgpu_core.so")" \
    "$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)"
check "  ... its state has the mounted limits file's second name" test -f "$STATE/containers/$NEW_ID/limits.mounted.json"
check_match "vgpuctl update raises its quota to 2 GiB" 'memory limit 1.00 GiB -> 2.00 GiB \(update 1\)' \
    "$("$CTL" update "$NEW_ID" --memory-limit 2Gi 2>&1)"
wait_for 10 grep -q 'op=watch-total' "$NEW_LOG"
check_match "  ... and its running process (the new library) sees it" "op=watch-total total=$((2 * GIB)) .*rc=0" "$(cat "$NEW_LOG")"

echo "-- the old container ends: the new hook's poststop removes its state"
ends "$OLD_ID" "$OLD_PID"
check_eq "its state is gone, the new container's kept" "$(state_left)" "$NEW_ID"

echo "-- format skew: state a newer vgpu wrote (limits.json version 2)"
new_bundle rt_client device 0 !alloc 64Mi sleep 30
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 1Gi
SKEW_ID=$ID
shim run --bundle "$B" "$ID" < /dev/null > "$WORK/skew-container.out" 2>&1 &
SKEW_PID=$!
L=$STATE/containers/$SKEW_ID/limits.json
wait_for 20 grep -q '"init_pid"' "$L"
jq '.version = 2' "$L" > "$WORK/v2.json" && cat "$WORK/v2.json" > "$L"
out=$("$CTL" status 2>&1)
check_match "status shows it as an error naming the version" "^${SKEW_ID:0:12} .*error: vgpu limits file .*format version 2 is not supported" "$out"
"$CTL" monitor --once > "$WORK/metrics2.txt" 2>&1
check_match "the monitor counts a state error" '^vgpu_state_errors [1-9]' "$(cat "$WORK/metrics2.txt")"
check_match "gc keeps it (its container may run) and says why" 'format version 2.*kept: its container may still be running' "$("$CTL" gc 2>&1)"
check "  ... its state is there" test -d "$STATE/containers/$SKEW_ID"
ends "$SKEW_ID" "$SKEW_PID"
check_eq "its poststop removes it all the same (by id)" "$(state_left)" "$NEW_ID"

echo "-- downgrade: dpkg -i the old package while the new container runs"
dpkg -i "$OLD_DEB" > "$WORK/downgrade.out" 2>&1
check_eq "dpkg -i downgrades (rc)" "$?" 0
check_eq "  ... to the old version" "$(dpkg-query -W -f='${Version}' vgpu)" "$OLDV"
check_match "  ... vgpuctl is the old commit's" "\\(commit ${OLD_COMMIT:0:12}\\)" "$("$CTL" --version)"
check "the new container still runs" kill -0 "$NEW_PID"
reads_state old "$NEW_ID" $((2 * GIB)) "2.00 GiB"
quota_holds "after the downgrade" "$NEW_ID" $((2 * GIB))
check_match "the old vgpuctl has no update command" 'unrecognized subcommand' "$("$CTL" update "$NEW_ID" --memory-limit 1Gi 2>&1)"
ends "$NEW_ID" "$NEW_PID"
check_eq "the old hook's poststop removes the new container's state, the mounted file's second name too" "$(state_left)" ""
dpkg --purge vgpu > "$WORK/purge.out" 2>&1
check_eq "dpkg --purge the old package (rc)" "$?" 0
restore_daemon

echo "-- the .rpm: rpm -i the old one, a container, rpm -U the new one while it runs, rpm -e"
rpm --dbpath "$RPMDB" --initdb
check "rpm -i the old .rpm" rpmx -i "$OLD_RPM"
check_eq "  ... installed at the old version" "$(rpm_installed)" "$OLD_RPMV"
check_match "  ... vgpuctl is the old commit's" "\\(commit ${OLD_COMMIT:0:12}\\)" "$("$CTL" --version)"
check "  ... its %post enabled the gc timer" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
check "docker configured by the old vgpuctl" "$CTL" runtime configure --runtime=docker
echo "# edited by the operator" >> /etc/vgpu/config.toml
conf=$(sha256sum < /etc/vgpu/config.toml)
run_holder 1Gi sleep 300
RPM_ID=$ID RPM_PID=$RUN_PID RPM_INIT=$INIT
lib_ino=$(stat -c %i /usr/lib/vgpu/libvgpu_core.so)
rpmx -U "$NEW_RPM" > "$WORK/rpm-upgrade.out" 2>&1
check_eq "rpm -U the new .rpm while it runs (rc)" "$?" 0
check_eq "  ... to the new version" "$(rpm_installed)" "$NEW_RPMV"
check_not "  ... without taking vgpu out of the engines (%preun on upgrade)" grep -q 'removing the vgpu runtime' "$WORK/rpm-upgrade.out"
check "  ... daemon.json still names the shim" grep -q /usr/bin/vgpu-container-runtime "$DAEMON"
check_eq "  ... the operator's config.toml kept (%config(noreplace))" "$(sha256sum < /etc/vgpu/config.toml)" "$conf"
# rpm's rule for an edited %config(noreplace): when the new package's default differs from the old one's,
# the new default lands beside it as config.toml.rpmnew (and stays after an erase, being no package's).
kept=config.toml.rpmsave
if git -C "$REPO" show "$OLD_COMMIT:packaging/config.toml" | cmp -s - "$REPO/packaging/config.toml"; then
    check_not "  ... the packaged default unchanged since the old commit: no config.toml.rpmnew" test -e /etc/vgpu/config.toml.rpmnew
else
    check_eq "  ... the packaged default changed since the old commit: the new one beside it as config.toml.rpmnew" \
        "$(sha256sum < /etc/vgpu/config.toml.rpmnew)" "$(sha256sum < "$REPO/packaging/config.toml")"
    kept=$(printf 'config.toml.rpmnew\nconfig.toml.rpmsave')
fi
check "the container still runs" kill -0 "$RPM_PID"
check_eq "  ... with the interposer it started with" "$(stat -c %i "/proc/$RPM_INIT/root/usr/local/vgpu/libvgpu_core.so")" "$lib_ino"
reads_state "new, from the .rpm" "$RPM_ID" "$GIB" "1.00 GiB"
quota_holds "after rpm -U" "$RPM_ID" "$GIB"
ends "$RPM_ID" "$RPM_PID"
check_eq "the new hook's poststop removes its state" "$(state_left)" ""
rpmx -e vgpu > "$WORK/rpm-erase.out" 2>&1
check_eq "rpm -e (rc)" "$?" 0
check_match "  ... %preun took vgpu out of Docker" "removing the vgpu runtime from docker's configuration" "$(cat "$WORK/rpm-erase.out")"
check_not "  ... daemon.json no longer names the shim" grep -q /usr/bin/vgpu-container-runtime "$DAEMON"
check_eq "  ... rpm knows no vgpu any more" "$(rpm_installed)" ""
check_not "  ... the binaries are gone" test -e /usr/bin/vgpuctl -o -e /usr/bin/vgpu-hook -o -e /usr/lib/vgpu/libvgpu_core.so
check_not "  ... the gc timer is disabled" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
check_eq "  ... the operator's edited config.toml kept aside, nothing else left in /etc/vgpu" \
    "$(ls -A /etc/vgpu 2>&1)" "$kept"
# Every file the .rpm lists and every folder above one, where vgpu's own (named for it).
rpm_paths() { rpm -qpl "$1" 2>/dev/null | while read -r f; do while [ -n "$f" ]; do echo "$f"; f=${f%/*}; done; done | sort -u; }
check_eq "  ... nothing else of the package left (files and folders of its own)" \
    "$(rpm_paths "$NEW_RPM" | while read -r f; do [ -e "$f" ] && case "$f" in /etc/vgpu*) ;; */vgpu*|*/_vgpuctl) echo "$f";; esac; done)" ""
t_done
