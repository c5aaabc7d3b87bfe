#!/usr/bin/env bash
# CDI: `vgpuctl cdi generate` writes vgpu's devices (vgpu.io/gpu=<index|uuid|all>) as a CDI spec, and Debian's
# real Podman gives a container its quota from `--device vgpu.io/gpu=0 --annotation vgpu.io/memory-limit=1Gi`
# with no hooks.d file and no shim, alone or beside a stand-in of NVIDIA's own spec (nvidia.com/gpu=0:
# NVIDIA_VISIBLE_DEVICES=void, the GPU's node, the driver's libraries, as `nvidia-ctk cdi generate` writes).
# Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi: each podman runs in a mount namespace of
# its own where the suite's folder is bind-mounted on /etc/cdi, so the host's /etc/cdi is never written.
. "$(dirname "$0")/engines-lib.sh"
t_init cdi
t_require "$VGPUCTL" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$FAKE_DIR/libcuda.so.1" "$LIBVGPU" "$CORE" "$CLIENTS_DIR/rt_client"
command -v podman > /dev/null || { echo "cdi: podman is not installed"; exit 1; }
CDI=$WORK/cdi
mkdir -p "$CDI" "$WORK/hooks-none"
P=(podman --root "$WORK/storage" --runroot "$WORK/runroot" --tmpdir "$WORK/tmp" --storage-driver vfs
   --cgroup-manager cgroupfs --events-backend none --runtime runc --hooks-dir "$WORK/hooks-none")
