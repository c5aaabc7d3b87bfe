#!/usr/bin/env bash
# containerd: the config vgpuctl writes loads in the real containerd (`config dump`), configure is
# idempotent, unconfigure gives back the file byte for byte, bad files are refused untouched, files the
# config imports are read (never edited), --drop-in puts the handler in a file of its own, and a private
# containerd runs a container through vgpu-container-runtime with `ctr run`, its config edited or a drop-in.
. "$(dirname "$0")/engines-lib.sh"
t_init engines-containerd
t_require "$VGPUCTL"
# vgpuctl's record of what it changed (replaced default, drop-in, import entry), kept out of /var/lib/vgpu.
export VGPUCTL_STATE_DIR=$WORK/var-lib-vgpu
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
ok_if "set-as-default: what it replaced is in vgpuctl's record, not in a comment" bash -c "! grep -q 'vgpuctl: previous' '$f' &&
    jq -e --arg c '$f' '.engines[] | select(.engine == \"containerd\" and .config == \$c) | has(\"previous_default\")' \
    '$VGPUCTL_STATE_DIR/engines.json' > /dev/null"
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
ok_if "set-as-default: undone byte for byte" test "$(fingerprint "$f")" = "$before"
ok_if "set-as-default: default is runc again" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = runc
ok_if "set-as-default: the record is gone" test ! -e "$VGPUCTL_STATE_DIR"
# A config made by an older vgpuctl, which kept the replaced default in a comment: unconfigure still restores it.
cat > "$WORK/older.toml" <<'EOT'
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "vgpu" # vgpuctl: previous default_runtime_name ["\"crun\""," ",""]
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu.options]
  BinaryName = "/usr/bin/vgpu-container-runtime"
EOT
ok_if "older vgpuctl's config: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$WORK/older.toml" > /dev/null
ok_if "older vgpuctl's config: the default from its comment is back" test "$(dump_get "$WORK/older.toml" "${V2[@]}" default_runtime_name)" = crun
ok_if "older vgpuctl's config: no vgpu left" bash -c "! grep -q vgpu '$WORK/older.toml'"

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

# 6. Imports: an operator's main file importing conf.d/*.toml, one of which restates the CRI plugin section.
# containerd 1.x then ignores the main file's CRI section, so editing it would not work: configure says so and
# points at --drop-in, which restates the merged section with the handler in a file read last.
I=$WORK/imp; mkdir -p "$I/conf.d"
printf 'version = 2\n# the operator keeps settings in drop-ins\nimports = ["%s/conf.d/*.toml"]\n[debug]\n  level = "info"\n' "$I" > "$I/config.toml"
cat > "$I/conf.d/10-cri.toml" <<'EOT'
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example/pause:mine"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
EOT
mb=$(fingerprint "$I/config.toml"); cb=$(fingerprint "$I/conf.d/10-cri.toml")
"$VGPUCTL" runtime configure --runtime=containerd --config "$I/config.toml" > /dev/null 2> "$WORK/err"
ok_if "imports: editing the main file is refused" test $? -eq 1
ok_if "imports: in one line naming the import and --drop-in" bash -c \
    "grep -q '10-cri.toml: restates \[plugins.\"io.containerd.grpc.v1.cri\"\].*use --drop-in' '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"
ok_if "imports: --drop-in succeeds" "$VGPUCTL" runtime configure --runtime=containerd --config "$I/config.toml" --drop-in > "$WORK/out"
ok_if "imports: it wrote conf.d/99-vgpu.toml" grep -qx "wrote $I/conf.d/99-vgpu.toml" "$WORK/out"
ok_if "imports: the main file, which imports it already (glob), untouched" test "$(fingerprint "$I/config.toml")" = "$mb"
ok_if "imports: the imported file untouched" test "$(fingerprint "$I/conf.d/10-cri.toml")" = "$cb"
ok_if "imports: containerd has vgpu's handler" \
    test "$(dump_get "$I/config.toml" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
ok_if "imports: with the options of runc from the import" \
    test "$(dump_get "$I/config.toml" "${V2[@]}" runtimes vgpu options SystemdCgroup)" = True
ok_if "imports: and the import's other CRI settings kept" \
    test "$(dump_get "$I/config.toml" plugins io.containerd.grpc.v1.cri sandbox_image)" = registry.example/pause:mine
