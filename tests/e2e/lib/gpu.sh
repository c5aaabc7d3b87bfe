# A container on a real NVIDIA GPU without any image: the rootfs is the host's own system folders,
# bind-mounted read-only (pivot_root into / itself fails), /etc copied (the preload file is mounted over a
# file in it), /usr/local and /tmp as tmpfs (the library is mounted into /usr/local), and the /dev/nvidia*
# nodes in linux.devices. Used by `make demo` on a GPU and by tests/gpu/container.sh.
#   gpu_bundle DIR ROOTFS CMD...    bundle DIR running CMD in such a container (NVIDIA_VISIBLE_DEVICES=0,
#                                   $CLIENTS_DIR mounted at /vgpu-clients and first in PATH,
#                                   LD_LIBRARY_PATH=$GPU_HOST_LD_LIBRARY_PATH when set)

gpu_bundle() {
    local dir=$1 rootfs=$2 d n maj min; shift 2
    mkdir -p "$rootfs"/{usr,lib,lib64,bin,sbin,opt,etc,tmp,proc,sys,dev,run}
    cp -a /etc/. "$rootfs/etc/" 2>/dev/null || true
    rm -f "$rootfs/etc/ld.so.preload"
    bundle_new "$dir" "$rootfs" "$@"
    bundle_jq "$dir" '.root.readonly = false'
    for d in usr lib lib64 bin sbin opt; do
        if [ -L "/$d" ]; then      # merged /usr: /lib -> usr/lib, the same link in the rootfs
            rmdir "$rootfs/$d" 2>/dev/null; ln -sfn "$(readlink "/$d")" "$rootfs/$d"
        elif [ -d "/$d" ]; then
            bundle_bind "$dir" "/$d" "/$d" ro
        fi
    done
    bundle_jq "$dir" '.mounts += [{"destination": "/usr/local", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","nodev","mode=755"]},
                                  {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","nodev","mode=1777"]}]'
    # The tmpfs hides the host's /usr/local (where GPU hosts often keep the driver and CUDA): bring its
    # entries back, read-only, beside the folder the library will be mounted in.
    for d in /usr/local/*; do
        [ -e "$d" ] && [ "$d" != /usr/local/vgpu ] && bundle_bind "$dir" "$(readlink -f "$d")" "$d" ro
    done
    bundle_bind "$dir" "$CLIENTS_DIR" /vgpu-clients ro
    # GPU 0's node only: the devices a container is given decide its GPUs, and must agree with the env.
    for n in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
        [ -c "$n" ] || continue
        maj=$((16#$(stat -c %t "$n"))); min=$((16#$(stat -c %T "$n")))
        bundle_jq "$dir" '.linux.devices += [{"path": $p, "type": "c", "major": $M, "minor": $m, "fileMode": 438, "uid": 0, "gid": 0}]
            | .linux.resources.devices += [{"allow": true, "type": "c", "major": $M, "minor": $m, "access": "rwm"}]' \
            --arg p "$n" --argjson M "$maj" --argjson m "$min"
    done
    bundle_env "$dir" NVIDIA_VISIBLE_DEVICES=0 PATH=/vgpu-clients:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
    # where the host finds its driver, the container finds it too
    [ -n "${GPU_HOST_LD_LIBRARY_PATH:-}" ] && bundle_env "$dir" LD_LIBRARY_PATH="$GPU_HOST_LD_LIBRARY_PATH"
    return 0
}
