#!/usr/bin/env bash
# containerd: the config vgpuctl writes loads in the real containerd (`config dump`), configure is
# idempotent, unconfigure gives back the file byte for byte, bad files are refused untouched, and a
# private containerd runs a container through vgpu-container-runtime with `ctr run`.
source "$(dirname "$0")/engines-lib.sh"
need "$VGPUCTL"
T=$(mktemp -d /tmp/vgpu-e2e-containerd.XXXXXX)
CPID=
cleanup() {
    [ -n "$CPID" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
    mountpoint -q "$T/root" 2>/dev/null && umount -R "$T/root"
    rm -rf "$T"
}
trap cleanup EXIT

# dump_get FILE KEY...: a value from `containerd config dump` of FILE (TOML parsed by Python's tomllib).
dump_get() {
    local f=$1; shift
    containerd --config "$f" config dump 2>"$T/dump.err" | python3 -c '
import sys, tomllib
d = tomllib.loads(sys.stdin.read())
for k in sys.argv[1:]:
    d = d[k]
print(d if not isinstance(d, list) else ",".join(d))' "$@"
}
V2=(plugins io.containerd.grpc.v1.cri containerd)

# 1. Debian's shipped config and containerd's full default (with SystemdCgroup on, to see it copied).
cp /etc/containerd/config.toml "$T/debian.toml" 2>/dev/null || printf 'version = 2\n' > "$T/debian.toml"
containerd config default | sed 's/SystemdCgroup = false/SystemdCgroup = true/' > "$T/default.toml"
for name in debian default; do
    f=$T/$name.toml
    before=$(fingerprint "$f")
    check "$name: configure succeeds" "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > "$T/out"
    check "$name: says what to restart" grep -q "systemctl restart containerd" "$T/out"
    check "$name: containerd reads the file" containerd --config "$f" config dump > /dev/null
    check "$name: BinaryName is the shim" \
        test "$(dump_get "$f" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
    check "$name: runtime_type runc v2" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu runtime_type)" = io.containerd.runc.v2
    check "$name: pod annotations vgpu.io/*" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu pod_annotations)" = 'vgpu.io/*'
    check "$name: container annotations vgpu.io/*" \
        test "$(dump_get "$f" "${V2[@]}" runtimes vgpu container_annotations)" = 'vgpu.io/*'
    check "$name: runc is still there" test "$(dump_get "$f" "${V2[@]}" runtimes runc runtime_type)" = io.containerd.runc.v2
    after=$(fingerprint "$f")
    "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > "$T/out2"
    check "$name: second configure changes nothing" test "$(fingerprint "$f")" = "$after"
    check "$name: and says so" grep -q "nothing to change" "$T/out2"
    check "$name: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
    check "$name: file back byte for byte" test "$(fingerprint "$f")" = "$before"
done
check "default: SystemdCgroup copied from runc" bash -c '
    "'"$VGPUCTL"'" runtime configure --runtime=containerd --config "'"$T"'/default.toml" >/dev/null &&
    containerd --config "'"$T"'/default.toml" config dump | grep -A30 "runtimes.vgpu.options\]" | grep -q "SystemdCgroup = true"'
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$T/default.toml" > /dev/null

# 2. --set-as-default and back.
f=$T/debian.toml; before=$(fingerprint "$f")
"$VGPUCTL" runtime configure --runtime=containerd --config "$f" --set-as-default > /dev/null
check "set-as-default: containerd's default is vgpu" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = vgpu
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
check "set-as-default: undone byte for byte" test "$(fingerprint "$f")" = "$before"
check "set-as-default: default is runc again" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = runc

# 3. --dry-run prints and writes nothing.
"$VGPUCTL" runtime configure --runtime=containerd --config "$f" --dry-run > "$T/dry"
check "dry-run: prints the runtime table" grep -q 'runtimes.vgpu' "$T/dry"
check "dry-run: file untouched" test "$(fingerprint "$f")" = "$before"

# 4. No file: a minimal valid one is created, and removed again by unconfigure.
f=$T/new/config.toml
check "missing file: configure creates it" "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > /dev/null
check "missing file: containerd reads it" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
check "missing file: unconfigure removes it" test ! -e "$f"

# 5. Bad input: one clear line naming path and line; the file untouched.
printf 'version = 2\n[plugins\nx = 1\n' > "$T/bad.toml"; before=$(fingerprint "$T/bad.toml")
"$VGPUCTL" runtime configure --runtime=containerd --config "$T/bad.toml" 2> "$T/err" > /dev/null
check "bad file: refused" test $? -ne 0
check "bad file: error names path and line" grep -q "^vgpuctl: error: $T/bad.toml:2:" "$T/err"
check "bad file: one line" test "$(wc -l < "$T/err")" -eq 1
check "bad file: untouched" test "$(fingerprint "$T/bad.toml")" = "$before"
"$VGPUCTL" runtime configure --runtime=nosuch --config "$T/x" 2> "$T/err"
check "unknown runtime: lists the known ones" grep -q "docker, containerd, crio, podman" "$T/err"

# 6. A private containerd on the configured file runs containers through the shim with `ctr run`.
need "$SHIM" "$HOOK" "$ROOT/target/fake/libnvidia-ml.so.1" "$LIBVGPU"
mkdir -p "$T/root" "$T/state" "$T/vgpu"
printf 'version = 2\nroot = "%s"\nstate = "%s"\n[grpc]\n  address = "%s"\n' \
    "$T/root" "$T/state" "$T/containerd.sock" > "$T/run.toml"
"$VGPUCTL" runtime configure --runtime=containerd --config "$T/run.toml" --runtime-path "$SHIM" > /dev/null
write_vgpu_config "$T/vgpu.toml" "$T/vgpu"
VGPU_CONFIG=$T/vgpu.toml containerd --config "$T/run.toml" > "$T/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 50); do [ -S "$T/containerd.sock" ] && break; sleep 0.2; done
check "private containerd started" test -S "$T/containerd.sock"
make_rootfs "$T/rootfs"
CTR=(ctr -a "$T/containerd.sock" -n vgpu-e2e)
check "ctr run without a quota passes through" \
    timeout 60 "${CTR[@]}" run --rm --runc-binary "$SHIM" --rootfs "$T/rootfs" vgpu-e2e-plain /bin/sh -c 'echo plain-ok' \
    > "$T/plain.out" 2>&1
check "plain container printed" grep -q plain-ok "$T/plain.out"
timeout 60 "${CTR[@]}" run --rm --runc-binary "$SHIM" \
    --annotation vgpu.io/memory-limit=1Gi --env NVIDIA_VISIBLE_DEVICES=0 --rootfs "$T/rootfs" vgpu-e2e-quota \
    /bin/cat /run/vgpu/limits.json > "$T/quota.out" 2>&1
check "ctr run with vgpu.io/memory-limit=1Gi sees its limits file" grep -q '"memory_limit": *1073741824' "$T/quota.out"
check "state removed after the container" bash -c "[ -z \"\$(ls -A '$T/vgpu/containers' 2>/dev/null)\" ]"
((failed)) && { echo "--- containerd log (tail)"; tail -5 "$T/containerd.log"; echo "--- plain"; cat "$T/plain.out"; echo "--- quota"; cat "$T/quota.out"; }
finish
