#!/usr/bin/env bash
# containerd: the config vgpuctl writes loads in the real containerd (`config dump`), configure is
# idempotent, unconfigure gives back the file byte for byte, bad files are refused untouched, and a
# private containerd runs a container through vgpu-container-runtime with `ctr run`.
. "$(dirname "$0")/engines-lib.sh"
t_init engines-containerd
t_require "$VGPUCTL"
CPID=
stop_containerd() {
    [ -n "$CPID" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null
    grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    CPID=
}
on_exit stop_containerd

# dump_get FILE KEY...: a value from `containerd config dump` of FILE (TOML parsed by Python's tomllib).
dump_get() {
    local f=$1; shift
    containerd --config "$f" config dump 2>"$WORK/dump.err" | python3 -c '
import sys, tomllib
d = tomllib.loads(sys.stdin.read())
for k in sys.argv[1:]:
    d = d[k]
print(d if not isinstance(d, list) else ",".join(d))' "$@"
}
V2=(plugins io.containerd.grpc.v1.cri containerd)

# 1. Debian's shipped config and containerd's full default (with SystemdCgroup on, to see it copied).
cp /etc/containerd/config.toml "$WORK/debian.toml" 2>/dev/null || printf 'version = 2\n' > "$WORK/debian.toml"
containerd config default | sed 's/SystemdCgroup = false/SystemdCgroup = true/' > "$WORK/default.toml"
for name in debian default; do
    f=$WORK/$name.toml
    before=$(fingerprint "$f")
    ok_if "$name: configure succeeds" "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > "$WORK/out"
    ok_if "$name: says what to restart" grep -q "systemctl restart containerd" "$WORK/out"
    ok_if "$name: containerd reads the file" containerd --config "$f" config dump > /dev/null
    ok_if "$name: BinaryName is the shim" \
        test "$(dump_get "$f" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
    ok_if "$name: runtime_type runc v2" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu runtime_type)" = io.containerd.runc.v2
    ok_if "$name: pod annotations vgpu.io/*" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu pod_annotations)" = 'vgpu.io/*'
    ok_if "$name: container annotations vgpu.io/*" \
        test "$(dump_get "$f" "${V2[@]}" runtimes vgpu container_annotations)" = 'vgpu.io/*'
    ok_if "$name: runc is still there" test "$(dump_get "$f" "${V2[@]}" runtimes runc runtime_type)" = io.containerd.runc.v2
    after=$(fingerprint "$f")
    "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > "$WORK/out2"
    ok_if "$name: second configure changes nothing" test "$(fingerprint "$f")" = "$after"
    ok_if "$name: and says so" grep -q "nothing to change" "$WORK/out2"
    ok_if "$name: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
    ok_if "$name: file back byte for byte" test "$(fingerprint "$f")" = "$before"
done
ok_if "default: SystemdCgroup copied from runc" bash -c '
    "'"$VGPUCTL"'" runtime configure --runtime=containerd --config "'"$WORK"'/default.toml" >/dev/null &&
    containerd --config "'"$WORK"'/default.toml" config dump | grep -A30 "runtimes.vgpu.options\]" | grep -q "SystemdCgroup = true"'
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$WORK/default.toml" > /dev/null

# 2. --set-as-default and back.
f=$WORK/debian.toml; before=$(fingerprint "$f")
"$VGPUCTL" runtime configure --runtime=containerd --config "$f" --set-as-default > /dev/null
ok_if "set-as-default: containerd's default is vgpu" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = vgpu
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
ok_if "set-as-default: undone byte for byte" test "$(fingerprint "$f")" = "$before"
ok_if "set-as-default: default is runc again" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = runc

# 3. --dry-run writes nothing; stdout is the new file alone (containerd reads it), the notes on stderr.
"$VGPUCTL" runtime configure --runtime=containerd --config "$f" --dry-run > "$WORK/dry.toml" 2> "$WORK/dry.err"
ok_if "dry-run: prints the runtime table" grep -q 'runtimes.vgpu' "$WORK/dry.toml"
ok_if "dry-run: stdout is a config containerd reads" \
    test "$(dump_get "$WORK/dry.toml" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
ok_if "dry-run: the note on stderr" grep -qx "would write $f:" "$WORK/dry.err"
ok_if "dry-run: file untouched" test "$(fingerprint "$f")" = "$before"

# 3b. A handler named vgpu that is someone else's (kata): refused in one line, unconfigure leaves it, the
# file stays what containerd read; --force replaces it with vgpu's.
k=$WORK/kata.toml
printf 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu]\n  runtime_type = "io.containerd.kata.v2"\n' > "$k"
kb=$(fingerprint "$k")
for verb in configure unconfigure; do
    "$VGPUCTL" runtime $verb --runtime=containerd --config "$k" > /dev/null 2> "$WORK/err"
    ok_if "foreign handler: $verb refused" test $? -eq 1
    ok_if "foreign handler: $verb says whose it is, in one line" bash -c \
        "grep -q \"handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2\" '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"
    ok_if "foreign handler: $verb left the file untouched" test "$(fingerprint "$k")" = "$kb"
