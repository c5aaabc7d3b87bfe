#!/usr/bin/env bash
# Podman: `vgpuctl runtime configure --runtime=podman` writes hooks.d files; `podman run --annotation
# vgpu.io/memory-limit=1Gi` then gets the quota with no shim (createRuntime + poststop of vgpu-hook);
# unconfigure removes exactly those files.
. "$(dirname "$0")/engines-lib.sh"
t_init engines-podman
t_require "$VGPUCTL" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$FAKE_DIR/libcuda.so.1" "$LIBVGPU" "$CORE" "$CLIENTS_DIR/rt_client"
HD=$WORK/hooks.d
# Private storage and state; cgroupfs and explicit ulimits because this machine has no systemd session and
# Podman cannot raise RLIMIT_NPROC/NOFILE to its defaults here.
P=(podman --root "$WORK/storage" --runroot "$WORK/runroot" --tmpdir "$WORK/tmp" --storage-driver vfs
   --cgroup-manager cgroupfs --events-backend none --runtime runc --hooks-dir "$HD")
RUN=(run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
podman_cleanup() {
    "${P[@]}" rm -af > /dev/null 2>&1
    grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
}
on_exit podman_cleanup

mkdir -p "$HD"
# Someone else's hook in the same folder: vgpuctl must never touch it.
printf '{"version":"1.0.0","hook":{"path":"/bin/true"},"when":{"always":false},"stages":["prestart"]}\n' > "$HD/other.json"
other=$(fingerprint "$HD/other.json")
vgpu_config

# 1. Configure.
ok_if "configure succeeds" "$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$HD" \
    --hook-path "$HOOK" --hook-env "VGPU_CONFIG=$VGPU_CONFIG" > "$WORK/out"
ok_if "says nothing needs a restart" grep -q "nothing to restart" "$WORK/out"
ok_if "one file per stage (createRuntime, poststop)" test "$(ls "$HD" | grep -c '^vgpu-')" -eq 2
ok_if "hooks match vgpu.io annotations" jq -e '.when.annotations["^vgpu\\.io/"] == ".*"' "$HD/vgpu-createruntime.json" > /dev/null
ok_if "hooks carry an explicit env" jq -e '.hook.env | length == 2' "$HD/vgpu-createruntime.json" > /dev/null
snap=$(cat "$HD"/vgpu-* | sha256sum)
"$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$HD" --hook-path "$HOOK" --hook-env "VGPU_CONFIG=$VGPU_CONFIG" > "$WORK/out"
ok_if "second configure changes nothing" test "$(cat "$HD"/vgpu-* | sha256sum)" = "$snap"

# 2. Real containers.
engine_rootfs "$WORK/rootfs" "$CLIENTS_DIR/rt_client"
tar -C "$WORK/rootfs" -c . | "${P[@]}" import - localhost/vgpu-e2e:rootfs > /dev/null 2>&1
ok_if "podman imported the rootfs" "${P[@]}" image exists localhost/vgpu-e2e:rootfs
"${P[@]}" "${RUN[@]}" localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1; echo plain-ok' > "$WORK/plain.out" 2>&1
ok_if "a container without annotation runs" grep -q plain-ok "$WORK/plain.out"
ok_if "and gets no quota" grep -q "No such file" "$WORK/plain.out"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi -e NVIDIA_VISIBLE_DEVICES=0 localhost/vgpu-e2e:rootfs \
    /bin/sh -c 'cat /run/vgpu/limits.json; echo; env; cat /etc/ld.so.preload' > "$WORK/quota.out" 2>&1
ok_if "--annotation vgpu.io/memory-limit=1Gi: the container sees its limits file" grep -q '"memory_limit": *1073741824' "$WORK/quota.out"
ok_if "the interposer is preloaded" grep -q '^/usr/local/vgpu/libvgpu.so' "$WORK/quota.out"
ok_if "poststop removed the container's state" test -z "$(state_left)"
# The quota at work: the fake driver (16 GiB device) bind-mounted in, a client that allocates like the
# CUDA runtime; its context (256 MiB in the fake) and data count against the 1 GiB quota.
"${P[@]}" run -d --name vgpu-e2e-cuda --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --annotation vgpu.io/memory-limit=1Gi -e NVIDIA_VISIBLE_DEVICES=0 -e LD_LIBRARY_PATH=/usr/local/fake \
    -v "$FAKE_DIR:/usr/local/fake:ro" localhost/vgpu-e2e:rootfs \
    /bin/rt_client info '!alloc' 512Mi alloc 512Mi sleep 6 > /dev/null
for _ in $(seq 40); do "$VGPUCTL" status --json --state-root "$STATE" > "$WORK/status.json"
    jq -e '.containers[0].gpus[0].used > 0' "$WORK/status.json" > /dev/null 2>&1 && break; sleep 0.2; done
"$VGPUCTL" status --state-root "$STATE" > "$WORK/status.txt"
# Issue 46: Podman's names (its containers/storage record; this storage's root through storage.conf, as
# Podman's own CONTAINERS_STORAGE_CONF names it) in status, and as what `vgpuctl update` takes.
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\n' "$WORK/storage" > "$WORK/storage.conf"
CONTAINERS_STORAGE_CONF=$WORK/storage.conf "$VGPUCTL" status --state-root "$STATE" > "$WORK/status-named.txt"
CID=$(jq -r '.containers[0].id' "$WORK/status.json")
CONTAINERS_STORAGE_CONF=$WORK/storage.conf "$VGPUCTL" update vgpu-e2e-cuda --memory-limit 1Gi --state-root "$STATE" \
    > "$WORK/update-name.out" 2>&1
"$VGPUCTL" update "${CID:0:12}" --memory-limit 1Gi --state-root "$STATE" > "$WORK/update-prefix.out" 2>&1
"$VGPUCTL" update "${CID:0:12}x" --memory-limit 1Gi --state-root "$STATE" > "$WORK/update-none.out" 2>&1
"${P[@]}" wait vgpu-e2e-cuda > /dev/null; "${P[@]}" logs vgpu-e2e-cuda > "$WORK/cuda.out" 2>&1; "${P[@]}" rm vgpu-e2e-cuda > /dev/null
ok_if "inside, the GPU's total is the quota" grep -q 'op=info .*total=1073741824' "$WORK/cuda.out"
ok_if "an allocation within the quota succeeds" grep -q 'op=alloc size=536870912 .*rc=0' "$WORK/cuda.out"
ok_if "one past it fails with out-of-memory" grep -q 'op=alloc size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$WORK/cuda.out"
ok_if "vgpuctl status --json: quota and usage by kind" jq -e '.containers[0].gpus[0] | .quota == 1073741824
    and .by_kind.data == 536870912 and .by_kind.context > 0 and .used == .by_kind.data + .by_kind.context' "$WORK/status.json" > /dev/null
ok_if "vgpuctl status --json: one live process" jq -e '.containers[0].gpus[0].processes | length == 1 and .[0].alive' "$WORK/status.json" > /dev/null
ok_if "vgpuctl status table: the container's line" grep -qE '^[0-9a-f]{12} +0 +GPU-.* 1.00 GiB +768 MiB \(75%\)' "$WORK/status.txt"
ok_if "  ... named by Podman's name (was -)" grep -qE "^${CID:0:12} .* vgpu-e2e-cuda\$" "$WORK/status-named.txt"
ok_if "vgpuctl update takes the Podman name" grep -q "$CID" "$WORK/update-name.out"
ok_if "  ... and the 12 characters status prints" grep -q "$CID" "$WORK/update-prefix.out"
ok_if "  ... and names what fits no container in one line" grep -qx "vgpuctl: error: no container ${CID:0:12}x under $STATE: .*" "$WORK/update-none.out"
"$VGPUCTL" status --state-root "$STATE" > "$WORK/status2.txt"
ok_if "vgpuctl status: nothing running afterwards" grep -q "^no containers" "$WORK/status2.txt"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=4Qi -e NVIDIA_VISIBLE_DEVICES=0 localhost/vgpu-e2e:rootfs \
    /bin/true > "$WORK/bad.out" 2>&1
ok_if "a bad quota fails podman run" test $? -ne 0
ok_if "with the hook's one-line reason" grep -q 'vgpu: annotation vgpu.io/memory-limit="4Qi"' "$WORK/bad.out"
ok_if "and nothing provisioned" test -z "$(state_left)"

# A container whose poststop never came: its init is gone, so `vgpuctl gc` removes its state.
sleep 0 & dead=$!; wait $dead
mkdir -p "$STATE/containers/stale/ledgers"
# vgpu's markers, as provisioning writes them (gc removes nothing unmarked).
touch "$STATE/containers/.vgpu-state" "$STATE/containers/stale/.vgpu-state"
printf '{"version":1,"container_id":"stale","pid_ns":1,"init_pid":%d,"devices":[{"index":0,"uuid":"GPU-x","memory_limit":1024,"ledger":"ledgers/GPU-x.ledger"}]}\n' \
    "$dead" > "$STATE/containers/stale/limits.json"
"$VGPUCTL" status --state-root "$STATE" > "$WORK/status3.txt"
ok_if "vgpuctl status lists the stale container" grep -q '^stale ' "$WORK/status3.txt"
ok_if "vgpuctl gc succeeds" "$VGPUCTL" gc --state-root "$STATE" > "$WORK/gc.out"
ok_if "vgpuctl gc removed the stale state" bash -c "grep -q '^removed stale' '$WORK/gc.out' && [ ! -e '$STATE/containers/stale' ]"

# 3. Unconfigure: our files go, the other hook stays; again is a no-op.
ok_if "unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=podman --hooks-dir "$HD" > /dev/null
ok_if "only the other hook is left" test "$(ls "$HD")" = other.json
ok_if "the other hook is untouched" test "$(fingerprint "$HD/other.json")" = "$other"
"$VGPUCTL" runtime unconfigure --runtime=podman --hooks-dir "$HD" > "$WORK/out"
ok_if "second unconfigure changes nothing" grep -q "nothing to change" "$WORK/out"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1' > "$WORK/after.out" 2>&1
ok_if "after unconfigure the annotation does nothing" grep -q "No such file" "$WORK/after.out"

# 4. A hooks.d file of vgpu's name that vgpuctl did not write (here: another program for vgpu.io/ annotations):
# Podman runs it; configure refuses it in one line and unconfigure leaves it (both files untouched);
# configure --force replaces it with vgpu's, and Podman then gives the container its quota.
HD2=$WORK/hooks2.d
P2=("${P[@]/#$HD/$HD2}")
mkdir -p "$HD2"
printf '{"version":"1.0.0","hook":{"path":"/bin/sh","args":["sh","-c","/usr/bin/touch %s"]},"when":{"annotations":{"^vgpu\\\\.io/":".*"}},"stages":["createRuntime"]}\n' \
    "$WORK/their-hook-ran" > "$HD2/vgpu-createruntime.json"
theirs=$(fingerprint "$HD2/vgpu-createruntime.json")
for verb in configure unconfigure; do
    "$VGPUCTL" runtime $verb --runtime=podman --hooks-dir "$HD2" > /dev/null 2> "$WORK/err"
    ok_if "foreign hook file: $verb refused" test $? -eq 1
    ok_if "foreign hook file: $verb says whose it is, in one line" bash -c \
        "grep -q \"vgpu-createruntime.json: the hook file exists and is not vgpu's (it runs /bin/sh)\" '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"
    ok_if "foreign hook file: $verb left the folder as it was" \
        test "$(ls "$HD2"):$(fingerprint "$HD2/vgpu-createruntime.json")" = "vgpu-createruntime.json:$theirs"
done
"${P2[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1' > "$WORK/theirs.out" 2>&1
ok_if "foreign hook file: Podman runs their hook" test -e "$WORK/their-hook-ran"
ok_if "foreign hook file: and the container gets no quota" grep -q "No such file" "$WORK/theirs.out"
ok_if "foreign hook file: configure --force replaces it" "$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$HD2" \
    --hook-path "$HOOK" --hook-env "VGPU_CONFIG=$VGPU_CONFIG" --force > /dev/null
ok_if "foreign hook file: after --force, both files are vgpu's" bash -c \
    "jq -e '.hook.path == \"$HOOK\"' '$HD2/vgpu-createruntime.json' '$HD2/vgpu-poststop.json' > /dev/null"
rm -f "$WORK/their-hook-ran"
"${P2[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi -e NVIDIA_VISIBLE_DEVICES=0 localhost/vgpu-e2e:rootfs \
    /bin/cat /run/vgpu/limits.json > "$WORK/forced.out" 2>&1
ok_if "foreign hook file: after --force, the container sees its limits file" grep -q '"memory_limit": *1073741824' "$WORK/forced.out"
ok_if "foreign hook file: their hook no longer runs" test ! -e "$WORK/their-hook-ran"
ok_if "foreign hook file: unconfigure now removes vgpu's files" bash -c \
    "'$VGPUCTL' runtime unconfigure --runtime=podman --hooks-dir '$HD2' > /dev/null && test -z \"\$(ls -A '$HD2')\""
ok_if "state removed after the containers" test -z "$(state_left)"
((FAILED)) && { for f in quota cuda bad theirs forced; do echo "--- $f"; cat "$WORK/$f.out"; done; cat "$WORK/status.json" "$WORK/status.txt"; }
t_done
