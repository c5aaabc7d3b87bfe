#!/usr/bin/env bash
# Podman: `vgpuctl runtime configure --runtime=podman` writes hooks.d files; `podman run --annotation
# vgpu.io/memory-limit=1Gi` then gets the quota with no shim (createRuntime + poststop of vgpu-hook);
# unconfigure removes exactly those files.
source "$(dirname "$0")/engines-lib.sh"
FAKE=$ROOT/target/fake
need "$VGPUCTL" "$HOOK" "$FAKE/libnvidia-ml.so.1" "$FAKE/libcuda.so.1" "$LIBVGPU" "$ROOT/target/clients/rt_client"
T=$(mktemp -d /tmp/vgpu-e2e-podman.XXXXXX)
HD=$T/hooks.d
# Private storage and state; cgroupfs and explicit ulimits because this machine has no systemd session and
# Podman cannot raise RLIMIT_NPROC/NOFILE to its defaults here.
P=(podman --root "$T/storage" --runroot "$T/runroot" --tmpdir "$T/tmp" --storage-driver vfs
   --cgroup-manager cgroupfs --events-backend none --runtime runc --hooks-dir "$HD")
RUN=(run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
cleanup() {
    "${P[@]}" rm -af > /dev/null 2>&1
    grep -o " $T/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

mkdir -p "$HD" "$T/vgpu"
# Someone else's hook in the same folder: vgpuctl must never touch it.
printf '{"version":"1.0.0","hook":{"path":"/bin/true"},"when":{"always":false},"stages":["prestart"]}\n' > "$HD/other.json"
other=$(fingerprint "$HD/other.json")
write_vgpu_config "$T/vgpu.toml" "$T/vgpu"

# 1. Configure.
check "configure succeeds" "$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$HD" \
    --hook-path "$HOOK" --hook-env "VGPU_CONFIG=$T/vgpu.toml" > "$T/out"
check "says nothing needs a restart" grep -q "nothing to restart" "$T/out"
check "one file per stage (createRuntime, poststop)" test "$(ls "$HD" | grep -c '^vgpu-')" -eq 2
check "hooks match vgpu.io annotations" jq -e '.when.annotations["^vgpu\\.io/"] == ".*"' "$HD/vgpu-createruntime.json" > /dev/null
check "hooks carry an explicit env" jq -e '.hook.env | length == 2' "$HD/vgpu-createruntime.json" > /dev/null
snap=$(cat "$HD"/vgpu-* | sha256sum)
"$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$HD" --hook-path "$HOOK" --hook-env "VGPU_CONFIG=$T/vgpu.toml" > "$T/out"
check "second configure changes nothing" test "$(cat "$HD"/vgpu-* | sha256sum)" = "$snap"

# 2. Real containers.
make_rootfs "$T/rootfs" "$ROOT/target/clients/rt_client"
tar -C "$T/rootfs" -c . | "${P[@]}" import - localhost/vgpu-e2e:rootfs > /dev/null 2>&1
check "podman imported the rootfs" "${P[@]}" image exists localhost/vgpu-e2e:rootfs
"${P[@]}" "${RUN[@]}" localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1; echo plain-ok' > "$T/plain.out" 2>&1
check "a container without annotation runs" grep -q plain-ok "$T/plain.out"
check "and gets no quota" grep -q "No such file" "$T/plain.out"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi -e NVIDIA_VISIBLE_DEVICES=0 localhost/vgpu-e2e:rootfs \
    /bin/sh -c 'cat /run/vgpu/limits.json; echo; env; cat /etc/ld.so.preload' > "$T/quota.out" 2>&1
check "--annotation vgpu.io/memory-limit=1Gi: the container sees its limits file" grep -q '"memory_limit": *1073741824' "$T/quota.out"
check "the interposer is preloaded" grep -q '^/usr/local/vgpu/libvgpu.so' "$T/quota.out"
check "poststop removed the container's state" bash -c "[ -z \"\$(ls -A '$T/vgpu/containers' 2>/dev/null)\" ]"
# The quota at work: the fake driver (16 GiB device) bind-mounted in, a client that allocates like the
# CUDA runtime; its context (256 MiB in the fake) and data count against the 1 GiB quota.
"${P[@]}" run -d --name vgpu-e2e-cuda --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --annotation vgpu.io/memory-limit=1Gi -e NVIDIA_VISIBLE_DEVICES=0 -e LD_LIBRARY_PATH=/usr/local/fake \
    -v "$FAKE:/usr/local/fake:ro" localhost/vgpu-e2e:rootfs \
    /bin/rt_client info '!alloc' 512Mi alloc 512Mi sleep 6 > /dev/null
for _ in $(seq 40); do "$VGPUCTL" status --json --state-root "$T/vgpu" > "$T/status.json"
    jq -e '.containers[0].gpus[0].used > 0' "$T/status.json" > /dev/null 2>&1 && break; sleep 0.2; done
"$VGPUCTL" status --state-root "$T/vgpu" > "$T/status.txt"
"${P[@]}" wait vgpu-e2e-cuda > /dev/null; "${P[@]}" logs vgpu-e2e-cuda > "$T/cuda.out" 2>&1; "${P[@]}" rm vgpu-e2e-cuda > /dev/null
check "inside, the GPU's total is the quota" grep -q 'op=info .*total=1073741824' "$T/cuda.out"
check "an allocation within the quota succeeds" grep -q 'op=alloc size=536870912 .*rc=0' "$T/cuda.out"
check "one past it fails with out-of-memory" grep -q 'op=alloc size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$T/cuda.out"
check "vgpuctl status --json: quota and usage by kind" jq -e '.containers[0].gpus[0] | .quota == 1073741824
    and .by_kind.data == 536870912 and .by_kind.context > 0 and .used == .by_kind.data + .by_kind.context' "$T/status.json"
check "vgpuctl status --json: one live process" jq -e '.containers[0].gpus[0].processes | length == 1 and .[0].alive' "$T/status.json"
check "vgpuctl status table: the container's line" grep -qE '^[0-9a-f]{12} +0 +GPU-.* 1.00 GiB +768 MiB \(75%\)' "$T/status.txt"
"$VGPUCTL" status --state-root "$T/vgpu" > "$T/status2.txt"
check "vgpuctl status: nothing running afterwards" grep -q "^no containers" "$T/status2.txt"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=4Qi -e NVIDIA_VISIBLE_DEVICES=0 localhost/vgpu-e2e:rootfs \
    /bin/true > "$T/bad.out" 2>&1
check "a bad quota fails podman run" test $? -ne 0
check "with the hook's one-line reason" grep -q 'vgpu: annotation vgpu.io/memory-limit="4Qi"' "$T/bad.out"
check "and nothing provisioned" bash -c "[ -z \"\$(ls -A '$T/vgpu/containers' 2>/dev/null)\" ]"

# A container whose poststop never came: its init is gone, so `vgpuctl gc` removes its state.
sleep 0 & dead=$!; wait $dead
mkdir -p "$T/vgpu/containers/stale/ledgers"
printf '{"version":1,"container_id":"stale","pid_ns":1,"init_pid":%d,"devices":[{"index":0,"uuid":"GPU-x","memory_limit":1024,"ledger":"ledgers/GPU-x.ledger"}]}\n' \
    "$dead" > "$T/vgpu/containers/stale/limits.json"
"$VGPUCTL" status --state-root "$T/vgpu" > "$T/status3.txt"
check "vgpuctl status lists the stale container" grep -q '^stale ' "$T/status3.txt"
check "vgpuctl gc succeeds" "$VGPUCTL" gc --state-root "$T/vgpu" > "$T/gc.out"
check "vgpuctl gc removed the stale state" bash -c "grep -q '^removed stale' '$T/gc.out' && [ ! -e '$T/vgpu/containers/stale' ]"

# 3. Unconfigure: our files go, the other hook stays; again is a no-op.
check "unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=podman --hooks-dir "$HD" > /dev/null
check "only the other hook is left" test "$(ls "$HD")" = other.json
check "the other hook is untouched" test "$(fingerprint "$HD/other.json")" = "$other"
"$VGPUCTL" runtime unconfigure --runtime=podman --hooks-dir "$HD" > "$T/out"
check "second unconfigure changes nothing" grep -q "nothing to change" "$T/out"
"${P[@]}" "${RUN[@]}" --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1' > "$T/after.out" 2>&1
check "after unconfigure the annotation does nothing" grep -q "No such file" "$T/after.out"
((failed)) && { for f in quota cuda bad; do echo "--- $f"; cat "$T/$f.out"; done; cat "$T/status.json" "$T/status.txt"; }
finish