done
ok_if "foreign handler: containerd still has kata under vgpu" \
    test "$(dump_get "$k" "${V2[@]}" runtimes vgpu runtime_type)" = io.containerd.kata.v2
ok_if "foreign handler: --force replaces it" "$VGPUCTL" runtime configure --runtime=containerd --config "$k" --force > /dev/null
ok_if "foreign handler: after --force containerd has vgpu's" \
    test "$(dump_get "$k" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime

# 4. No file: a minimal valid one is created, and removed again by unconfigure.
f=$WORK/new/config.toml
ok_if "missing file: configure creates it" "$VGPUCTL" runtime configure --runtime=containerd --config "$f" > /dev/null
ok_if "missing file: containerd reads it" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
ok_if "missing file: unconfigure removes it" test ! -e "$f"

# 5. Bad input: one clear line naming path and line; the file untouched.
printf 'version = 2\n[plugins\nx = 1\n' > "$WORK/bad.toml"; before=$(fingerprint "$WORK/bad.toml")
"$VGPUCTL" runtime configure --runtime=containerd --config "$WORK/bad.toml" 2> "$WORK/err" > /dev/null
ok_if "bad file: refused" test $? -ne 0
ok_if "bad file: error names path and line" grep -q "^vgpuctl: error: $WORK/bad.toml:2:" "$WORK/err"
ok_if "bad file: one line" test "$(wc -l < "$WORK/err")" -eq 1
ok_if "bad file: untouched" test "$(fingerprint "$WORK/bad.toml")" = "$before"
"$VGPUCTL" runtime configure --runtime=nosuch --config "$WORK/x" 2> "$WORK/err"
ok_if "unknown runtime: lists the known ones" grep -q "docker, containerd, crio, podman" "$WORK/err"

# 6. A private containerd on the configured file runs containers through the shim with `ctr run`.
t_require "$SHIM" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$LIBVGPU" "$CORE"
mkdir -p "$WORK/ctd-root" "$WORK/ctd-state"
printf 'version = 2\nroot = "%s"\nstate = "%s"\n[grpc]\n  address = "%s"\n' \
    "$WORK/ctd-root" "$WORK/ctd-state" "$WORK/containerd.sock" > "$WORK/run.toml"
"$VGPUCTL" runtime configure --runtime=containerd --config "$WORK/run.toml" --runtime-path "$SHIM" > /dev/null
vgpu_config
containerd --config "$WORK/run.toml" > "$WORK/containerd.log" 2>&1 &
CPID=$!
for _ in $(seq 50); do [ -S "$WORK/containerd.sock" ] && break; sleep 0.2; done
ok_if "private containerd started" test -S "$WORK/containerd.sock"
# The CRI plugin (which owns the runtime handlers) loaded with the vgpu handler in its config.
ok_if "containerd's CRI plugin loaded the config" bash -c \
    "ctr -a '$WORK/containerd.sock' plugins ls | grep -E '^io.containerd.grpc.v1 +cri .* ok *\$' > /dev/null"
ok_if "CRI has the vgpu handler with vgpu.io/* pod annotations and the shim" grep -qE \
    'Start cri plugin with config .*vgpu:\{Type:io.containerd.runc.v2 .*PodAnnotations:\[vgpu.io/\*\] ContainerAnnotations:\[vgpu.io/\*\] .*BinaryName:'"$SHIM" \
    "$WORK/containerd.log"
engine_rootfs "$WORK/rootfs"
CTR=(ctr -a "$WORK/containerd.sock" -n vgpu-e2e)
ok_if "ctr run without a quota passes through" \
    timeout 60 "${CTR[@]}" run --rm --runc-binary "$SHIM" --rootfs "$WORK/rootfs" vgpu-e2e-plain /bin/sh -c 'echo plain-ok' \
    > "$WORK/plain.out" 2>&1
ok_if "plain container printed" grep -q plain-ok "$WORK/plain.out"
timeout 60 "${CTR[@]}" run --rm --runc-binary "$SHIM" \
    --annotation vgpu.io/memory-limit=1Gi --env NVIDIA_VISIBLE_DEVICES=0 --rootfs "$WORK/rootfs" vgpu-e2e-quota \
    /bin/cat /run/vgpu/limits.json > "$WORK/quota.out" 2>&1
ok_if "ctr run with vgpu.io/memory-limit=1Gi sees its limits file" grep -q '"memory_limit": *1073741824' "$WORK/quota.out"
ok_if "state removed after the container" test -z "$(state_left)"
((FAILED)) && { echo "--- containerd log (tail)"; tail -5 "$WORK/containerd.log"; echo "--- plain"; cat "$WORK/plain.out"; echo "--- quota"; cat "$WORK/quota.out"; }
t_done
