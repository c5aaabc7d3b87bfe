#!/usr/bin/env bash
# `vgpuctl update` (issue 27) with real runc, the shim and the fake GPU (16 GiB; a context costs 256 MiB):
# a process already running under a 1 GiB quota sees 2 GiB within a second of the update and can then hold
# 1.5 GiB; shrinking back to 1 GiB below its use refuses its next allocation, keeps what it holds, and
# status and the monitor say "over quota by ... (pending shrink)"; a grow past the GPU is refused with
# nothing changed; a compute share changed from 30% to 60% shows in the bucket's rate, and its request (its
# floor, issue 42) is changed within its limit, refused above it in one line; two updates racing
# each other and a create leave admission's sum exact; bad input is one line. A tenant that, after a
# shrink, writes its ledger's generation word back (or keeps it odd) still gets the shrink within a
# second: the library reads the read-only limits file itself.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
t_init update
VGPUCTL=$T/release/vgpuctl
t_require "$VGPUCTL" "$(command -v curl)"
oci_setup
GPU0=GPU-fa4ec0de-0000-4000-8000-000000000000

# The fake NVML reads the suite's fake GPU (a shrink measures what the container holds there).
update() { FAKE_CUDA_STATE_DIR=$FAKESTATE "$VGPUCTL" update --state-root "$STATE" "$@"; }
gone() { plain delete -f "$1" >/dev/null 2>&1; }
status_json() { "$VGPUCTL" status --json --state-root "$STATE"; }
# gpu_of ID JQ: a field of container ID's GPU 0 in `vgpuctl status --json`.
gpu_of() { status_json | jq -r --arg id "$1" ".containers[] | select(.id == \$id) | .gpus[0] | $2"; }
# nth_line N OP: the N-th output line of op OP in the running container's log.
nth_line() { grep "op=$2" "$WORK/create.log" | sed -n "${1}p"; }
ready() { [ "$(grep -c 'op=await ready' "$WORK/create.log")" -ge "$1" ]; }
now_ms() { date +%s%3N; }
# generation ID: the limits generation in container ID's ledger (header bytes 168..175).
generation() {
    python3 -c 'import struct,sys; print(struct.unpack_from("<Q", open(sys.argv[1],"rb").read(), 168)[0])' \
        "$STATE/containers/$1/ledgers/$GPU0.ledger"
}
# sleeper ID LIMIT: a running container (no CUDA) with a quota of LIMIT on GPU 0, its owner recorded.
sleeper() {
    new_bundle sleep 120
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT="$2"
    ID=$1
    create_quiet && shim start "$ID"
}

echo "-- a running process sees its quota grow within a second and can hold 1.5 GiB; a shrink keeps what it holds"
G=$WORK/fakestate
rm -f "$G"/go*
new_bundle rt_client device 0 info alloc 600Mi alloc 936Mi await /fakestate/go1 watch-total 2Gi 5 alloc 936Mi info \
    await /fakestate/go2 watch-total 1Gi 5 alloc 64Mi await /fakestate/go3 free-last alloc 64Mi await /fakestate/go4
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G LIBCUDA_LOG_LEVEL=2
RUN=$ID
check "the container is created and started" eval 'create_quiet && shim start "$RUN"'
wait_for 20 ready 1 || fail "the process reached its first wait" "$(cat "$WORK/create.log")"
check_eq "  ... it sees 1 GiB" "$(field total "$(nth_line 1 info)")" "$GIB"
check_match "  ... and 1.5 GiB does not fit (600 MiB held)" 'size=981467136 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$(nth_line 2 alloc)"
touch "$G/go1"
sleep 0.5
t0=$(now_ms)
out=$(update "$RUN" --memory-limit 2Gi 2>&1)
rc=$?; t1=$(now_ms)
check_eq "vgpuctl update --memory-limit 2Gi succeeds" "$rc" 0
check_match "  ... saying what changed" "GPU 0 \($GPU0\) memory limit 1.00 GiB -> 2.00 GiB \(update 1\)" "$out"
wait_for 10 ready 2 || fail "the process reached its second wait" "$(cat "$WORK/create.log")"
w=$(nth_line 1 watch-total)
check_match "  ... the running process saw a total of 2 GiB" "total=$((2 * GIB)) .*rc=0" "$w"
seen=$(field seen_ms "$w")
if [ -n "$seen" ] && [ "$seen" -le $((t1 + 1000)) ] && [ "$seen" -ge "$t0" ]; then
    pass "  ... within a second of the update ($((seen - t1)) ms after it returned; the update took $((t1 - t0)) ms)"
