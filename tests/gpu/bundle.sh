#!/usr/bin/env bash
# `make gpu-bundle`: checks that what the GPU machine needs is built and fit to travel, and prints how to
# run the suite there. The GPU machine has no Rust: the interposer goes with the tree (target/vgpu is
# carried), the C programs are compiled there by tests/gpu/run.sh, the scripts are tracked files.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=${VGPU_LIB:-target/vgpu/libvgpu.so}
[ -f "$lib" ] || { echo "gpu-bundle: $lib missing (make libvgpu)" >&2; exit 1; }
# Containers with old glibc must be able to load it : no symbol version above GLIBC_2.17.
newest=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -t. -k2,2n -k3,3n -u | tail -1)
case "$newest" in
    GLIBC_2.1[0-7]|GLIBC_2.[0-9]|GLIBC_2.[0-9].*|GLIBC_2.1[0-7].*|"") ;;
    *) echo "gpu-bundle: $lib needs $newest (more than GLIBC_2.17): build it with make libvgpu" >&2; exit 1 ;;
esac
# The container suite (tests/gpu/container.sh) also needs, in .deps/gpu (ignored by git, carried): Debian's
# runc, libseccomp2 and jq .debs (unpacked there with dpkg -x), and vgpu-hook, vgpu-container-runtime and
# vgpuctl built for glibc 2.28 (the GPU machine's glibc may be older than this one's).
mkdir -p .deps/gpu/bin
(cd .deps/gpu && for p in runc libseccomp2 jq libjq1 libonig5; do
    ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download -q "$p" >/dev/null 2>&1 || { echo "gpu-bundle: apt-get download $p failed" >&2; exit 1; }
done)
cargo zigbuild --release -q -p vgpu-oci -p vgpuctl --target x86_64-unknown-linux-gnu.2.28
cp target/x86_64-unknown-linux-gnu/release/{vgpu-hook,vgpu-container-runtime,vgpuctl} .deps/gpu/bin/
size=$(du -k "$lib" | cut -f1)
echo "gpu-bundle: $lib ok (${size} KiB, newest glibc symbol ${newest:-none}, sha256 $(sha256sum "$lib" | cut -c1-16))"
echo "gpu-bundle: on the GPU machine, run from the repository root (device tool):"
echo "    carry: [\"target/vgpu\", \".deps/gpu\"]"
echo "    command: bash tests/gpu/run.sh; bash tests/gpu/container.sh"
echo "  results: \$OUT/results.jsonl, \$OUT/summary.md, \$OUT/logs/, \$OUT/bench/results.md"