ok_if "imports: runc still there" test "$(dump_get "$I/config.toml" "${V2[@]}" runtimes runc runtime_type)" = io.containerd.runc.v2
"$VGPUCTL" runtime configure --runtime=containerd --config "$I/config.toml" --drop-in > "$WORK/out"
ok_if "imports: --drop-in again changes nothing" grep -q "nothing to change" "$WORK/out"
ok_if "imports: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$I/config.toml" > /dev/null
ok_if "imports: the drop-in is gone, the operator's files as they were" test "$(ls "$I/conf.d"):$(fingerprint "$I/config.toml"):$(fingerprint "$I/conf.d/10-cri.toml")" = "10-cri.toml:$mb:$cb"
ok_if "imports: containerd has no vgpu handler any more" bash -c "! containerd --config '$I/config.toml' config dump | grep -q 'runtimes.vgpu'"
ok_if "imports: nothing left in the record" test ! -e "$VGPUCTL_STATE_DIR"

# 7. A handler named vgpu in an import vgpuctl did not write (kata): never edited. Editing the main file is
# refused even with --force (the import is read after it and would win); a drop-in read after the import is
# refused without --force and with it overrides kata's; unconfigure takes vgpu's away and kata's is back.
K=$WORK/kimp; mkdir -p "$K/conf.d"
printf 'version = 2\nimports = ["%s/conf.d/*.toml"]\n' "$K" > "$K/config.toml"
printf 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu]\n  runtime_type = "io.containerd.kata.v2"\n' > "$K/conf.d/50-kata.toml"
kb=$(fingerprint "$K/conf.d/50-kata.toml")
for force in "" --force; do
    "$VGPUCTL" runtime configure --runtime=containerd --config "$K/config.toml" $force > /dev/null 2> "$WORK/err"
    ok_if "foreign handler in an import: configure${force:+ $force} refused" test $? -eq 1
    ok_if "foreign handler in an import: configure${force:+ $force} says where, in one line" bash -c \
        "grep -q \"50-kata.toml: the containerd runtime handler vgpu exists and is not vgpu's (runtime_type io.containerd.kata.v2.*does not edit files it did not write\" '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"
done
"$VGPUCTL" runtime configure --runtime=containerd --config "$K/config.toml" --drop-in > /dev/null 2> "$WORK/err"
ok_if "foreign handler in an import: --drop-in without --force refused" grep -q "configure --force replaces it" "$WORK/err"
ok_if "foreign handler in an import: --drop-in --force succeeds" \
    "$VGPUCTL" runtime configure --runtime=containerd --config "$K/config.toml" --drop-in --force > /dev/null
ok_if "foreign handler in an import: the import untouched" test "$(fingerprint "$K/conf.d/50-kata.toml")" = "$kb"
ok_if "foreign handler in an import: containerd now has vgpu's (the drop-in is read after it)" \
    test "$(dump_get "$K/config.toml" "${V2[@]}" runtimes vgpu runtime_type)/$(dump_get "$K/config.toml" "${V2[@]}" runtimes vgpu options BinaryName)" = \
    io.containerd.runc.v2//usr/bin/vgpu-container-runtime
ok_if "foreign handler in an import: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$K/config.toml" > /dev/null
ok_if "foreign handler in an import: kata's is what containerd has again" \
    test "$(dump_get "$K/config.toml" "${V2[@]}" runtimes vgpu runtime_type)" = io.containerd.kata.v2

# 8. --drop-in on a main file that imports nothing: the import entry is added (the rest of the file kept),
# the drop-in written; unconfigure takes both back, byte for byte.
f=$WORK/debian.toml; before=$(fingerprint "$f")
ok_if "drop-in: configure --drop-in --set-as-default succeeds" \
    "$VGPUCTL" runtime configure --runtime=containerd --config "$f" --drop-in --set-as-default > /dev/null
