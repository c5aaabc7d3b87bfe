#!/usr/bin/env bash
# `vgpuctl doctor` on this machine: a node set up as the docs say (config, Docker's entry written by vgpuctl,
# the fake NVML, NVIDIA's runtime on PATH, the state root on a size-capped tmpfs of its own) is all ok with
# exit 0; then one thing broken at a time gives the right line and exit status (1: a failure, 2: warnings
# only): a broken config line, a missing engine entry, someone else's vgpu entry, NVML not loading, a state
# root shared with its parent filesystem; and options that do not fit.
. "$(dirname "$0")/engines-lib.sh"
t_init doctor
t_require "$VGPUCTL" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$LIBVGPU" "$CORE"
vgpu_config
mkdir -p "$STATE" "$WORK/bin"
mount -t tmpfs -o size=16m,mode=0711 tmpfs "$STATE" && on_exit "umount -l '$STATE'"
# NVIDIA's runtime as the toolkit installs it (a stand-in: doctor only looks for it).
printf '#!/bin/sh\nexec runc "$@"\n' > "$WORK/bin/nvidia-container-runtime"; chmod +x "$WORK/bin/nvidia-container-runtime"
export PATH=$WORK/bin:$PATH
DJ=$WORK/daemon.json
echo '{"log-level": "warn"}' > "$DJ"
"$VGPUCTL" runtime configure --runtime=docker --config "$DJ" --runtime-path "$SHIM" > /dev/null
DOC=("$VGPUCTL" doctor --runtime docker --config "$DJ")
doctor() { "${DOC[@]}" "$@" > "$WORK/out" 2>&1; echo $? > "$WORK/rc"; }
rc() { cat "$WORK/rc"; }
line() { grep -E "^$1 +$2 +" "$WORK/out"; }

# 1. All well.
doctor
ok_if "a node set up as documented: exit 0" test "$(rc)" = 0
ok_if "config: parses, every key known" line ok config > /dev/null
ok_if "engine: docker has vgpu's entry" bash -c "grep -qxF 'ok    engine    docker: vgpu'\"'\"'s entry in $DJ' '$WORK/out'"
ok_if "nvml: the fake's GPU through the real binding" bash -c "grep -E '^ok +nvml' '$WORK/out' | grep -q '1 GPU: 0 GPU-fa4ec0de-0000-4000-8000-000000000000 16.0 GiB'"
ok_if "driver: version and per-cgroup limits" bash -c "grep -E '^ok +driver' '$WORK/out' | grep -q 'driver 580.65.06; per-cgroup GPU memory limits (r615+): yes'"
ok_if "nvidia: its runtime found on PATH" bash -c "grep -E '^ok +nvidia' '$WORK/out' | grep -qF 'runtime $WORK/bin/nvidia-container-runtime'"
ok_if "state: a tmpfs of its own, its size" bash -c "grep -E '^ok +state' '$WORK/out' | grep -qF '$STATE: on $STATE (tmpfs, 16.0 MiB, its own)'"
ok_if "files: library, hook, lower runtime" line ok files > /dev/null
ok_if "hmm/ats: GPU 0 off (the fake's default, as the H100 here)" bash -c "grep -E '^ok +hmm/ats' '$WORK/out' | grep -qF 'GPU 0: off'"
ok_if "one line per check, then the count" bash -c "grep -vcE '^(ok|warn|FAIL|-) +[a-z/]+ +' '$WORK/out' | grep -qx 1 && tail -1 '$WORK/out' | grep -qx 'vgpuctl doctor: 0 failed, 0 warnings'"

# Issue 46: configure advised lower_runtime = "nvidia-container-runtime", a bare name the shim did not find on
# the GPU Operator's nodes, and a node with NVIDIA's runtime kept runc underneath with no warning.
ok_if "runtime configure wrote NVIDIA's runtime, by its absolute path, as lower_runtime" \
    grep -qx "lower_runtime = \"$WORK/bin/nvidia-container-runtime\"" "$VGPU_CONFIG"
cp "$VGPU_CONFIG" "$WORK/nvidia.toml"
sed -i 's|^lower_runtime = .*|lower_runtime = "runc"|' "$VGPU_CONFIG"
"$VGPUCTL" runtime configure --runtime=docker --config "$DJ" --runtime-path "$SHIM" --no-nvidia-lower-runtime > /dev/null
ok_if "--no-nvidia-lower-runtime leaves lower_runtime = runc" grep -qx 'lower_runtime = "runc"' "$VGPU_CONFIG"
doctor
ok_if "  ... which doctor warns about: exit 2" test "$(rc)" = 2
ok_if "  ... warn nvidia naming NVIDIA's runtime and runc" bash -c "grep -E '^warn +nvidia +' '$WORK/out' | grep -qF 'runtime $WORK/bin/nvidia-container-runtime is installed but not used: lower_runtime = \"runc\"'"
cp "$WORK/nvidia.toml" "$VGPU_CONFIG"
# A configure that changes only vgpu's own config.toml (lower_runtime; daemon.json already configured) said
# "restart docker to apply", though the shim reads config.toml at each container's creation.
sed -i 's|^lower_runtime = .*|lower_runtime = "runc"|' "$VGPU_CONFIG"
"$VGPUCTL" runtime configure --runtime=docker --config "$DJ" --runtime-path "$SHIM" > "$WORK/lower.out" 2>&1
ok_if "a configure that changes only lower_runtime sets it" grep -qx "lower_runtime = \"$WORK/bin/nvidia-container-runtime\"" "$VGPU_CONFIG"
ok_if "  ... and asks for no restart of Docker" bash -c "! grep -q 'systemctl restart docker' '$WORK/lower.out' && grep -qF 'no restart needed' '$WORK/lower.out'"

