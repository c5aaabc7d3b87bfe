#!/usr/bin/env bash
# vgpu with real Docker 20.10: a private dockerd started here with `runtimes.vgpu` pointing at
# vgpu-container-runtime, an image made by `docker import` of a busybox rootfs, and
# `docker run --runtime=vgpu -e CUDA_DEVICE_MEMORY_LIMIT=...` with the fake GPU driver bind-mounted in.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/dockerd.sh"
. "$(dirname "$0")/lib/vgpu.sh"
t_init oci-docker
t_require "$HOOK" "$SHIM" "$LIBVGPU" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$CLIENTS_DIR/rt_client"
command -v dockerd >/dev/null || { echo "oci-docker: dockerd not installed"; echo "0 passed, 1 failed"; exit 1; }
GIB=1073741824
MIB=1048576

rootfs_busybox "$WORK/rootfs"
rootfs_add_libs "$WORK/rootfs" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR"/* "$LIBVGPU" "$T/vgpu/libvgpu_core.so"
rootfs_tar "$WORK/rootfs" "$WORK/rootfs.tar"
FAKESTATE=$WORK/fakestate
mkdir -p "$FAKESTATE"
# dockerd hands its own environment to the runtimes it starts: that is how VGPU_CONFIG reaches the shim.
vgpu_config
jq -n --arg p "$SHIM" '{"runtimes": {"vgpu": {"path": $p}}}' > "$WORK/daemon.json"
echo "-- starting a private dockerd"
if ! dockerd_start "$WORK/docker" "$WORK/daemon.json"; then fail "dockerd starts"; t_done; fi
check_match "dockerd lists the vgpu runtime" '"vgpu"' "$(docker info --format '{{json .Runtimes}}')"
check "docker import of the test rootfs" docker import "$WORK/rootfs.tar" vgpu-e2e:1

RUN=(docker run --runtime=vgpu --network none
     -v "$FAKE_DIR:/opt/fake:ro" -v "$CLIENTS_DIR:/opt/clients:ro" -v "$FAKESTATE:/fakestate"
     -e LD_LIBRARY_PATH=/opt/fake -e FAKE_CUDA_STATE_DIR=/fakestate -e PATH=/opt/clients:/bin
     -e NVIDIA_VISIBLE_DEVICES=0)

echo "-- docker run --runtime=vgpu -e CUDA_DEVICE_MEMORY_LIMIT=1G"
out=$("${RUN[@]}" --rm -e CUDA_DEVICE_MEMORY_LIMIT=1G vgpu-e2e:1 rt_client device 0 info fill 64Mi 2>&1)
check_eq "the container sees 1 GiB as the GPU's total" "$(field total "$out")" "$GIB"
check_match "filling stops with out-of-memory at the quota" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
bytes=$(field bytes "$out"); free=$(field free "$out")
if [ -n "$bytes" ] && [ -n "$free" ] && [ "$bytes" -le "$free" ] && [ "$bytes" -gt $((free - 64 * MIB)) ]; then
    pass "fill got $((bytes / MIB)) MiB, the quota's free part"; else fail "fill stops at the quota" "$out"; fi
check_eq "no state after docker run --rm" "$(state_left)" ""

echo "-- no quota"
out=$("${RUN[@]}" --rm vgpu-e2e:1 rt_client device 0 info 2>&1)
check_eq "a container without a quota sees the whole 16 GiB GPU" "$(field total "$out")" $((16 * GIB))

