#!/usr/bin/env bash
# Host tools a tenant cannot hang or trick, and operator mistakes, with real runc and the fake GPU driver:
# a tenant turns its ledger into a FIFO or a symlink to a host file, or truncates it in a loop, while
# vgpuctl status, vgpuctl gc, another container's create and another container's poststop look at it; a
# state root on a full file system; a state root that is someone else's folder; ids and quotas too small or
# too long; Kubernetes names too long for the limits file, and state gc cannot read. Each case names the
# issue item it covers (issue 13, items 4, 5, 6, 8, 11, 13; issue 25, items 3 and 10).
# `timeout` below only keeps a regression from hanging the suite; a fixed build answers at once.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
VGPUCTL=$T/release/vgpuctl
LEDGER=GPU-fa4ec0de-0000-4000-8000-000000000000.ledger
HANG=60
t_init isolation-host
t_require "$VGPUCTL"
oci_setup

BASE_CONFIG=$VGPU_CONFIG
# A host file a tenant would like to read, and a host FIFO a tool that follows links would block on.
printf 'TOPSECRET-host-file\n' > "$WORK/secret"
mkfifo "$WORK/hostfifo"

# unblock_fifos: holds every FIFO of the state root and the host FIFO open for writing for a while, so that a
# regressed tool blocked opening one returns and the suite goes on (a fixed build never needs it).
unblock_fifos() {
    ( for f in "$WORK/hostfifo" "$STATE"/containers/*/ledgers/*; do [ -p "$f" ] && exec {fd}<>"$f"; done; sleep 20 ) \
        </dev/null >/dev/null 2>&1 &
}
on_exit "unblock_fifos"

# tenant SCRIPT: runs a detached container with a 1 GiB quota that tries SCRIPT (sh) in its ledger folder.
# The folder is not mounted (only the ledger files are: tests/e2e/isolation-container.test.sh), so the
# tenant cannot; SCRIPT is then done on the host side of the folder, as it would be wherever a tenant (or a
# careless operator) could write there, so that the host tools are tried against it all the same. Sets $ID.
tenant() {
    new_bundle sh -c "cd /run/vgpu/ledgers && { $1 ; } 2>/dev/null && echo done > done.mark; echo tried > /tmp/tried; exec sleep 1000"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    shim run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
    wait_for 20 sh -c "$RUNTIME --root '$WORK/rt' exec '$ID' test -e /tmp/tried" || fail "tenant $ID started"
    check_not "tenant $ID cannot do it inside its container" test -e "$STATE/containers/$ID/ledgers/done.mark"
    (cd "$STATE/containers/$ID/ledgers" && eval "$1")
}

# crash ID: the container dies and the engine loses its record, so no poststop ever comes for it.
crash() {
    local pid; pid=$(plain state "$1" | jq -r .pid)
    kill -9 "$pid"
    wait_for 10 sh -c "! kill -0 $pid"
    rm -rf "${WORK:?}/rt/$1"
}

# The tenant's tricks: its ledger a FIFO, more FIFOs, links to a host FIFO and a host file.
TRICKS="rm -f $LEDGER && mkfifo $LEDGER && mkfifo fifo.ledger && ln -s $WORK/hostfifo follow.ledger && ln -s $WORK/secret leak.ledger"

case_fifo_and_symlink_status() {
    echo "-- items 4, 5: a ledger that is a FIFO or a symlink to a host file; vgpuctl status neither hangs nor leaks"
    tenant "$TRICKS"
    local fifo_id=$ID
    tenant "rm -f $LEDGER && ln -s $WORK/secret $LEDGER"
    local link_id=$ID
    local out rc=0
    out=$(timeout -k 5 "$HANG" "$VGPUCTL" status 2>&1) || rc=$?
    unblock_fifos
    check_eq "vgpuctl status returns with a FIFO for a ledger (rc)" "$rc" 0
    check_not "  ... and prints no byte of the host file" grep -qiE "TOPSECRET|54, ?4f|\[54" <<<"$out"
    rc=0; out=$(timeout -k 5 "$HANG" "$VGPUCTL" status --json 2>&1) || rc=$?
    unblock_fifos
    check_eq "vgpuctl status --json returns too (rc)" "$rc" 0
    check_not "  ... and prints no byte of the host file either" grep -qiE "TOPSECRET|54, ?4f|\[54" <<<"$out"
    local err='.containers[] | select(.id == $id) | .gpus[0].error // ""'
    check_match "  ... and says the FIFO is not a regular file" "not a regular file" "$(jq -r --arg id "$fifo_id" "$err" <<<"$out")"
    check_match "  ... and the symlinked ledger is a link it does not follow" "symbolic link" "$(jq -r --arg id "$link_id" "$err" <<<"$out")"
    check "the host file is intact" grep -qx TOPSECRET-host-file "$WORK/secret"
    plain delete -f "$fifo_id" >/dev/null 2>&1
    plain delete -f "$link_id" >/dev/null 2>&1
    check_eq "both removed by their poststop" "$(state_left)" ""
}

case_fifo_and_symlink_gc() {
    echo "-- items 4, 5: a gone tenant's FIFOs and links hang neither gc, nor another container's create or poststop"
    local rc gone
    tenant "$TRICKS"; gone=$ID; crash "$gone"
    rc=0; timeout -k 5 "$HANG" "$VGPUCTL" gc >"$WORK/gc.out" 2>&1 || rc=$?
    unblock_fifos
    check_eq "vgpuctl gc returns (rc)" "$rc" 0
    check_match "  ... and collected the gone container" "removed $gone" "$(cat "$WORK/gc.out")"

    tenant "$TRICKS"; gone=$ID; crash "$gone"
    rc=0; echo '{"id":"another-container","bundle":"/nonexistent"}' | timeout -k 5 "$HANG" "$HOOK" poststop >"$WORK/hook.out" 2>&1 || rc=$?
    unblock_fifos
    check_eq "another container's poststop returns (rc)" "$rc" 0
    check_not "  ... having collected the gone container" test -e "$STATE/containers/$gone"

    tenant "$TRICKS"; gone=$ID; crash "$gone"
    new_bundle rt_client device 0 info
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local out; rc=0; out=$(timeout -k 5 "$HANG" "$SHIM" --root "$WORK/rt" run --bundle "$B" "$ID" 2>&1) || rc=$?
    unblock_fifos
    check_eq "another container's create and run return (rc)" "$rc" 0
    check_eq "  ... and it got its quota" "$(field total "$out")" "$GIB"
    check_not "  ... and its hook collected the gone container" test -e "$STATE/containers/$gone"
    check "the host FIFO is still a FIFO (never opened, never removed)" test -p "$WORK/hostfifo"
    check "the host file is intact" grep -qx TOPSECRET-host-file "$WORK/secret"
    check_eq "no state left" "$(state_left)" ""
}

case_truncate_race() {
    echo "-- item 6: a tenant truncating and re-extending its ledger in a loop cannot kill vgpuctl status"
    tenant "true"
    local id=$ID i rc crashes=0 runs=300
    # The loop runs in the container's background while the host looks.
    plain exec -d "$id" sh -c "while :; do truncate -s 4096 /run/vgpu/ledgers/$LEDGER; truncate -s 262528 /run/vgpu/ledgers/$LEDGER; done"
    for ((i = 0; i < runs; i++)); do
        rc=0; "$VGPUCTL" status >/dev/null 2>&1 || rc=$?
        [ "$rc" -ge 128 ] && crashes=$((crashes + 1))
    done
    check_eq "vgpuctl status killed by a signal in $runs runs" "$crashes" 0
    plain delete -f "$id" >/dev/null 2>&1
    check_eq "no state left" "$(state_left)" ""
}

# refused WHAT EXPECT: creates $B/$ID through the shim expecting failure with one line matching EXPECT,
# nothing under the state root and no container (as oci-cases.sh's bad_case, output in a file: a create that
# wrongly succeeds leaves a container holding its stdio, which a command substitution would wait on).
refused() {
    local what=$1 expect=$2 out rc=0
    shim create --bundle "$B" "$ID" </dev/null >"$WORK/refused.out" 2>&1 || rc=$?
    out=$(cat "$WORK/refused.out")
    if [ "$rc" != 0 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -Eq -- "$expect" <<<"$out"; then
        pass "$what: $out"
    else
        fail "$what (rc=$rc, wanted one line /$expect/)" "$out"
    fi
    check_eq "  ... nothing under the state root" "$(state_left)" ""
    check_eq "  ... no container" "$(plain list -q 2>/dev/null | grep -c "^$ID\$")" 0
}

# with_config KEY=VALUE...: a config like the suite's with these keys replaced or added, exported.
with_config() {
    local kv; cp "$BASE_CONFIG" "$WORK/config-case.toml"
    for kv in "$@"; do
        sed -i "/^${kv%%=*} = /d" "$WORK/config-case.toml"
        echo "${kv%%=*} = ${kv#*=}" >> "$WORK/config-case.toml"
    done
    export VGPU_CONFIG=$WORK/config-case.toml
}

case_full_state_root() {
    echo "-- item 8: a state root on a full file system: the create fails with one line, nothing half-made"
    local small=$WORK/small out
    mkdir -p "$small"
    if ! mount -t tmpfs -o size=128k,mode=0711 tmpfs "$small"; then fail "mount a 128 KiB tmpfs"; return; fi
    on_exit "umount -l '$small'"
    with_config state_root="\"$small\""
    STATE=$small
    new_bundle rt_client device 0 info alloc 64Mi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    refused "shim path, a 128 KiB state root (a ledger takes 256 KiB)" "^vgpu: no space left on the state root $small for the state of container $ID"
    new_bundle rt_client device 0 info alloc 64Mi
    bundle_annotate "$B" vgpu.io/memory-limit 1Gi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    add_hooksd_hooks
    plain run --bundle "$B" "$ID" </dev/null >"$WORK/run.out" 2>&1; out=$(cat "$WORK/run.out")
    check_match "hooks.d path: the container fails with the hook's line" "vgpu: no space left on the state root $small" "$out"
    check_not "  ... and no CUDA process ran (none died of SIGBUS)" grep -q "op=" <<<"$out"
    check_eq "  ... nothing under the state root" "$(state_left)" ""
    check_eq "  ... no container" "$(plain list -q 2>/dev/null | grep -c "^$ID\$")" 0
    umount -l "$small"
    mount -t tmpfs -o size=1m,mode=0711 tmpfs "$small"
    new_bundle rt_client device 0 info alloc 64Mi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_match "a 1 MiB state root holds a container's state: it runs and charges" "op=alloc .*rc=0" "$out"
    umount -l "$small"
    export VGPU_CONFIG=$BASE_CONFIG; STATE=$WORK/state
}

# snap DIR: every path under DIR with its size and mtime.
snap() { (cd "$1" && find . -printf '%p %y %s %T@\n' | sort); }

case_foreign_state_root() {
    echo "-- item 11: a state root that is someone else's folder: gc deletes nothing, create and poststop touch nothing"
    local other=$WORK/varlib before out rc
    # As /var/lib would hold Podman's containers/storage: old, and no vgpu marker anywhere.
    mkdir -p "$other/containers/storage/overlay" "$other/containers/.hidden"
    echo layer > "$other/containers/storage/overlay/layer"
    touch -d '2 hours ago' "$other/containers/storage" "$other/containers/.hidden"
    before=$(snap "$other")
    with_config state_root="\"$other\"" gc_pending_grace_seconds=0
    rc=0; out=$("$VGPUCTL" gc 2>&1) || rc=$?
    check_match "vgpuctl gc says the folder is not vgpu's" "containers is not vgpu's" "$out"
    check_eq "  ... and deleted nothing" "$(snap "$other")" "$before"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    rc=0; shim create --bundle "$B" "$ID" </dev/null >"$WORK/create.out" 2>&1 || rc=$?; out=$(cat "$WORK/create.out")
    check_match "a create there fails with one line" "^vgpu: .*containers is not vgpu's.*state_root" "$out"
    check_eq "  ... (one line, rc != 0)" "$(grep -c . <<<"$out")/$((rc != 0))" "1/1"
    check_eq "  ... and wrote nothing" "$(snap "$other")" "$before"
    echo '{"id":"storage","bundle":"/nonexistent"}' | "$HOOK" poststop >/dev/null 2>&1
    check_eq "a poststop for a container named storage deletes nothing" "$(snap "$other")" "$before"

    echo "-- item 11: vgpu's own state root, with a folder vgpu did not make under a container's name"
    with_config gc_pending_grace_seconds=0
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    check "a container runs (the state root is vgpu's)" shim run --bundle "$B" "$ID"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    mkdir -p "$STATE/containers/$ID/keep"
    echo mine > "$STATE/containers/$ID/keep/file"
    touch -d '2 hours ago' "$STATE/containers/$ID"
    before=$(snap "$STATE/containers/$ID")
    rc=0; shim create --bundle "$B" "$ID" </dev/null >"$WORK/create.out" 2>&1 || rc=$?; out=$(cat "$WORK/create.out")
    check_match "a create with that id fails with one line" "^vgpu: .*/$ID exists and was not made by vgpu" "$out"
    check_eq "  ... (one line, rc != 0)" "$(grep -c . <<<"$out")/$((rc != 0))" "1/1"
    check_eq "  ... and replaced nothing" "$(snap "$STATE/containers/$ID")" "$before"
    out=$("$VGPUCTL" gc 2>&1)
    check_match "vgpuctl gc skips it with a line" "$ID: not a container's state \(holds no vgpu marker" "$out"
    echo "{\"id\":\"$ID\",\"bundle\":\"/nonexistent\"}" | "$HOOK" poststop >/dev/null 2>&1
    check_eq "  ... and neither gc nor a poststop for that id touched it" "$(snap "$STATE/containers/$ID")" "$before"
    rm -rf "${STATE:?}/containers/$ID"
    export VGPU_CONFIG=$BASE_CONFIG
}

case_small_things() {
    echo "-- item 13: quotas no CUDA context fits in, and a container id too long for a file name"
    local v
    for v in 1 0.0000001Gi 63Mi; do
        new_bundle true
        bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
        bundle_annotate "$B" vgpu.io/memory-limit "$v"
        refused "annotation quota $v" "below the smallest quota vgpu accepts, 64.0 MiB"
        new_bundle true
        bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT="$v"
        refused "env quota $v" "env CUDA_DEVICE_MEMORY_LIMIT=.*below the smallest quota"
    done
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    ID=$(printf 'x%.0s' {1..256})
    refused "a 256-byte container id" "invalid container id .*longer than 200 bytes"
    new_bundle rt_client device 0 info
    # A context of the fake GPU's default size (256 MiB) would not fit in 64 MiB.
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=64Mi FAKE_CUDA_CONTEXT_BYTES=16Mi
    ID=$(printf 'y%.0s' {1..200})
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_eq "a 200-byte id (the longest) with a 64 MiB quota (the smallest) runs" "$(field total "$out")" $((64 * MIB))
    check_eq "  ... and leaves nothing" "$(state_left)" ""
}

case_image_preload_not_opened() {
    echo "-- issue 25 item 10: an image whose /etc/ld.so.preload is a FIFO or a device node: refused, never opened"
    local r=$WORK/oddroot out rc writer
    rm -rf "$r"; cp -a "$ROOTFS" "$r"; rm -f "$r/etc/ld.so.preload"; mkfifo "$r/etc/ld.so.preload"
    # A writer waiting on the FIFO: only somebody opening it for reading releases it.
    rm -f "$WORK/fifo.released"
    ( exec 3>"$r/etc/ld.so.preload"; echo released > "$WORK/fifo.released" ) </dev/null >/dev/null 2>&1 &
    writer=$!
    new_bundle true
    bundle_jq "$B" '.root.path = $r' --arg r "$r"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    rc=0; timeout -k 5 "$HANG" "$SHIM" --root "$WORK/rt" create --bundle "$B" "$ID" </dev/null >"$WORK/create.out" 2>&1 || rc=$?
    out=$(cat "$WORK/create.out")
    check_match "a FIFO: the create fails with one line naming it" "^vgpu: .*/etc/ld.so.preload .*not a regular file" "$out"
    check_eq "  ... (one line, rc != 0)" "$(grep -c . <<<"$out")/$((rc != 0))" "1/1"
    sleep 0.3
    check_not "  ... and the FIFO was never opened: its waiting writer still waits" test -e "$WORK/fifo.released"
    kill "$writer" 2>/dev/null; wait "$writer" 2>/dev/null
    check_eq "  ... and nothing is left provisioned" "$(state_left)" ""
    plain delete -f "$ID" >/dev/null 2>&1
    rm -f "$r/etc/ld.so.preload"; mknod "$r/etc/ld.so.preload" c 1 3
    new_bundle true
    bundle_jq "$B" '.root.path = $r' --arg r "$r"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    rc=0; timeout -k 5 "$HANG" "$SHIM" --root "$WORK/rt" create --bundle "$B" "$ID" </dev/null >"$WORK/create.out" 2>&1 || rc=$?
    out=$(cat "$WORK/create.out")
    check_match "a character device: refused with one line too" "^vgpu: .*/etc/ld.so.preload .*not a regular file" "$out"
    check_eq "  ... (one line, rc != 0)" "$(grep -c . <<<"$out")/$((rc != 0))" "1/1"
    check_eq "  ... and nothing is left provisioned" "$(state_left)" ""
    plain delete -f "$ID" >/dev/null 2>&1
    rm -rf "$r"
}

case_oversized_names_and_unreadable_limits() {
    echo "-- issue 25 item 3: 128 KiB pod names are refused; a running container's unreadable limits.json survives gc"
    local k out rc id
    for k in io.kubernetes.pod.name io.kubernetes.pod.namespace io.kubernetes.cri.sandbox-name; do
        new_bundle true
        bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
        bundle_jq "$B" '.annotations[$k] = ("a" * 131072)' --arg k "$k"
        refused "annotation $k of 128 KiB" "^vgpu: annotation $k: \"a{40}\"\.\.\. \(131072 bytes\) is not a Kubernetes"
    done
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    bundle_annotate "$B" io.kubernetes.pod.name 'p"} 0'
    refused "a pod name with a quote and a brace" "^vgpu: annotation io.kubernetes.pod.name: .* is not a Kubernetes pod name"
    # A running container (its process uses no CUDA: no ledger slot tells gc it lives) whose limits file the
    # host can no longer read: larger than the readers' cap, as 1.5 MiB of names made it.
    tenant "true"; id=$ID
    head -c $((2 << 20)) /dev/zero | tr '\0' ' ' > "$STATE/containers/$id/limits.json.big"
    mv "$STATE/containers/$id/limits.json.big" "$STATE/containers/$id/limits.json"
    with_config gc_pending_grace_seconds=0
    sleep 0.1
    rc=0; out=$("$VGPUCTL" gc 2>&1) || rc=$?
    check "the container still runs" sh -c "$RUNTIME --root '$WORK/rt' state '$id' | jq -e '.status == \"running\"'"
    check "  ... and vgpuctl gc kept its state" test -d "$STATE/containers/$id"
    check_match "  ... and said so in one line" "$id/limits.json: .*more than such a file can be.*kept: its container may still be running" "$out"
    check_eq "  ... (rc != 0: a folder it could not collect)" "$((rc != 0))" 1
    export VGPU_CONFIG=$BASE_CONFIG
    plain delete -f "$id" >/dev/null 2>&1
    check_eq "its poststop removes it" "$(state_left)" ""
}

case_oversized_names_and_unreadable_limits
case_fifo_and_symlink_status
case_fifo_and_symlink_gc
case_truncate_race
case_full_state_root
case_foreign_state_root
case_small_things
case_image_preload_not_opened
t_done