RUN=(run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
# The mount point for the bind mount, made only if the host has none (and removed again if still empty).
if [ ! -d /etc/cdi ]; then mkdir /etc/cdi && on_exit "rmdir /etc/cdi"; fi
pm() { unshare -m sh -c 'mount --make-rprivate / && mount --bind "$0" /etc/cdi && shift && exec "$@"' "$CDI" - "${P[@]}" "$@"; }
podman_cleanup() {
    "${P[@]}" rm -af > /dev/null 2>&1
    grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
}
on_exit podman_cleanup
vgpu_config
UUID0=GPU-fa4ec0de-0000-4000-8000-000000000000

# 1. The spec.
ok_if "cdi generate writes the spec" "$VGPUCTL" cdi generate --output "$CDI/vgpu.yaml" > "$WORK/gen.out"
ok_if "and says which devices it has" grep -q "vgpu.io/gpu=0, vgpu.io/gpu=$UUID0, vgpu.io/gpu=all (1 GPU)" "$WORK/gen.out"
ok_if "the spec is YAML with its version and kind" bash -c "grep -qx 'cdiVersion: 0.5.0' '$CDI/vgpu.yaml' && grep -qx 'kind: vgpu.io/gpu' '$CDI/vgpu.yaml'"
"$VGPUCTL" cdi generate --output "$WORK/vgpu.json" > /dev/null
ok_if ".json: the same spec as JSON" jq -e --arg u "$UUID0" '[.devices[].name] == ["0", $u, "all"]' "$WORK/vgpu.json" > /dev/null
ok_if "each device is its GPU's node (c 195:minor)" jq -e '.devices[0].containerEdits.deviceNodes == [{"path":"/dev/nvidia0","type":"c","major":195,"minor":0,"permissions":"rw"}]' "$WORK/vgpu.json" > /dev/null
ok_if "the hooks run vgpu-hook at createRuntime and poststop with an explicit env" jq -e --arg h "$HOOK" --arg c "VGPU_CONFIG=$VGPU_CONFIG" \
    '[.containerEdits.hooks[] | [.hookName, .path, .args[1], (.env | index($c) != null)]] == [["createRuntime", $h, "createRuntime", true], ["poststop", $h, "poststop", true]]' "$WORK/vgpu.json" > /dev/null
"$VGPUCTL" cdi generate --output - > "$WORK/stdout.yaml"
ok_if "--output - prints the YAML" cmp -s "$WORK/stdout.yaml" "$CDI/vgpu.yaml"
"$VGPUCTL" cdi generate --nvml-library /nonexistent/libnvidia-ml.so.1 --output "$WORK/none.yaml" > /dev/null 2> "$WORK/err"
ok_if "without NVML: refused" test $? -eq 1
ok_if "in one line naming the library, nothing written" bash -c \
    "grep -q 'cannot load NVML (/nonexistent/libnvidia-ml.so.1)' '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1 && test ! -e '$WORK/none.yaml'"

# 2. Podman with only vgpu's spec (the fake driver bind-mounted, as NVIDIA's spec would mount the real one).
engine_rootfs "$WORK/rootfs" "$CLIENTS_DIR/rt_client"
tar -C "$WORK/rootfs" -c . | "${P[@]}" import - localhost/vgpu-e2e:rootfs > /dev/null 2>&1
ok_if "podman imported the rootfs" "${P[@]}" image exists localhost/vgpu-e2e:rootfs
ok_if "no hooks.d file anywhere Podman looks" test -z "$(ls -A "$WORK/hooks-none")"
FAKE=(-e LD_LIBRARY_PATH=/usr/local/fake -v "$FAKE_DIR:/usr/local/fake:ro")
CUDA=(/bin/rt_client info '!alloc' 512Mi alloc 512Mi)
pm "${RUN[@]}" --device vgpu.io/gpu=0 --annotation vgpu.io/memory-limit=1Gi "${FAKE[@]}" localhost/vgpu-e2e:rootfs \
    /bin/sh -c 'cat /run/vgpu/limits.json; cat /etc/ld.so.preload; ls -l /dev/nvidia0; exec "$@"' - "${CUDA[@]}" > "$WORK/alone.out" 2>&1
ok_if "--device vgpu.io/gpu=0: the container sees its limits file" grep -q '"memory_limit": *1073741824' "$WORK/alone.out"
ok_if "the interposer is preloaded" grep -q '^/usr/local/vgpu/libvgpu.so' "$WORK/alone.out"
ok_if "the GPU's node is in the container" grep -qE '^crw.* 195, +0 .*/dev/nvidia0$' "$WORK/alone.out"
ok_if "inside, the GPU's total is the quota" grep -q 'op=info .*total=1073741824' "$WORK/alone.out"
ok_if "an allocation within the quota succeeds" grep -q 'op=alloc size=536870912 .*rc=0' "$WORK/alone.out"
ok_if "one past it fails with out-of-memory" grep -q 'op=alloc size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$WORK/alone.out"
ok_if "poststop removed the container's state" test -z "$(state_left)"

pm "${RUN[@]}" --device "vgpu.io/gpu=$UUID0" --annotation vgpu.io/memory-limit=2Gi localhost/vgpu-e2e:rootfs \
    /bin/cat /run/vgpu/limits.json > "$WORK/uuid.out" 2>&1
ok_if "--device vgpu.io/gpu=<uuid>: that GPU's quota" jq -e --arg u "$UUID0" '.devices == [.devices[0]] and .devices[0].uuid == $u and .devices[0].memory_limit == 2147483648' "$WORK/uuid.out" > /dev/null
pm "${RUN[@]}" --device vgpu.io/gpu=all --annotation vgpu.io/memory-limit.0=3Gi localhost/vgpu-e2e:rootfs \
    /bin/cat /run/vgpu/limits.json > "$WORK/all.out" 2>&1
ok_if "--device vgpu.io/gpu=all with vgpu.io/memory-limit.0" jq -e '.devices[0].memory_limit == 3221225472' "$WORK/all.out" > /dev/null
pm "${RUN[@]}" --device vgpu.io/gpu=0 localhost/vgpu-e2e:rootfs /bin/sh -c 'ls /run/vgpu 2>&1; cat /etc/ld.so.preload 2>&1; echo plain-ok' > "$WORK/plain.out" 2>&1
ok_if "no quota asked: the container runs untouched" bash -c "grep -q plain-ok '$WORK/plain.out' && grep -q 'No such file' '$WORK/plain.out' && ! grep -q libvgpu '$WORK/plain.out'"
ok_if "and nothing provisioned" test -z "$(state_left)"
pm "${RUN[@]}" --device vgpu.io/gpu=0 --annotation vgpu.io/memory-limit=4Qi localhost/vgpu-e2e:rootfs /bin/true > "$WORK/bad.out" 2>&1
ok_if "a bad quota fails podman run" test $? -ne 0
ok_if "with the hook's one-line reason" grep -q 'vgpu: annotation vgpu.io/memory-limit="4Qi"' "$WORK/bad.out"
ok_if "and nothing provisioned" test -z "$(state_left)"
pm "${RUN[@]}" --device vgpu.io/gpu=7 --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs /bin/true > "$WORK/nodev.out" 2>&1
ok_if "a device the spec does not have fails podman run" test $? -ne 0
ok_if "naming it" grep -q 'vgpu.io/gpu=7' "$WORK/nodev.out"

# 3. Beside NVIDIA's spec: its env says void, its device gives the node and the driver's libraries.
cat > "$CDI/nvidia.json" << JSON
{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
 "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}],
 "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
   "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
   "mounts": [{"hostPath": "$FAKE_DIR/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]},
              {"hostPath": "$FAKE_DIR/libnvidia-ml.so.1", "containerPath": "/usr/lib/libnvidia-ml.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}]}}
JSON
for order in "nvidia.com/gpu=0 vgpu.io/gpu=0" "vgpu.io/gpu=0 nvidia.com/gpu=0"; do
    devs=(); for d in $order; do devs+=(--device "$d"); done
    pm "${RUN[@]}" "${devs[@]}" --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs \
        /bin/sh -c 'env | grep NVIDIA_VISIBLE; ls /dev/nvidiactl; exec "$@"' - "${CUDA[@]}" > "$WORK/both.out" 2>&1
    ok_if "$order: NVIDIA's spec applied (void, nvidiactl)" bash -c "grep -q NVIDIA_VISIBLE_DEVICES=void '$WORK/both.out' && grep -q '^/dev/nvidiactl' '$WORK/both.out'"
    ok_if "$order: the quota is the GPU's total inside" grep -q 'op=info .*total=1073741824' "$WORK/both.out"
    ok_if "$order: an allocation past it fails" grep -q 'op=alloc size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$WORK/both.out"
done
ok_if "state removed after the containers" test -z "$(state_left)"

# 4. Without vgpu's spec the device is unknown to Podman: the run fails, naming it.
rm "$CDI/vgpu.yaml"
pm "${RUN[@]}" --device vgpu.io/gpu=0 --annotation vgpu.io/memory-limit=1Gi localhost/vgpu-e2e:rootfs /bin/true > "$WORK/nospec.out" 2>&1
ok_if "without the spec, --device vgpu.io/gpu=0 fails" test $? -ne 0
ok_if "naming the device" grep -q 'vgpu.io/gpu=0' "$WORK/nospec.out"
((FAILED)) && { for f in gen alone uuid all plain bad nodev both nospec; do echo "--- $f"; cat "$WORK/$f.out"; done; cat "$CDI/vgpu.yaml" 2>/dev/null; }
t_done
