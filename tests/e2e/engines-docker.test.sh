#!/usr/bin/env bash
# Docker: `vgpuctl runtime configure --runtime=docker` on a daemon.json that a private dockerd then
# runs on; `docker run --runtime=vgpu` goes through vgpu-container-runtime (a quota from the environment,
# as Docker 20.10 has no --annotation); unconfigure gives back daemon.json byte for byte.
. "$(dirname "$0")/engines-lib.sh"
t_init engines-docker
t_require "$VGPUCTL"
# vgpuctl's record of what it changed (the default runtime --set-as-default replaced), kept out of /var/lib/vgpu.
export VGPUCTL_STATE_DIR=$WORK/var-lib-vgpu

# A daemon.json an operator would have, tab-indented (dockerd_start gives this dockerd private paths).
cat > "$WORK/daemon.json" <<EOT
{
	"log-level": "warn",
	"storage-driver": "vfs",
	"ip-masq": false,
	"log-opts": {"max-size": "10m", "max-file": "3"}
}
EOT
chmod 600 "$WORK/daemon.json"
before=$(fingerprint "$WORK/daemon.json")

# 1. Configure: the runtime entry is added, every other key kept in place, mode kept, idempotent.
ok_if "configure succeeds" "$VGPUCTL" runtime configure --runtime=docker --config "$WORK/daemon.json" --runtime-path "$SHIM" > "$WORK/out"
ok_if "says what to restart" grep -q "systemctl restart docker" "$WORK/out"
ok_if "runtimes.vgpu.path is the shim" test "$(jq -r .runtimes.vgpu.path "$WORK/daemon.json")" = "$SHIM"
ok_if "other keys kept in order" test "$(jq -r 'keys_unsorted | join(",")' "$WORK/daemon.json")" = \
    "log-level,storage-driver,ip-masq,log-opts,runtimes"