else fail "  ... within a second of the update (update $t0..$t1, seen at ${seen:-never})" "$w"; fi
check_match "  ... and now holds 1.5 GiB (a second 936 MiB)" 'size=981467136 .*rc=0' "$(nth_line 3 alloc)"
check_eq "  ... its cuMemGetInfo says 2 GiB" "$(field total "$(nth_line 2 info)")" $((2 * GIB))
check_match "  ... the library logged the update" 'quota updated by the host, 1073741824 -> 2147483648 bytes' "$(cat "$WORK/create.log")"
check_eq "  ... limits.json records one update" "$(jq -r .updates "$STATE/containers/$RUN/limits.json")" 1

touch "$G/go2"
sleep 0.5
out=$(update "$RUN" --memory-limit 1Gi 2>&1)
check_match "shrinking back to 1 GiB below its use is accepted, saying the shrink is pending" \
    'GPU 0 holds 1.75 GiB, over its new quota by 768 MiB \(pending shrink\)' "$out"
wait_for 10 ready 3 || fail "the process reached its third wait" "$(cat "$WORK/create.log")"
check_match "  ... the process sees 1 GiB" "total=$GIB .*rc=0" "$(nth_line 2 watch-total)"
check_match "  ... and its next allocation (64 MiB) is refused" 'size=67108864 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$(nth_line 4 alloc)"
check_eq "  ... what it holds is kept (context + 1.5 GiB in the ledger)" "$(gpu_of "$RUN" .used)" $((1792 * MIB))
check_eq "  ... status --json: over quota by 768 MiB" "$(gpu_of "$RUN" .over_quota)" $((768 * MIB))
check_eq "  ... a pending shrink" "$(gpu_of "$RUN" .pending_shrink)" true
check_match "  ... the table says so" 'over quota by 768 MiB \(pending shrink\)' "$("$VGPUCTL" status --state-root "$STATE")"
scrape=$("$VGPUCTL" monitor --once --state-root "$STATE" 2>&1)
check_match "  ... the monitor exports the pending shrink" "vgpu_memory_pending_shrink_bytes\{.*container_id=\"$RUN\".*\} $((768 * MIB))" "$scrape"
check_match "  ... and two updates" "vgpu_container_updates_total\{.*container_id=\"$RUN\".*\} 2" "$scrape"
check_match "  ... and the last one's time" "vgpu_container_last_update_timestamp_seconds\{.*container_id=\"$RUN\".*\} [0-9]{10}" "$scrape"
touch "$G/go3"
wait_for 10 ready 4 || fail "the process reached its last wait" "$(cat "$WORK/create.log")"
check_match "once it freed 936 MiB, under the new quota, 64 MiB is allocated again" 'size=67108864 .*rc=0' "$(nth_line 5 alloc)"
touch "$G/go4"
gone "$RUN"

echo "-- a tenant that hides a shrink behind its ledger's generation word still gets it within a second"
# The word is in the tenant's ledger (bytes 168..175). Writing back the value its processes applied hid
# every update from them (issue 48: after a shrink the library kept the old quota and granted more); and
# a word kept odd hid one for the second the library waits for a host still writing. The library now
# also looks at the read-only limits file itself once a second, whatever the word says.
for how in back odd; do
    rm -f "$G"/hide*
    new_bundle rt_client device 0 alloc 1Gi await /fakestate/hide1 alloc 512Mi info await /fakestate/hide2
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=2G
    HID=$ID
    check "[$how] a container with a 2 GiB quota holds 1 GiB (1.25 GiB with its context)" eval 'create_quiet && shim start "$HID"'
    wait_for 20 ready 1 || fail "the process reached its first wait" "$(cat "$WORK/create.log")"
    out=$(update "$HID" --memory-limit 1Gi 2>&1)
    check_match "  ... vgpuctl update --memory-limit 1Gi: a pending shrink" 'over its new quota by 256 MiB \(pending shrink\)' "$out"
    gen1=$(generation "$HID")
    if [ "$how" = back ]; then
        # The tenant, from inside its container, writes back the generation its process applied (0: the
        # file as it was loaded at start).
        plain exec "$HID" sh -c "printf '\\000\\000\\000\\000\\000\\000\\000\\000' | dd of=/run/vgpu/ledgers/$GPU0.ledger bs=1 seek=168 count=8 conv=notrunc 2>/dev/null"
        check_eq "  ... the tenant wrote its applied generation back (the update's: $gen1)" "$(generation "$HID")" 0
    else
        plain exec "$HID" sh -c "printf '\\001' | dd of=/run/vgpu/ledgers/$GPU0.ledger bs=1 seek=168 count=1 conv=notrunc 2>/dev/null"
        check_match "  ... the tenant made its ledger's generation odd" '[13579]$' "$(generation "$HID")"
    fi
    # A second and a bit: the file's watch comes due whatever the process did meanwhile.
    sleep 1.2
    touch "$G/hide1"
    wait_for 10 ready 2 || fail "the process reached its second wait" "$(cat "$WORK/create.log")"
    check_match "  ... its next allocation reads the shrink from the limits file: 512 MiB more is refused" \
        'size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$(nth_line 2 alloc)"
    check_eq "  ... its cuMemGetInfo says 1 GiB" "$(field total "$(nth_line 1 info)")" "$GIB"
    touch "$G/hide2"
    gone "$HID"
