#!/usr/bin/env bash
# `make package`: the .deb and the .rpm, from the metadata in runtime-config/Cargo.toml
# ([package.metadata.deb], [package.metadata.generate-rpm]). Needs `make build` first (the interposer in
# target/vgpu/). Prints the two package paths.
#   1. the host binaries, built by zig against glibc 2.28 (renameat2, for atomic state swaps, came in 2.28;
#      the interposer itself needs only 2.17), so the packages install on RHEL 8, Debian 10, Ubuntu 18.10
#      and later; Depends/Requires name the floor, read from the binaries by dpkg-shlibdeps and rpm
#   2. vgpuctl's completions and the man pages of vgpuctl, vgpu-hook and vgpu-container-runtime, generated
#      from their CLIs (vgpuctl generate-docs)
#   3. cargo deb and cargo generate-rpm, without building again
set -euo pipefail
cd "$(dirname "$0")/.."
TRIPLE=x86_64-unknown-linux-gnu
HOST_GLIBC=2.28
# A target folder of its own: sharing make libvgpu's (glibc 2.17) would rebuild the dependencies at each switch.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}/glibc-$HOST_GLIBC
BIN=$CARGO_TARGET_DIR/$TRIPLE/release
OUT=target/package
for f in target/vgpu/libvgpu.so target/vgpu/libvgpu_core.so; do
    [ -f "$f" ] || { echo "package: missing $f (run make build)" >&2; exit 1; }
done

cargo zigbuild --release -p vgpuctl -p vgpu-oci --target "$TRIPLE.$HOST_GLIBC" >&2
# cargo-generate-rpm packs the files as they are; cargo-deb strips its own copies.
strip "$BIN"/{vgpuctl,vgpu-hook,vgpu-container-runtime}

rm -rf "$OUT"
"$BIN/vgpuctl" generate-docs "$OUT/docs"
gzip -9n "$OUT"/docs/man/*.1

cargo deb -p vgpuctl --no-build --target "$TRIPLE" --output "$OUT/" >&2
cargo generate-rpm -p runtime-config --target "$TRIPLE" --output "$OUT/" >&2
ls "$OUT"/*.deb "$OUT"/*.rpm
