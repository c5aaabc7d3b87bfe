#!/usr/bin/env bash
# The Kubernetes installer for real, short of a cluster: the installer image is built offline
# (packaging/installer/build.sh, docker import into a private dockerd) and its entrypoint run as the
# DaemonSet runs it, with a folder standing in for the node's root (busybox and glibc, containerd's config).
# Checked: what install writes (files, config.toml, lower_runtime, containerd's vgpu handler), that a second
# install changes nothing, that the monitor container's entrypoint serves the node's metrics, that uninstall restores containerd's config byte for byte and removes exactly what
# install wrote, and that the manifests validate against the Kubernetes API schemas (offline).
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
t_init installer
t_require "$T/vgpu/libvgpu.so" "$T/vgpu/libvgpu_core.so"
command -v kubernetes-validate >/dev/null || { echo "installer: kubernetes-validate missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }

echo "-- the manifests"
for m in "$REPO"/packaging/kubernetes/*.yaml; do
    check "$(basename "$m") validates (kubernetes-validate --strict)" kubernetes-validate --strict --quiet "$m"
done
check_eq "the manifests run the image build.sh tags" \
    "$(grep -ho 'image: vgpu/installer:.*' "$REPO"/packaging/kubernetes/*.yaml | sort -u)" \
    "image: vgpu/installer:$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)"

echo "-- the image"
bash "$REPO/packaging/build.sh" > /dev/null 2> "$WORK/package.err" || { tail -20 "$WORK/package.err"; }
dockerd_start "$WORK/docker" || { echo "0 passed, 1 failed"; exit 1; }
IMG=vgpu-e2e/installer:test
check "the image builds with docker import (nothing pulled)" bash "$REPO/packaging/installer/build.sh" "$IMG"
check_eq "its entrypoint is install.sh install" \
    "$(docker image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' "$IMG" 2>&1)" '["/vgpu/install.sh"] ["install"]'

# node DIR: a node's root filesystem: busybox, /usr/lib and /usr/local/bin as every distribution has them, the glibc the vgpu binaries need, containerd's config.
BIN=$T/glibc-2.28/x86_64-unknown-linux-gnu/release
node() {
    rootfs_busybox "$1" && rootfs_add_libs "$1" "$BIN/vgpuctl" "$BIN/vgpu-hook" "$BIN/vgpu-container-runtime" &&
        mkdir -p "$1/etc/containerd" "$1/usr/lib" "$1/usr/local/bin" "$1/usr/bin" &&
        printf 'version = 2\n\n# the operator'"'"'s comment\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n' \
            > "$1/etc/containerd/config.toml"
}
installer() { local root=$1; shift; docker run --rm -e VGPU_RESTART=none "$@" -v "$root:/host" "$IMG" "${INSTALLER_ARGS[@]}"; }

echo "-- install on a node without NVIDIA's runtime"
N=$WORK/node1; node "$N"
find "$N" | sort > "$WORK/node1.before"
before=$(fingerprint "$N/etc/containerd/config.toml")
INSTALLER_ARGS=(install)
check "install succeeds" installer "$N"
for f in usr/local/bin/vgpuctl usr/local/bin/vgpu-hook usr/local/bin/vgpu-container-runtime usr/lib/vgpu/libvgpu.so usr/lib/vgpu/libvgpu_core.so; do
    check "installed: /$f" test -s "$N/$f"
done
check "the binaries are the image's (cmp)" cmp "$N/usr/local/bin/vgpuctl" "$BIN/vgpuctl"
check_match "config.toml: lower_runtime = runc, the installed hook and library" \
    '^hook_path = "/usr/local/bin/vgpu-hook"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
check_match "  ... lower_runtime" '^lower_runtime = "runc"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
check_match "containerd's config gains the vgpu handler calling /usr/local/bin/vgpu-container-runtime" \
    'runtimes\.vgpu' "$(cat "$N/etc/containerd/config.toml")"
check "  ... with the installed path" grep -q '/usr/local/bin/vgpu-container-runtime' "$N/etc/containerd/config.toml"
check "  ... and the operator's comment kept" grep -q "the operator's comment" "$N/etc/containerd/config.toml"
check_match "the installed vgpuctl runs on the node's own glibc (chroot)" '^vgpuctl ' \
    "$(chroot "$N" /usr/local/bin/vgpuctl --version 2>&1)"
after1=$(fingerprint "$N/etc/containerd/config.toml"); manifest1=$(cat "$N/etc/vgpu/installed-by-daemonset")
check "a second install (a pod restart) succeeds" installer "$N"
check_eq "  ... and changes nothing" "$(fingerprint "$N/etc/containerd/config.toml") $(cat "$N/etc/vgpu/installed-by-daemonset")" "$after1 $manifest1"

echo "-- the monitor container (install.sh monitor): the installed vgpuctl, chrooted into the node"
INSTALLER_ARGS=(monitor --once)
out=$(installer "$N" 2>"$WORK/monitor.err")
check_match "  ... prints one scrape of the node's state root" '^vgpu_state_errors [0-9]+$' "$out"
check_match "  ... with no NVML on this node: vgpu_nvml_up 0" '^vgpu_nvml_up 0$' "$out"
check_match "  ... in OpenMetrics text" '^# EOF$' "$out"

echo "-- uninstall"
INSTALLER_ARGS=(uninstall)
check "uninstall succeeds" installer "$N"
check_eq "containerd's config is byte for byte as before install" "$(fingerprint "$N/etc/containerd/config.toml")" "$before"
check_eq "the node holds exactly the files it had before" "$(find "$N" | sort | diff "$WORK/node1.before" -)" ""

echo "-- a node with NVIDIA's runtime and an operator's config.toml"
N=$WORK/node2; node "$N"
printf '#!/bin/sh\nexec runc "$@"\n' > "$N/usr/bin/nvidia-container-runtime"
chmod 755 "$N/usr/bin/nvidia-container-runtime"
INSTALLER_ARGS=(install)
check "install succeeds" installer "$N"
check_match "lower_runtime = nvidia-container-runtime (NVIDIA's injection still happens)" \
    '^lower_runtime = "nvidia-container-runtime"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
INSTALLER_ARGS=(uninstall); installer "$N" 2>/dev/null
N=$WORK/node3; node "$N"; mkdir -p "$N/etc/vgpu"; echo 'state_root = "/var/run/vgpu-op"' > "$N/etc/vgpu/config.toml"
INSTALLER_ARGS=(install)
check_match "an operator's config.toml is left as it is" 'exists: left as it is' "$(installer "$N" 2>&1)"
INSTALLER_ARGS=(uninstall)
check "  ... uninstall succeeds" installer "$N"
check_eq "  ... and keeps it" "$(cat "$N/etc/vgpu/config.toml")" 'state_root = "/var/run/vgpu-op"'

echo "-- bad input"
N=$WORK/node4; node "$N"; find "$N" | sort > "$WORK/node4.before"
INSTALLER_ARGS=(install)
out=$(installer "$N" -e VGPU_ENGINE=kata 2>&1)
check_eq "an unknown engine is one line naming it" "$out" "vgpu-installer: VGPU_ENGINE=kata: not containerd, docker, crio or podman"
check_eq "  ... and nothing is written" "$(find "$N" | sort | diff "$WORK/node4.before" -)" ""
INSTALLER_ARGS=(install)
check_match "no node root mounted: one line" 'holds no node root' "$(docker run --rm "$IMG" install 2>&1)"
t_done
