#!/usr/bin/env bash
# What a tenant cannot do to its own quota or to anybody else's, with real runc containers on the fake GPU
# driver, and what the standalone (environment) mode keeps apart between users of one host:
#   - a process's own VGPU_LIMITS_FILE / CUDA_DEVICE_MEMORY_LIMIT cannot replace the container's limits file;
#   - the library never creates a ledger in a container (a missing one refuses CUDA);
#   - the ledgers are bind-mounted files: the tenant cannot delete them, nor put anything (files, FIFOs) in
#     the host's state folder, and the measurement lock needs no file of its own;
#   - a broken vgpu config does not stop the shim passing list/state/kill/delete through;
#   - a create with the id of a live container, or a failing one, never removes the live container's state;
#   - the standalone mode's default ledgers are per user (0700 folder), never in a folder users share.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
RUNTIME=runc
. "$(dirname "$0")/lib/oci-cases.sh"
t_init isolation-container
oci_setup
UUID0=GPU-fa4ec0de-0000-4000-8000-000000000000

# detached: runs $B/$ID through the shim, detached; the container's command should end by touching
# /out/done and then block; waits for that mark. /out is $WORK/out$N on the host.
detached() {
    mkdir -p "$WORK/out$N"
    bundle_bind "$B" "$WORK/out$N" /out
    shim run -d --bundle "$B" "$ID" </dev/null >"$WORK/run$N.log" 2>&1 || { cat "$WORK/run$N.log"; return 1; }
    wait_for 30 test -e "$WORK/out$N/done"
}

echo "-- the mounted limits file is the only source in a container"
new_bundle sh -c '
    mkdir -p /tmp/ledgers
    sed "s/\"memory_limit\": *[0-9]*/\"memory_limit\": 8589934592/" /run/vgpu/limits.json > /tmp/big.json
    VGPU_LIMITS_FILE=/tmp/big.json CUDA_DEVICE_MEMORY_LIMIT=8G rt_client device 0 info'
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_eq "VGPU_LIMITS_FILE naming a copy with 8 GiB: still the container's 1 GiB" "$(field total "$out")" "$GIB"
new_bundle rt_client device 0 info
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
bundle_jq "$B" '.process.env |= map(select(startswith("VGPU_LIMITS_FILE=") | not))'
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_eq "without VGPU_LIMITS_FILE in the env the mounted file still applies" "$(field total "$out")" "$GIB"

