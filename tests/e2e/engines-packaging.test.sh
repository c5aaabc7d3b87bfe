#!/usr/bin/env bash
# Packaging: the .deb builds and holds what it should, its systemd units verify, the DaemonSet example is
# valid YAML, and packaging/hooks.d is exactly what vgpuctl writes.
source "$(dirname "$0")/engines-lib.sh"
need "$VGPUCTL" "$SHIM" "$HOOK" "$LIBVGPU"
T=$(mktemp -d /tmp/vgpu-e2e-packaging.XXXXXX)
trap 'rm -rf "$T"' EXIT

deb=$(LIBVGPU=$LIBVGPU bash "$ROOT/packaging/deb/build.sh" "$T" 2> "$T/build.err")
check "the .deb builds" test -f "$deb"
dpkg-deb -c "$deb" > "$T/contents" 2>&1
for f in ./usr/bin/vgpuctl ./usr/bin/vgpu-hook ./usr/bin/vgpu-container-runtime ./usr/lib/vgpu/libvgpu.so \
         ./lib/systemd/system/vgpu-gc.timer ./etc/vgpu/config.toml ./usr/share/doc/vgpu/engines/podman.md; do
    check "package holds $f" grep -q " $f\$" "$T/contents"
done
check "control names the package" bash -c "dpkg-deb -f '$deb' Package | grep -qx vgpu"
check "config.toml is a conffile" bash -c "dpkg-deb -I '$deb' conffiles | grep -qx /etc/vgpu/config.toml"
dpkg-deb -x "$deb" "$T/x"
check "the packaged vgpuctl runs" "$T/x/usr/bin/vgpuctl" --version > /dev/null
check "the packaged config.toml (all defaults) is accepted" env VGPU_CONFIG="$T/x/etc/vgpu/config.toml" \
    "$T/x/usr/bin/vgpuctl" status --state-root "$T/none" > /dev/null
# systemd-analyze checks the units; only the binary path (not installed on this machine) may be missing.
systemd-analyze verify "$ROOT"/packaging/systemd/vgpu-gc.{service,timer} 2>&1 | grep -v "is not executable" > "$T/verify"
check "systemd units verify" test ! -s "$T/verify"
check "DaemonSet example is valid YAML with RuntimeClass vgpu" python3 -c '
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
assert [d["kind"] for d in docs] == ["RuntimeClass", "DaemonSet", "Pod"], docs
assert docs[0]["handler"] == "vgpu" and docs[2]["spec"]["runtimeClassName"] == "vgpu"' "$ROOT/packaging/kubernetes/vgpu-daemonset.yaml"
"$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$T/hooks.d" > /dev/null
check "packaging/hooks.d is what vgpuctl writes" diff -r "$T/hooks.d" "$ROOT/packaging/hooks.d"
((failed)) && { cat "$T/build.err" "$T/verify"; }
finish