# HMM on: a warning naming the node setting that turns it off; exit 2.
FAKE_NVML_ADDRESSING_MODE=hmm doctor
ok_if "HMM on: exit 2" test "$(rc)" = 2
ok_if "  ... warn hmm/ats naming uvm_disable_hmm=1" bash -c "grep -E '^warn +hmm/ats' '$WORK/out' | grep -qF 'uvm_disable_hmm=1'"

# 2. A broken config line: the line names the file, line and key; exit 1.
cp "$VGPU_CONFIG" "$WORK/good.toml"
echo 'lower_runtim = "crun"' >> "$VGPU_CONFIG"
doctor
ok_if "broken config line: exit 1" test "$(rc)" = 1
ok_if "  ... FAIL config naming file:line:column and the key" bash -c \
    "grep -E '^FAIL +config +vgpu config $VGPU_CONFIG:6:1: unknown field \`lower_runtim\`' '$WORK/out'" > /dev/null
cp "$WORK/good.toml" "$VGPU_CONFIG"

# 3. The engine entry missing (unconfigured): a warning with the command; exit 2.
"$VGPUCTL" runtime unconfigure --runtime=docker --config "$DJ" > /dev/null
doctor
ok_if "missing engine entry: exit 2" test "$(rc)" = 2
ok_if "  ... warn engine with the command to run" bash -c \
    "grep -qxF 'warn  engine    docker: no vgpu entry in $DJ (vgpuctl runtime configure --runtime=docker)' '$WORK/out'"
# 4. Someone else's runtime named vgpu: a failure.
echo '{"runtimes": {"vgpu": {"path": "/usr/bin/kata-runtime"}}}' > "$DJ"
doctor
ok_if "a vgpu entry that is not vgpu's: exit 1" test "$(rc)" = 1
ok_if "  ... FAIL engine saying whose" bash -c "grep -E '^FAIL +engine +docker: $DJ has an entry named vgpu that is not vgpu' '$WORK/out'" > /dev/null
echo '{"runtimes": {"vgpu": ' > "$DJ"
doctor
ok_if "an engine config that does not parse: exit 1, FAIL engine" bash -c "test $(rc) = 1 && grep -qE '^FAIL +engine +docker: ' '$WORK/out'"
echo '{}' > "$DJ"
"$VGPUCTL" runtime configure --runtime=docker --config "$DJ" --runtime-path "$SHIM" > /dev/null

# 5. NVML not loading: a failure naming the library and the config key.
doctor --nvml-library /nonexistent/libnvidia-ml.so.1
ok_if "NVML not loading: exit 1" test "$(rc)" = 1
ok_if "  ... FAIL nvml naming the library, dlopen's reason and the key" bash -c \
    "grep -qE '^FAIL +nvml +cannot load NVML \(/nonexistent/libnvidia-ml.so.1\): dlopen failed: .*No such file or directory \(config key nvml_library\)$' '$WORK/out'"

# 6. The state root on its parent's filesystem: a warning with the mount that caps it.
umount -l "$STATE"
doctor
ok_if "state root shared with its parent filesystem: exit 2" test "$(rc)" = 2
ok_if "  ... warn state with the tmpfs to mount" bash -c \
    "grep -E '^warn +state +$STATE: on .*, shared\): .*mount -t tmpfs -o size=64m,mode=0711 tmpfs $STATE$' '$WORK/out'" > /dev/null

# 7. Options: an engine's file without --runtime, another engine's option.
"$VGPUCTL" doctor --config "$DJ" > /dev/null 2> "$WORK/err"
ok_if "--config without --runtime: refused" test $? = 1
ok_if "  ... in one line" grep -qx "vgpuctl: error: --config names an engine's files: give --runtime too" "$WORK/err"
"$VGPUCTL" doctor --runtime docker --hooks-dir "$WORK" > /dev/null 2> "$WORK/err"
ok_if "another engine's option: refused in one line" grep -qx 'vgpuctl: error: --hooks-dir is for podman only' "$WORK/err"
((FAILED)) && cat "$WORK/out"
t_done
