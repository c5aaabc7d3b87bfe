#!/usr/bin/env bash
# The installer image, made offline from the project's own files (no base image is pulled): a static busybox
# (for /bin/sh, cp, chroot, nsenter), the glibc-2.28 host binaries of `make package` and the interposer in
# /vgpu, and install.sh as the entrypoint (the chart's gc and monitor run /vgpu/vgpuctl in the image, with
# the glibc below). The chart's DRA and device plugin DaemonSets run vgpu-dra-plugin and vgpu-device-plugin
# from the same image, and its uninstall hook's Job vgpu-daemonset-wait, in the image (not on the node):
# /usr/local/bin/ (the workspace builds) with the glibc
# they were linked against, copied from this machine at its paths, and the glibc libraries NVML itself needs
# (libdl, libpthread, librt, libm), as the node's libnvidia-ml.so.1 is loaded from the mounted driver root.
# `docker import` of that root filesystem; the image is tagged vgpu/installer:VERSION (or $1) in the Docker
# that DOCKER_HOST names. Prints the tag.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
TAG=${1:-vgpu/installer:$VERSION}
BIN=${CARGO_TARGET_DIR:-target}/glibc-2.28/x86_64-unknown-linux-gnu/release
DRA=${CARGO_TARGET_DIR:-target}/release/vgpu-dra-plugin
DP=${CARGO_TARGET_DIR:-target}/release/vgpu-device-plugin
DW=${CARGO_TARGET_DIR:-target}/release/vgpu-daemonset-wait
for f in "$BIN"/{vgpuctl,vgpu-hook,vgpu-container-runtime} "$DRA" "$DP" "$DW" target/vgpu/libvgpu.so target/vgpu/libvgpu_core.so target/vgpu/libvgpu-single.so /bin/busybox; do
    [ -f "$f" ] || { echo "installer: missing $f (run make package; busybox: apt-get install busybox-static)" >&2; exit 1; }
done
ROOT=target/installer/rootfs
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,vgpu,host,tmp,proc,sys,dev,etc}
cp /bin/busybox "$ROOT/bin/"
for a in sh cp mv rm mkdir rmdir chmod cat echo printf grep find md5sum dirname chroot nsenter sleep; do
    ln -s busybox "$ROOT/bin/$a"
done
install -m 0755 "$BIN"/{vgpuctl,vgpu-hook,vgpu-container-runtime} packaging/installer/install.sh "$ROOT/vgpu/"
install -m 0644 target/vgpu/libvgpu.so target/vgpu/libvgpu_core.so target/vgpu/libvgpu-single.so "$ROOT/vgpu/"
mkdir -p "$ROOT/usr/local/bin"
install -m 0755 "$DRA" "$DP" "$DW" "$ROOT/usr/local/bin/"
"$(command -v llvm-strip || echo strip)" "$ROOT/usr/local/bin/"{vgpu-dra-plugin,vgpu-device-plugin,vgpu-daemonset-wait}
# The plugins' and vgpuctl's shared libraries (ldd: "name => /path (addr)", the loader as "/path (addr)"),
# then NVML's: the chart's gc and monitor run /vgpu/vgpuctl in the image too, with only the node paths they
# need mounted (install.sh).
libs=$( (ldd "$DRA"; ldd "$DP"; ldd "$DW"; ldd "$BIN/vgpuctl") | grep -Eo '/[^ ]+' | grep -v '^/proc' | sort -u)
libc=$(printf '%s\n' $libs | grep '/libc\.so\.6$')
for l in libdl.so.2 libpthread.so.0 librt.so.1 libm.so.6; do libs="$libs $(dirname "$libc")/$l"; done
for l in $libs; do
    [ -e "$l" ] || { echo "installer: missing $l (the plugin's or NVML's glibc)" >&2; exit 1; }
    mkdir -p "$ROOT$(dirname "$l")"
    cp -L "$l" "$ROOT$l"
done
tar -C "$ROOT" --owner=0 --group=0 -cf target/installer/rootfs.tar .
docker import --change 'ENTRYPOINT ["/vgpu/install.sh"]' --change 'CMD ["install"]' \
    --change 'ENV PATH=/bin' target/installer/rootfs.tar "$TAG" > /dev/null
echo "$TAG"