echo "-- two containers on one GPU, two processes in one container"
docker_ok() { "$@" >"$WORK/cmd.out" 2>&1 || { cat "$WORK/cmd.out"; return 1; }; }
check "container A starts (2 GiB)" docker_ok "${RUN[@]}" -d --name vgpu-a -e CUDA_DEVICE_MEMORY_LIMIT=2G vgpu-e2e:1 sleep 60
id_a=$(docker inspect -f '{{.Id}}' vgpu-a)
check "state of A provisioned under its container id" test -f "$STATE/containers/$id_a/limits.json"
pid_a=$(docker inspect -f '{{.State.Pid}}' vgpu-a)
check_eq "limits.json of A records its init pid ($pid_a)" "pid $(jq -r .init_pid "$STATE/containers/$id_a/limits.json")" "pid ${pid_a:-none}"
# A context costs 256 MiB (as on a real GPU): first process 256 + 1000, second 256 + 600 > 2048, + 400 fits.
check "process 1 in A holds 1000 MiB" docker exec -d vgpu-a rt_client device 0 !alloc 1000Mi sleep 5
sleep 1
out=$(docker exec vgpu-a rt_client device 0 alloc 600Mi alloc 400Mi 2>&1)
check_match "process 2 in A refused 600 MiB (the quota is shared)" 'size=629145600 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_match "process 2 in A got 400 MiB" 'size=419430400 .*rc=0' "$out"
out=$("${RUN[@]}" --rm -e CUDA_DEVICE_MEMORY_LIMIT=1G vgpu-e2e:1 rt_client device 0 info alloc 700Mi alloc 100Mi 2>&1)
check_eq "container B sees its own 1 GiB" "$(field total "$out")" "$GIB"
check_match "B got 700 MiB while A uses 1.6 GiB of the GPU" 'size=734003200 .*rc=0' "$out"
check_match "B refused 100 MiB more: its own quota" 'size=104857600 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
# Docker's spec carries no name (hostname: the short id; no annotation names it), so status asks dockerd.
spec=$(find "$WORK/docker/exec" -path "*$id_a*" -name config.json 2>/dev/null | head -1)
check "Docker's OCI spec of A found" test -n "$spec"
check_not "  ... it does not carry A's name" grep -q '"vgpu-a"' "$spec"
"$T/release/vgpuctl" status > "$WORK/status.txt" 2>&1
check_match "vgpuctl status shows A by its Docker name (asked of dockerd)" "^${id_a:0:12} .* vgpu-a\$" "$(cat "$WORK/status.txt")"
check_eq "  ... in --json too" "$("$T/release/vgpuctl" status --json | jq -r --arg id "$id_a" '.containers[] | select(.id == $id) | .docker_name')" vgpu-a
metrics=$("$T/release/vgpuctl" monitor --once 2>/dev/null)
check_match "the monitor's container label is A's Docker name" "^vgpu_memory_limit_bytes\\{.*container=\"vgpu-a\".*container_id=\"$id_a\"" "$metrics"
check_match "  ... on HAMi's series too" "^hami_vgpu_memory_limit_bytes\\{.*container=\"vgpu-a\"" "$metrics"
out=$(DOCKER_HOST=unix://$WORK/none.sock "$T/release/vgpuctl" status 2>&1)
check_match "no dockerd at DOCKER_HOST: A shows by its id, without a name" "^${id_a:0:12} .* -\$" "$out"
# A socket that accepts and never answers: status waits the deadline (2 s), then shows the ids.
python3 -c 'import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); time.sleep(30)' "$WORK/mute.sock" &
mute=$!; on_exit "kill $mute"
wait_for 5 test -S "$WORK/mute.sock"
start=$(date +%s)
out=$(DOCKER_HOST=unix://$WORK/mute.sock timeout 20 "$T/release/vgpuctl" status 2>&1)
check_match "a dockerd that never answers: A by its id" "^${id_a:0:12} .* -\$" "$out"
check_match "  ... and one line saying why" '^vgpuctl status: Docker.s names not shown: dockerd did not answer within 2s' "$out"
check "  ... after the deadline, not a hang" test $(( $(date +%s) - start )) -le 5
kill $mute 2>/dev/null
check_match "A cannot write its limits file" 'Read-only file system' "$(docker exec vgpu-a sh -c 'echo x > /run/vgpu/limits.json' 2>&1)"
check_match "A cannot write its ld.so.preload" 'Read-only file system' "$(docker exec vgpu-a sh -c 'echo x > /etc/ld.so.preload' 2>&1)"

echo "-- SIGKILLed and removed"
check "docker kill -s KILL vgpu-a" docker_ok docker kill -s KILL vgpu-a
check "docker rm vgpu-a" docker_ok docker rm vgpu-a
check_eq "no state left" "$(state_left)" ""

echo "-- bad input: docker shows one clear line, nothing provisioned"
for v in "4Qi:unknown unit" "64Gi:larger than" "-1G:negative"; do
    out=$("${RUN[@]}" --rm -e CUDA_DEVICE_MEMORY_LIMIT="${v%%:*}" vgpu-e2e:1 true 2>&1); rc=$?
    if [ "$rc" != 0 ] && printf '%s' "$out" | grep -q "vgpu: env CUDA_DEVICE_MEMORY_LIMIT.*${v#*:}"; then
        pass "CUDA_DEVICE_MEMORY_LIMIT=${v%%:*}: $(printf '%s' "$out" | grep -o 'vgpu: [^"]*' | head -1)"
    else fail "CUDA_DEVICE_MEMORY_LIMIT=${v%%:*} refused with the shim's line (rc=$rc)" "$out"; fi
    check_eq "  ... nothing under the state root" "$(state_left)" ""
done
# HAMi-core's grammar, which the library reads too: 0 in the env is no limit, so no quota at all.
out=$("${RUN[@]}" --rm -e CUDA_DEVICE_MEMORY_LIMIT=0 vgpu-e2e:1 sh -c 'rt_client device 0 info; test -e /run/vgpu/limits.json || echo no-limits-file' 2>&1)
check_eq "CUDA_DEVICE_MEMORY_LIMIT=0 is no quota: the whole 16 GiB GPU" "$(field total "$out")" $((16 * GIB))
check_match "  ... and no limits file" no-limits-file "$out"
check_eq "  ... nothing under the state root" "$(state_left)" ""
out=$("${RUN[@]}" --rm -e NVIDIA_VISIBLE_DEVICES=5 -e CUDA_DEVICE_MEMORY_LIMIT=1G vgpu-e2e:1 true 2>&1)
check_match "a GPU the host does not have is refused" 'vgpu: env NVIDIA_VISIBLE_DEVICES=5: no GPU with index 5' "$out"
check_eq "  ... nothing under the state root" "$(state_left)" ""
t_done
