#!/usr/bin/env bash
# Docker: `vgpuctl runtime configure --runtime=docker` on a daemon.json that a private dockerd then
# runs on; `docker run --runtime=vgpu` goes through vgpu-container-runtime (a quota from the environment,
# as Docker 20.10 has no --annotation); unconfigure gives back daemon.json byte for byte.
source "$(dirname "$0")/engines-lib.sh"
need "$VGPUCTL"
T=$(mktemp -d /tmp/vgpu-e2e-docker.XXXXXX)
DPID=
stop_dockerd() {
    [ -n "$DPID" ] || return 0
    kill "$DPID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
    DPID=
}
cleanup() {
    stop_dockerd
    grep -o " $T/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

# A daemon.json an operator would have, tab-indented, with private paths so this dockerd disturbs nothing.
cat > "$T/daemon.json" <<EOT
{
	"data-root": "$T/data",
	"exec-root": "$T/exec",
	"pidfile": "$T/docker.pid",
	"hosts": ["unix://$T/docker.sock"],
	"bridge": "none",
	"iptables": false,
	"ip-masq": false,
	"log-level": "warn",
	"storage-driver": "vfs"
}
EOT
chmod 600 "$T/daemon.json"
before=$(fingerprint "$T/daemon.json")
D=(docker -H "unix://$T/docker.sock")

# 1. Configure: the runtime entry is added, every other key kept in place, mode kept, idempotent.
check "configure succeeds" "$VGPUCTL" runtime configure --runtime=docker --config "$T/daemon.json" --runtime-path "$SHIM" > "$T/out"
check "says what to restart" grep -q "systemctl restart docker" "$T/out"
check "runtimes.vgpu.path is the shim" test "$(jq -r .runtimes.vgpu.path "$T/daemon.json")" = "$SHIM"
check "other keys kept in order" test "$(jq -r 'keys_unsorted | join(",")' "$T/daemon.json")" = \
    "data-root,exec-root,pidfile,hosts,bridge,iptables,ip-masq,log-level,storage-driver,runtimes"
check "tab indentation kept" grep -qP '^\t"data-root"' "$T/daemon.json"
check "mode 600 kept" test "$(stat -c %a "$T/daemon.json")" = 600
after=$(fingerprint "$T/daemon.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$T/daemon.json" --runtime-path "$SHIM" > /dev/null
check "second configure changes nothing" test "$(fingerprint "$T/daemon.json")" = "$after"

# 2. A real dockerd reads it and runs containers through the shim.
need "$SHIM" "$HOOK" "$ROOT/target/fake/libnvidia-ml.so.1" "$LIBVGPU"
mkdir -p "$T/vgpu"
write_vgpu_config "$T/vgpu.toml" "$T/vgpu"
VGPU_CONFIG=$T/vgpu.toml dockerd --config-file "$T/daemon.json" > "$T/dockerd.log" 2>&1 &
DPID=$!
for _ in $(seq 150); do "${D[@]}" version > /dev/null 2>&1 && break; sleep 0.2; done
check "dockerd started on the configured daemon.json" "${D[@]}" version
check "dockerd lists the vgpu runtime" bash -c "'${D[0]}' -H 'unix://$T/docker.sock' info --format '{{json .Runtimes}}' | jq -e '.vgpu.path == \"$SHIM\"' > /dev/null"
make_rootfs "$T/rootfs"
tar -C "$T/rootfs" -c . | "${D[@]}" import - vgpu-e2e:rootfs > /dev/null
check "docker run --runtime=vgpu without a quota passes through" \
    bash -c "'${D[0]}' -H 'unix://$T/docker.sock' run --rm --runtime=vgpu --network none vgpu-e2e:rootfs /bin/sh -c 'echo plain-ok' | grep -q plain-ok"
"${D[@]}" run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=1Gi -e NVIDIA_VISIBLE_DEVICES=0 \
    vgpu-e2e:rootfs /bin/cat /run/vgpu/limits.json > "$T/quota.out" 2>&1
check "docker run --runtime=vgpu -e CUDA_DEVICE_MEMORY_LIMIT=1Gi sees its limits file" \
    grep -q '"memory_limit": *1073741824' "$T/quota.out"
"${D[@]}" run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=-1 -e NVIDIA_VISIBLE_DEVICES=0 \
    vgpu-e2e:rootfs /bin/true > "$T/badquota.out" 2>&1
check "a bad quota fails docker run" test $? -ne 0
check "state removed after the containers" bash -c "[ -z \"\$(ls -A '$T/vgpu/containers' 2>/dev/null)\" ]"
stop_dockerd

# 3. Unconfigure: daemon.json exactly as it was; again is a no-op.
check "unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=docker --config "$T/daemon.json" > /dev/null
check "daemon.json back byte for byte" test "$(fingerprint "$T/daemon.json")" = "$before"
"$VGPUCTL" runtime unconfigure --runtime=docker --config "$T/daemon.json" > "$T/out"
check "second unconfigure changes nothing" grep -q "nothing to change" "$T/out"

# 4. --set-as-default replaces an explicit default-runtime and unconfigure puts it back.
printf '{\n  "default-runtime": "runc",\n  "debug": false\n}\n' > "$T/def.json"; b=$(fingerprint "$T/def.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$T/def.json" --set-as-default > /dev/null
check "set-as-default: default-runtime is vgpu" test "$(jq -r '."default-runtime"' "$T/def.json")" = vgpu
"$VGPUCTL" runtime unconfigure --runtime=docker --config "$T/def.json" > /dev/null
check "set-as-default: undone byte for byte" test "$(fingerprint "$T/def.json")" = "$b"
check "set-as-default: nothing left beside it" test "$(ls -A "$T" | grep -c vgpuctl)" -eq 0

# 5. Bad input.
printf '{\n  "debug": true,\n  "runtimes": {,}\n}\n' > "$T/bad.json"; b=$(fingerprint "$T/bad.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$T/bad.json" 2> "$T/err" > /dev/null
check "bad daemon.json: refused with path and line" grep -q "^vgpuctl: error: $T/bad.json:3:" "$T/err"
check "bad daemon.json: untouched" test "$(fingerprint "$T/bad.json")" = "$b"
((failed)) && { echo "--- dockerd log (tail)"; tail -5 "$T/dockerd.log"; echo "--- quota container"; cat "$T/quota.out"; }
finish