done

echo "-- a grow past the GPU is refused as at creation, nothing changed"
sleeper upd-a 4G
sleeper upd-b 12G
sum() { "$VGPUCTL" status --json --state-root "$STATE" | jq -r --arg u "$GPU0" '.gpus[] | select(.uuid == $u) | .committed'; }
before=$(sha256sum "$STATE"/containers/upd-a/limits*.json)
gen=$(generation upd-a)
out=$(update upd-a --memory-limit 8Gi 2>&1); rc=$?
check "refused (exit $rc)" test "$rc" != 0
check_eq "  ... with one line" "$(printf '%s\n' "$out" | grep -c .)" 1
check_match "  ... naming the GPU, the sum and the figure" \
    "admission: GPU 0 \($GPU0\) would have 20.0 GiB of quotas committed \(12.0 GiB already, 8.00 GiB asked for\), more than its 16.0 GiB" "$out"
check_eq "  ... limits.json and the container's copy unchanged" "$(sha256sum "$STATE"/containers/upd-a/limits*.json)" "$before"
check_eq "  ... the ledgers' generation unchanged" "$(generation upd-a)" "$gen"
check_eq "  ... admission's sum unchanged" "$(sum)" $((16 * GIB))
gone upd-b

echo "-- two updates racing each other and a create leave admission's sum exact"
sleeper upd-b 4G
for round in 1 2 3; do
    new_bundle sleep 120
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=4G
    c=$ID
    update upd-a --memory-limit 8Gi >"$WORK/ra" 2>&1 & pa=$!
    update upd-b --memory-limit 8Gi >"$WORK/rb" 2>&1 & pb=$!
    shim create --bundle "$B" "$c" </dev/null >"$WORK/rc.log" 2>&1 & pc=$!
    wait $pa; ra=$?; wait $pb; rb=$?; wait $pc; rcr=$?
    ok=$(( (ra == 0) + (rb == 0) + (rcr == 0) ))
    check_eq "round $round: two of the three succeed (a=$ra b=$rb create=$rcr)" "$ok" 2
    check_eq "  ... the quotas add up to the GPU exactly" "$(sum)" $((16 * GIB))
    quotas=$(for id in upd-a upd-b "$c"; do jq -r '.devices[0].memory_limit' "$STATE/containers/$id/limits.json" 2>/dev/null || echo 0; done | awk '{ s += $1 } END { printf "%.0f", s }')
    check_eq "  ... and the sum is what each one's limits.json says" "$quotas" $((16 * GIB))
    gone "$c"
    update upd-a --memory-limit 4Gi >/dev/null 2>&1; update upd-b --memory-limit 4Gi >/dev/null 2>&1
done
gone upd-a; gone upd-b