ok_if "tab indentation and the inline object kept" grep -qP '^\t"log-opts": \{"max-size": "10m", "max-file": "3"\},$' "$WORK/daemon.json"
ok_if "mode 600 kept" test "$(stat -c %a "$WORK/daemon.json")" = 600
after=$(fingerprint "$WORK/daemon.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$WORK/daemon.json" --runtime-path "$SHIM" > /dev/null
ok_if "second configure changes nothing" test "$(fingerprint "$WORK/daemon.json")" = "$after"

# 2. A real dockerd reads it and runs containers through the shim.
t_require "$SHIM" "$HOOK" "$FAKE_DIR/libnvidia-ml.so.1" "$FAKE_DIR/libcuda.so.1" "$LIBVGPU" "$CORE" "$CLIENTS_DIR/rt_client"
vgpu_config
ok_if "dockerd started on the configured daemon.json" dockerd_start "$WORK/docker" "$WORK/daemon.json"
ok_if "dockerd lists the vgpu runtime" bash -c "docker info --format '{{json .Runtimes}}' | jq -e '.vgpu.path == \"$SHIM\"' > /dev/null"
engine_rootfs "$WORK/rootfs" "$CLIENTS_DIR/rt_client"
tar -C "$WORK/rootfs" -c . | docker import - vgpu-e2e:rootfs > /dev/null
ok_if "docker run --runtime=vgpu without a quota passes through" \
    bash -c "docker run --rm --runtime=vgpu --network none vgpu-e2e:rootfs /bin/sh -c 'echo plain-ok' | grep -q plain-ok"
docker run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=1Gi -e NVIDIA_VISIBLE_DEVICES=0 \
    vgpu-e2e:rootfs /bin/cat /run/vgpu/limits.json > "$WORK/quota.out" 2>&1
ok_if "docker run --runtime=vgpu -e CUDA_DEVICE_MEMORY_LIMIT=1Gi sees its limits file" \
    grep -q '"memory_limit": *1073741824' "$WORK/quota.out"
# Enforced: the fake driver (a 16 GiB device) bind-mounted in, a client allocating like the CUDA runtime.
docker run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=1Gi -e NVIDIA_VISIBLE_DEVICES=0 \
    -e LD_LIBRARY_PATH=/usr/local/fake -v "$FAKE_DIR:/usr/local/fake:ro" vgpu-e2e:rootfs \
    /bin/rt_client info alloc 512Mi alloc 512Mi > "$WORK/cuda.out" 2>&1
ok_if "inside, the GPU's total is the quota" grep -q 'op=info .*total=1073741824' "$WORK/cuda.out"
ok_if "past the quota an allocation fails with out-of-memory" \
    grep -q 'op=alloc size=536870912 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$WORK/cuda.out"
docker run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=-1 -e NVIDIA_VISIBLE_DEVICES=0 \
    vgpu-e2e:rootfs /bin/true > "$WORK/badquota.out" 2>&1
ok_if "a bad quota fails docker run" test $? -ne 0
ok_if "state removed after the containers" test -z "$(state_left)"
dockerd_stop

# 3. Unconfigure: daemon.json exactly as it was; again is a no-op.
ok_if "unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=docker --config "$WORK/daemon.json" > /dev/null
ok_if "daemon.json back byte for byte" test "$(fingerprint "$WORK/daemon.json")" = "$before"
"$VGPUCTL" runtime unconfigure --runtime=docker --config "$WORK/daemon.json" > "$WORK/out"
ok_if "second unconfigure changes nothing" grep -q "nothing to change" "$WORK/out"

# 4. --set-as-default replaces an explicit default-runtime and unconfigure puts it back.
printf '{\n  "default-runtime": "runc",\n  "debug": false\n}\n' > "$WORK/def.json"; b=$(fingerprint "$WORK/def.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$WORK/def.json" --set-as-default > /dev/null
ok_if "set-as-default: default-runtime is vgpu" test "$(jq -r '."default-runtime"' "$WORK/def.json")" = vgpu
ok_if "set-as-default: the replaced runc is in vgpuctl's record" jq -e --arg c "$WORK/def.json" \
    '.engines[] | select(.engine == "docker" and .config == $c) | .previous_default.name == "runc"' \
    "$VGPUCTL_STATE_DIR/engines.json" > /dev/null
ok_if "set-as-default: nothing written beside daemon.json" test "$(ls -A "$WORK" | grep -c vgpuctl)" -eq 0
"$VGPUCTL" runtime unconfigure --runtime=docker --config "$WORK/def.json" > /dev/null
ok_if "set-as-default: undone byte for byte" test "$(fingerprint "$WORK/def.json")" = "$b"
ok_if "set-as-default: the record is gone" test ! -e "$VGPUCTL_STATE_DIR"
# A daemon.json configured by an older vgpuctl, which kept the replaced default in a hidden file beside it.
printf '{\n  "default-runtime": "vgpu",\n  "runtimes": {"vgpu": {"path": "%s"}}\n}\n' "$SHIM" > "$WORK/old.json"
printf '{"default-runtime":"crun"}\n' > "$WORK/.old.json.vgpuctl-previous-default"
ok_if "older vgpuctl's config: unconfigure succeeds" "$VGPUCTL" runtime unconfigure --runtime=docker --config "$WORK/old.json" > /dev/null
ok_if "older vgpuctl's config: the default it replaced is back" test "$(jq -c . "$WORK/old.json")" = '{"default-runtime":"crun"}'
ok_if "older vgpuctl's config: its hidden file is gone" test ! -e "$WORK/.old.json.vgpuctl-previous-default"

# 5. Bad input.
printf '{\n  "debug": true,\n  "runtimes": {,}\n}\n' > "$WORK/bad.json"; b=$(fingerprint "$WORK/bad.json")
"$VGPUCTL" runtime configure --runtime=docker --config "$WORK/bad.json" 2> "$WORK/err" > /dev/null
ok_if "bad daemon.json: refused with path and line" grep -q "^vgpuctl: error: $WORK/bad.json:3:" "$WORK/err"
ok_if "bad daemon.json: untouched" test "$(fingerprint "$WORK/bad.json")" = "$b"

# 6. A runtime named vgpu that is someone else's: dockerd runs with it; configure refuses it in one line and
# unconfigure leaves it (daemon.json untouched); configure --force replaces it, and dockerd then runs
# containers through vgpu's shim.
printf '{\n  "runtimes": {\n    "vgpu": {"path": "/usr/local/bin/their-runtime", "runtimeArgs": ["--x"]}\n  }\n}\n' > "$WORK/theirs.json"
tb=$(fingerprint "$WORK/theirs.json")
for verb in configure unconfigure; do
    "$VGPUCTL" runtime $verb --runtime=docker --config "$WORK/theirs.json" > /dev/null 2> "$WORK/err"
    ok_if "foreign runtime: $verb refused" test $? -eq 1
    ok_if "foreign runtime: $verb says whose it is, in one line" bash -c \
        "grep -q \"runtimes.vgpu exists and is not vgpu's (its path is /usr/local/bin/their-runtime)\" '$WORK/err' && test \$(wc -l < '$WORK/err') -eq 1"
    ok_if "foreign runtime: $verb left daemon.json untouched" test "$(fingerprint "$WORK/theirs.json")" = "$tb"
done
ok_if "foreign runtime: dockerd starts on that daemon.json" dockerd_start "$WORK/docker2" "$WORK/theirs.json"
ok_if "foreign runtime: dockerd lists their vgpu runtime" bash -c \
    "docker info --format '{{json .Runtimes}}' | jq -e '.vgpu.path == \"/usr/local/bin/their-runtime\"' > /dev/null"
dockerd_stop
ok_if "foreign runtime: configure --force replaces it" \
    "$VGPUCTL" runtime configure --runtime=docker --config "$WORK/theirs.json" --runtime-path "$SHIM" --force > /dev/null
ok_if "foreign runtime: after --force, vgpu's entry alone" test "$(jq -c .runtimes.vgpu "$WORK/theirs.json")" = "{\"path\":\"$SHIM\"}"
ok_if "foreign runtime: dockerd starts on the replaced file" dockerd_start "$WORK/docker3" "$WORK/theirs.json"
ok_if "foreign runtime: dockerd lists vgpu's shim" bash -c \
    "docker info --format '{{json .Runtimes}}' | jq -e '.vgpu.path == \"$SHIM\"' > /dev/null"
tar -C "$WORK/rootfs" -c . | docker import - vgpu-e2e:rootfs > /dev/null
docker run --rm --runtime=vgpu --network none -e CUDA_DEVICE_MEMORY_LIMIT=1Gi -e NVIDIA_VISIBLE_DEVICES=0 \
    vgpu-e2e:rootfs /bin/cat /run/vgpu/limits.json > "$WORK/forced.out" 2>&1
ok_if "foreign runtime: after --force, docker run --runtime=vgpu gets its quota" \
    grep -q '"memory_limit": *1073741824' "$WORK/forced.out"
dockerd_stop
ok_if "foreign runtime: unconfigure now removes vgpu's entry" bash -c \
    "'$VGPUCTL' runtime unconfigure --runtime=docker --config '$WORK/theirs.json' > /dev/null && test \"\$(jq -c . '$WORK/theirs.json')\" = '{}'"
((FAILED)) && { echo "--- dockerd log (tail)"; tail -5 "$WORK/docker/dockerd.log"; echo "--- quota container"; cat "$WORK/quota.out" "$WORK/cuda.out"; }
t_done