echo "-- the tenant cannot reset its quota by deleting its ledger"
# A holds 700 MiB (+ its 256 MiB context) of 1500 MiB; the tenant deletes the ledger; B's 700 MiB must not fit.
new_bundle sh -c '
    mkfifo /tmp/go
    rt_client device 0 !alloc 700Mi wait </tmp/go >/tmp/a.out 2>&1 &
    exec 3>/tmp/go
    until grep -q ready /tmp/a.out; do sleep 0.1; done
    rm -f /run/vgpu/ledgers/*.ledger 2>/dev/null && echo ledger-deleted
    rt_client device 0 alloc 700Mi
    echo >&3; wait'
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1500Mi
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_not "the ledger cannot be deleted" grep -q ledger-deleted <<<"$out"
check_match "a new process after the attempt is still held to the shared quota" \
    'op=alloc size=734003200 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"

echo "-- the ledgers are bind-mounted files: nothing lands in the host's state folder"
new_bundle sh -c '
    touch /run/vgpu/ledgers/junk 2>/dev/null
    mkfifo /run/vgpu/ledgers/fifo 2>/dev/null
    ln -s /etc/passwd /run/vgpu/ledgers/link 2>/dev/null
    rt_client device 0 ctx info > /out/client.out 2>&1
    touch /out/done; exec sleep 1000'
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
if check "container started" detached; then
    check_eq "the host's ledger folder holds the ledger alone (no junk, FIFO, link or .measure file)" \
        "$(ls -A "$STATE/containers/$ID/ledgers")" "$UUID0.ledger"
    check_match "the container's CUDA (context creations under the measurement lock) works" \
        'op=ctx .*rc=0' "$(cat "$WORK/out$N/client.out")"
    check_eq "the tenant's ledger is a mount of the host's file" \
        "$(plain exec "$ID" stat -c %i "/run/vgpu/ledgers/$UUID0.ledger")" "$(stat -c %i "$STATE/containers/$ID/ledgers/$UUID0.ledger")"
    plain delete -f "$ID" >/dev/null 2>&1
fi
check_eq "no state left" "$(state_left)" ""

echo "-- the library never creates a ledger in a container"
# No quota through vgpu: the limits file and an empty ledger folder are mounted by hand.
mkdir -p "$WORK/hand/ledgers"
cat >"$WORK/hand/limits.json" <<J
{"version":1,"container_id":"hand","devices":[{"index":0,"uuid":"$UUID0","memory_limit":$GIB,"ledger":"ledgers/$UUID0.ledger"}]}
J
hand_bundle() {
    new_bundle rt_client device 0 info
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 LD_PRELOAD=/usr/local/vgpu/libvgpu.so
    bundle_bind "$B" "$T/vgpu" /usr/local/vgpu ro
    bundle_bind "$B" "$WORK/hand/limits.json" /run/vgpu/limits.json ro
    bundle_bind "$B" "$WORK/hand/ledgers" /run/vgpu/ledgers
}
hand_bundle
out=$(plain run --bundle "$B" "$ID" 2>&1)
check_match "missing ledger: CUDA refused (cuInit rc=3)" '^op=init .*rc=3' "$out"
check_eq "  ... with one line naming the ledger" "$(grep -v '^op=' <<<"$out" | grep -c "ledgers/$UUID0.ledger")/$(grep -vc '^op=' <<<"$out")" "1/1"
check_eq "  ... and no ledger created" "$(ls -A "$WORK/hand/ledgers")" ""
rm -f "$WORK/hand/ledgers/"*; mkfifo "$WORK/hand/ledgers/$UUID0.ledger"
hand_bundle
out=$(plain run --bundle "$B" "$ID" 2>&1)
check_match "a FIFO as the ledger: CUDA refused (cuInit rc=3)" '^op=init .*rc=3' "$out"
check_eq "  ... with one line naming it" "$(grep -v '^op=' <<<"$out" | grep -c "ledgers/$UUID0.ledger")/$(grep -vc '^op=' <<<"$out")" "1/1"
rm -f "$WORK/hand/ledgers/$UUID0.ledger"

echo "-- a broken vgpu config: every verb but create still reaches the lower runtime"
new_bundle sleep 1000
plain run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
echo 'state_root = [' > "$WORK/bad.toml"
bad() { VGPU_CONFIG=$WORK/bad.toml shim "$@"; }
check_match "list" "^$ID\$" "$(bad list -q 2>/dev/null)"
check_match "state" '"status": *"running"' "$(bad state "$ID" 2>/dev/null)"
bad state "$ID" >/dev/null 2>"$WORK/bad.err"
check_eq "  ... the config error on stderr, once" "$(grep -c 'bad.toml' "$WORK/bad.err")/$(grep -c . "$WORK/bad.err")" "1/1"
check "kill" bad kill "$ID" KILL
wait_for 10 sh -c "runc --root '$WORK/rt' state '$ID' | jq -e '.status == \"stopped\"'"
check "delete -f" bad delete -f "$ID"
check_eq "  ... the container is gone" "$(plain list -q | grep -c "^$ID\$")" 0
check "a named config that does not exist: list still works" env VGPU_CONFIG="$WORK/none.toml" "$SHIM" --root "$WORK/rt" list
printf '#!/bin/sh\necho "other-lower $*"\n' > "$WORK/other-lower"; chmod +x "$WORK/other-lower"
printf 'lower_runtime = "%s"\nlog_level = "loud"\n' "$WORK/other-lower" > "$WORK/half.toml"
check_eq "an invalid config that still names lower_runtime: that runtime gets the verb" \
    "$(VGPU_CONFIG=$WORK/half.toml "$SHIM" --root /x list 2>/dev/null)" "other-lower --root /x list"
new_bundle true
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
out=$(VGPU_CONFIG=$WORK/bad.toml shim create --bundle "$B" "$ID" 2>&1)
check_match "create with a broken config fails with a line naming it" 'vgpu: .*bad.toml' "$out"
check_eq "  ... and creates nothing" "$(plain list -q | grep -c "^$ID\$")/$(state_left)" "0/"

echo "-- a create with a live container's id leaves that container's state alone"
new_bundle sh -c 'touch /out/done; exec sleep 1000'
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
if check "container A started" detached; then
    live=$ID
    limits_before=$(cat "$STATE/containers/$live/limits.json")
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=2G
    out=$(shim create --bundle "$B" "$live" 2>&1)
    check_match "a second create with A's id fails" 'already exists' "$out"
    check_eq "  ... A's state is still there, unchanged" "$(cat "$STATE/containers/$live/limits.json" 2>&1)" "$limits_before"
    out=$(plain exec "$live" rt_client device 0 info alloc 64Mi 2>&1)
    check_match "  ... and a new CUDA process in A still gets A's 1 GiB quota" "^op=info .*total=$GIB .*rc=0" "$out"
    check_match "  ... and can allocate" '^op=alloc .*rc=0' "$out"
    plain delete -f "$live" >/dev/null 2>&1
fi
check_eq "no state left" "$(state_left)" ""

echo "-- standalone mode: the default ledgers are per user"
U=40123; U2=40124
S=$WORK/standalone; mkdir -p "$S/fake" "$S/fake$U"; chmod 777 "$S" "$S/fake$U"
solo() { env -u CUDA_DEVICE_MEMORY_SHARED_CACHE LD_LIBRARY_PATH="$FAKE_DIR" FAKE_CUDA_STATE_DIR="$S/fake" \
    LD_PRELOAD="$LIBVGPU" CUDA_DEVICE_MEMORY_LIMIT=1g "$@"; }
mkdir -m 700 "$S/xdg"
out=$(XDG_RUNTIME_DIR=$S/xdg solo "$CLIENTS_DIR/rt_client" info 2>&1)
check_match "XDG_RUNTIME_DIR set: the quota applies" "^op=info .*total=$GIB" "$out"
check "  ... and the ledger is in \$XDG_RUNTIME_DIR/vgpu/" test -f "$S/xdg/vgpu/cudevshr.cache.$UUID0"
check_eq "  ... a 0700 folder" "$(stat -c %a "$S/xdg/vgpu" 2>&1)" 700
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups env -u XDG_RUNTIME_DIR "$@"; }
rm -rf "/tmp/vgpu-$U"; on_exit "rm -rf /tmp/vgpu-$U"
out=$(as $U env LD_LIBRARY_PATH="$FAKE_DIR" FAKE_CUDA_STATE_DIR="$S/fake$U" LD_PRELOAD="$LIBVGPU" \
    CUDA_DEVICE_MEMORY_LIMIT=1g "$CLIENTS_DIR/rt_client" info 2>&1)
check_match "no XDG_RUNTIME_DIR: the quota applies for user $U" "^op=info .*total=$GIB" "$out"
check_eq "  ... with its ledger in /tmp/vgpu-$U/, a 0700 folder of its own" \
    "$(stat -c '%u %a' "/tmp/vgpu-$U" 2>&1)/$(stat -c %u "/tmp/vgpu-$U/cudevshr.cache.$UUID0" 2>&1)" "$U 700/$U"
check_not "another user cannot truncate it" as $U2 truncate -s 0 "/tmp/vgpu-$U/cudevshr.cache.$UUID0"
rm -rf "/tmp/vgpu-$U"; mkdir -m 755 "/tmp/vgpu-$U"; chown $U2 "/tmp/vgpu-$U"
out=$(as $U env LD_LIBRARY_PATH="$FAKE_DIR" FAKE_CUDA_STATE_DIR="$S/fake$U" LD_PRELOAD="$LIBVGPU" \
    CUDA_DEVICE_MEMORY_LIMIT=1g "$CLIENTS_DIR/rt_client" info 2>&1)
check_match "/tmp/vgpu-$U made by another user: CUDA refused (cuInit rc=3)" '^op=init .*rc=3' "$out"
check_eq "  ... with one line naming the folder" "$(grep -v '^op=' <<<"$out" | grep -c "/tmp/vgpu-$U")/$(grep -vc '^op=' <<<"$out")" "1/1"
check_eq "  ... and nothing written in it" "$(ls -A "/tmp/vgpu-$U")" ""
rm -rf "/tmp/vgpu-$U"
out=$(CUDA_DEVICE_MEMORY_SHARED_CACHE=$S/shared XDG_RUNTIME_DIR=$S/xdg env LD_LIBRARY_PATH="$FAKE_DIR" \
    FAKE_CUDA_STATE_DIR="$S/fake" LD_PRELOAD="$LIBVGPU" CUDA_DEVICE_MEMORY_LIMIT=1g "$CLIENTS_DIR/rt_client" info 2>&1)
check_eq "CUDA_DEVICE_MEMORY_SHARED_CACHE: the ledger made there is for its owner only" \
    "$(stat -c %a "$S/shared.$UUID0" 2>&1)" 600
chmod 666 "$S/shared.$UUID0"
out=$(CUDA_DEVICE_MEMORY_SHARED_CACHE=$S/shared env LD_LIBRARY_PATH="$FAKE_DIR" \
    FAKE_CUDA_STATE_DIR="$S/fake" LD_PRELOAD="$LIBVGPU" CUDA_DEVICE_MEMORY_LIMIT=1g "$CLIENTS_DIR/rt_client" info 2>&1)
check_match "a ledger other users can write is not used: CUDA refused (cuInit rc=3)" '^op=init .*rc=3' "$out"
check_eq "  ... with one line naming it" "$(grep -v '^op=' <<<"$out" | grep -c "shared.$UUID0")/$(grep -vc '^op=' <<<"$out")" "1/1"

t_done