echo "-- a compute share changed from 30% to 60% shows in the bucket's rate"
new_bundle rt_client module work 16
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 FAKE_CUDA_KERNEL_US=2000
bundle_annotate "$B" vgpu.io/compute-limit 30
bundle_annotate "$B" vgpu.io/compute-window 200ms
CID=$ID
check "a container with a 30% share runs a saturating loop" eval 'create_quiet && shim start "$CID"'
charged() { gpu_of "$CID" .compute.charged_ns; }
# rate: percent of wall time charged to the bucket over SECONDS.
rate() {
    local a b t0 t1
    a=$(charged); t0=$(date +%s%N); sleep "$1"; b=$(charged); t1=$(date +%s%N)
    echo $(( (b - a) * 100 / (t1 - t0) ))
}
sleep 2
r1=$(rate 3)
update "$CID" --compute-limit 60 >/dev/null 2>&1
check_eq "vgpuctl update --compute-limit 60: status shows 60%" "$(gpu_of "$CID" .compute.limit_percent)" 60
sleep 1
r2=$(rate 3)
between() { if [ "$2" -ge "$3" ] && [ "$2" -le "$4" ]; then pass "$1 ($2%)"; else fail "$1: $2% not in [$3, $4]"; fi; }
between "  ... the bucket was charged at about 30% before" "$r1" 20 40
between "  ... and at about 60% after" "$r2" 45 75
# issue 42: its request (the floor), a limit alone's own before (60), changed live and admitted.
out=$(update "$CID" --compute-request 20 2>&1)
check_match "vgpuctl update --compute-request 20: says what changed" "GPU 0 \(GPU-[^)]+\) compute request 60% -> 20%" "$out"
check_eq "  ... status shows request 20, limit 60" "$(gpu_of "$CID" '.compute | "\(.request_percent) \(.limit_percent)"')" "20 60"
check_eq "  ... and limits.json (the mounted copy too)" \
    "$(jq -c '.devices[0] | [.compute_request, .compute_limit]' "$STATE/containers/$CID/limits.json" "$STATE/containers/$CID/limits.mounted.json" | sort -u)" "[20,60]"
out=$(update "$CID" --compute-request 70 2>&1); rc=$?
check "  ... a request above its limit (70 > 60) is refused (exit $rc)" test "$rc" -ne 0
check_match "  ... in one line naming --compute-request" "^vgpuctl: .*--compute-request: container $CID's GPU 0 .* would have a compute request of 70% above its compute limit of 60%" "$out"
check "  ... both together are fine" update "$CID" --compute-request 70 --compute-limit 80
check_eq "  ... status: request 70, limit 80" "$(gpu_of "$CID" '.compute | "\(.request_percent) \(.limit_percent)"')" "70 80"
gone "$CID"

echo "-- a container that has exited (not yet deleted) is not updated"
# Its limits.json names an init that no longer runs: an update once landed (1 GiB -> 15 GiB) and
# admission then refused others for a quota nobody used (issue 44).
new_bundle sleep 0
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
EXITED=$ID
check "a container whose process exits at once is created and started" eval 'create_quiet && shim start "$EXITED"'
wait_for 10 eval '! running "$EXITED"' || fail "the container's process exited" "$(plain state "$EXITED" 2>&1)"
out=$(update "$EXITED" --memory-limit 15Gi 2>&1); rc=$?
check "vgpuctl update of the exited container is refused (exit $rc)" test "$rc" -ne 0
check_match "  ... saying it has exited" "^vgpuctl: .*container $EXITED has exited" "$out"
check_eq "  ... in one line" "$(printf '%s\n' "$out" | wc -l)" 1
check_eq "  ... and limits.json records no update" "$(jq -r ".updates // 0" "$STATE/containers/$EXITED/limits.json")" 0
gone "$EXITED"

echo "-- bad input is one line, nothing changed"
sleeper upd-c 1G
bad() {
    local out rc=0
    out=$(update "$@" 2>&1) || rc=$?
    check "update $*: refused (exit $rc)" test "$rc" != 0
    check_eq "  ... with one line" "$(printf '%s\n' "$out" | grep -c .)" 1
    check_match "  ... saying why" "$BAD" "$out"
}
BAD='--memory-limit.*4GB' bad upd-c --memory-limit 4GB
BAD='below|at least' bad upd-c --memory-limit 1Mi
BAD='has no compute share: one cannot be added to a running container' bad upd-c --compute-limit 50
BAD='has no compute share: one cannot be added to a running container' bad upd-c --compute-request 50
BAD='--compute-request="0": a compute request is a whole percent' bad upd-c --compute-request 0
BAD='no container nosuch' bad nosuch --memory-limit 2Gi
BAD='nothing to change' bad upd-c
BAD='has no GPU 3' bad upd-c --gpu 3 --memory-limit 2Gi
check_eq "  ... and upd-c was never updated" "$(jq -r '.updates // 0' "$STATE/containers/upd-c/limits.json")" 0
check_match "vgpuctl update --help says the environment-only mode cannot be updated" 'environment alone' "$("$VGPUCTL" update --help)"
gone upd-c

t_done