ok_if "drop-in: the main file imports it" grep -qx "imports = \[\"$WORK/conf.d/99-vgpu.toml\"\]" "$f"
ok_if "drop-in: the handler is not in the main file" bash -c "! grep -q vgpu-container-runtime '$f'"
ok_if "drop-in: containerd has the handler" test "$(dump_get "$f" "${V2[@]}" runtimes vgpu options BinaryName)" = /usr/bin/vgpu-container-runtime
ok_if "drop-in: and vgpu as its default" test "$(dump_get "$f" "${V2[@]}" default_runtime_name)" = vgpu
ok_if "drop-in: the record names the drop-in and the import entry" jq -e --arg d "$WORK/conf.d/99-vgpu.toml" \
    '.engines[0] | .drop_in == $d and .import_added.entry == $d' "$VGPUCTL_STATE_DIR/engines.json" > /dev/null
ok_if "drop-in: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
ok_if "drop-in: the main file back byte for byte" test "$(fingerprint "$f")" = "$before"
ok_if "drop-in: the drop-in and the record are gone" test ! -e "$WORK/conf.d/99-vgpu.toml" -a ! -e "$VGPUCTL_STATE_DIR"
ok_if "drop-in: the folder configure made for it is gone too" test ! -e "$WORK/conf.d"
mkdir "$WORK/conf.d"; touch "$WORK/conf.d/10-operator.toml"
"$VGPUCTL" runtime configure --runtime=containerd --config "$f" --drop-in > /dev/null &&
    "$VGPUCTL" runtime unconfigure --runtime=containerd --config "$f" > /dev/null
ok_if "drop-in: a folder that was there stays, with the operator's file" test -e "$WORK/conf.d/10-operator.toml" -a ! -e "$WORK/conf.d/99-vgpu.toml"
rm -r "$WORK/conf.d"
"$VGPUCTL" runtime configure --runtime=docker --drop-in --config "$WORK/x.json" 2> "$WORK/err" > /dev/null
ok_if "drop-in: refused for docker, in one line" bash -c "grep -q -- '--drop-in is for containerd only' '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"

# 9. A private containerd on the configured file runs containers through the shim with `ctr run`.
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

# 10. The same private containerd with the handler in a drop-in instead: its CRI plugin loads it, and the main
# file is back byte for byte afterwards.
stop_containerd
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$WORK/run.toml" > /dev/null
rb=$(fingerprint "$WORK/run.toml")
ok_if "drop-in run: configure --drop-in" \
    "$VGPUCTL" runtime configure --runtime=containerd --config "$WORK/run.toml" --runtime-path "$SHIM" --drop-in "$WORK/run.d/vgpu.toml" > /dev/null
containerd --config "$WORK/run.toml" > "$WORK/containerd2.log" 2>&1 &
CPID=$!
for _ in $(seq 50); do [ -S "$WORK/containerd.sock" ] && ctr -a "$WORK/containerd.sock" version > /dev/null 2>&1 && break; sleep 0.2; done
ok_if "drop-in run: CRI has the vgpu handler from the drop-in" grep -qE \
    'Start cri plugin with config .*vgpu:\{Type:io.containerd.runc.v2 .*PodAnnotations:\[vgpu.io/\*\] ContainerAnnotations:\[vgpu.io/\*\] .*BinaryName:'"$SHIM" \
    "$WORK/containerd2.log"
timeout 60 "${CTR[@]}" run --rm --runc-binary "$SHIM" \
    --annotation vgpu.io/memory-limit=1Gi --env NVIDIA_VISIBLE_DEVICES=0 --rootfs "$WORK/rootfs" vgpu-e2e-quota2 \
    /bin/cat /run/vgpu/limits.json > "$WORK/quota2.out" 2>&1
ok_if "drop-in run: ctr run with vgpu.io/memory-limit=1Gi sees its limits file" grep -q '"memory_limit": *1073741824' "$WORK/quota2.out"
stop_containerd
"$VGPUCTL" runtime unconfigure --runtime=containerd --config "$WORK/run.toml" > /dev/null
ok_if "drop-in run: unconfigure gives the main file back, the drop-in gone" \
    test "$(fingerprint "$WORK/run.toml")/$(ls -A "$WORK/run.d")" = "$rb/"
((FAILED)) && { echo "--- containerd log (tail)"; tail -5 "$WORK/containerd.log"; echo "--- plain"; cat "$WORK/plain.out"; echo "--- quota"; cat "$WORK/quota.out"; }
t_done
