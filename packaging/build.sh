#!/usr/bin/env bash
# `make package` (x86-64) and `make package-arm64` (aarch64, VGPU_ARCH=aarch64): the .deb and the .rpm, from
# the metadata in runtime-config/Cargo.toml ([package.metadata.deb], [package.metadata.generate-rpm]). Needs
# the interposer built for that architecture first (`make libvgpu`, `make libvgpu VGPU_ARCH=aarch64`: target/vgpu/,
# target/vgpu-aarch64/). Prints the two package paths.
#   1. the host binaries, built by zig against glibc 2.28 (renameat2, for atomic state swaps, came in 2.28;
#      the interposer itself needs only 2.17), so the packages install on RHEL 8, Debian 10, Ubuntu 18.10
#      and later; Depends/Requires name the floor, read from the binaries by dpkg-shlibdeps and rpm
#   2. vgpuctl's completions and the man pages of vgpuctl, vgpu-hook and vgpu-container-runtime, generated
#      from their CLIs (vgpuctl generate-docs) by this machine's build (they are the same on every
#      architecture; an aarch64 vgpuctl cannot run here)
#   3. the interposer and the generated files staged in target/package-stage/, where the metadata's assets
#      point, then cargo deb and cargo generate-rpm, without building again
# The x86-64 packages go to target/package/, the aarch64 ones (arm64 .deb, aarch64 .rpm) to
# target/package-arm64/.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${VGPU_ARCH:-x86_64}
case "$ARCH" in
    x86_64) LIBS=vgpu OUT=target/package ;;
    aarch64) LIBS=vgpu-aarch64 OUT=target/package-arm64 ;;
    *) echo "package: VGPU_ARCH=$ARCH is not an architecture vgpu packages (x86_64, aarch64)" >&2; exit 1 ;;
esac
TRIPLE=$ARCH-unknown-linux-gnu
HOST_GLIBC=2.28
TOP=${CARGO_TARGET_DIR:-target}
# A target folder of its own: sharing make libvgpu's (glibc 2.17) would rebuild the dependencies at each switch.
export CARGO_TARGET_DIR=$TOP/glibc-$HOST_GLIBC
BIN=$CARGO_TARGET_DIR/$TRIPLE/release
STAGE=target/package-stage
for f in "$TOP/$LIBS/libvgpu.so" "$TOP/$LIBS/libvgpu_core.so" "$TOP/$LIBS/libvgpu-single.so"; do
    [ -f "$f" ] || { echo "package: missing $f (run make build, or make libvgpu VGPU_ARCH=$ARCH)" >&2; exit 1; }
done

cargo zigbuild --release -p vgpuctl -p vgpu-oci --target "$TRIPLE.$HOST_GLIBC" >&2
# The documentation generator: this machine's vgpuctl.
DOCGEN=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/vgpuctl
[ "$ARCH" = x86_64 ] || cargo zigbuild --release -p vgpuctl --target "x86_64-unknown-linux-gnu.$HOST_GLIBC" >&2
# cargo-generate-rpm packs the files as they are; cargo-deb strips its own copies (llvm-strip knows every
# architecture; binutils' strip only this machine's).
STRIP=$(command -v llvm-strip || echo strip)
"$STRIP" "$BIN"/{vgpuctl,vgpu-hook,vgpu-container-runtime}

rm -rf "$OUT" "$STAGE"
mkdir -p "$STAGE/lib" "$OUT"
# libvgpu-single.so rides along for nodes that mount one file (HAMi's device plugin: docs/engines/hami.md).
cp "$TOP/$LIBS/libvgpu.so" "$TOP/$LIBS/libvgpu_core.so" "$TOP/$LIBS/libvgpu-single.so" "$STAGE/lib/"
"$DOCGEN" generate-docs "$STAGE/docs"
gzip -9n "$STAGE"/docs/man/*.1

cargo deb -p vgpuctl --no-build --no-strip --target "$TRIPLE" --output "$OUT/" >&2
cargo generate-rpm -p runtime-config --target "$TRIPLE" --output "$OUT/" >&2
ls "$OUT"/*.deb "$OUT"/*.rpm
