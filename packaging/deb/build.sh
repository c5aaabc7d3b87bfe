#!/usr/bin/env bash
# Builds the vgpu .deb from `make build`'s products: packaging/deb/build.sh [OUT_DIR] (default target/deb).
# Installs: /usr/bin/{vgpuctl,vgpu-hook,vgpu-container-runtime}, /usr/lib/vgpu/{libvgpu.so,libvgpu_core.so}
# (the glibc-2.17 build), the gc timer, the monitor's unit (not enabled: `systemctl enable --now vgpu-monitor`)
# and Grafana dashboard, a commented /etc/vgpu/config.toml, the hooks.d files for reference
# and the engine docs. It configures no engine: the operator runs `vgpuctl runtime configure --runtime=...` (docs/engines/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/target/deb}
# The interposer is two files that always travel together: the preload front and its engine.
LIB=$ROOT/target/vgpu/libvgpu.so
CORE=$ROOT/target/vgpu/libvgpu_core.so
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
ARCH=$(dpkg --print-architecture)
for f in "$ROOT"/target/release/{vgpuctl,vgpu-hook,vgpu-container-runtime} "$LIB" "$CORE"; do
    [ -f "$f" ] || { echo "build.sh: missing $f (run make build)" >&2; exit 1; }
done

PKG=$(mktemp -d); trap 'rm -rf "$PKG"' EXIT
install -D -m 0755 -t "$PKG/usr/bin" "$ROOT"/target/release/{vgpuctl,vgpu-hook,vgpu-container-runtime}
install -D -m 0644 "$LIB" "$PKG/usr/lib/vgpu/libvgpu.so"
install -D -m 0644 "$CORE" "$PKG/usr/lib/vgpu/libvgpu_core.so"
install -D -m 0644 -t "$PKG/lib/systemd/system" "$ROOT"/packaging/systemd/vgpu-gc.{service,timer} "$ROOT"/packaging/systemd/vgpu-monitor.service
install -D -m 0644 "$ROOT/docs/monitor.md" "$PKG/usr/share/doc/vgpu/monitor.md"
install -D -m 0644 "$ROOT/packaging/grafana/vgpu-dashboard.json" "$PKG/usr/share/vgpu/grafana/vgpu-dashboard.json"
install -D -m 0644 -t "$PKG/usr/share/vgpu/hooks.d" "$ROOT"/packaging/hooks.d/*.json
install -D -m 0644 -t "$PKG/usr/share/doc/vgpu/engines" "$ROOT"/docs/engines/*.md
install -D -m 0644 "$ROOT/packaging/kubernetes/vgpu-daemonset.yaml" "$PKG/usr/share/doc/vgpu/kubernetes/vgpu-daemonset.yaml"
install -d "$PKG/etc/vgpu"
cat > "$PKG/etc/vgpu/config.toml" <<'EOT'
# vgpu host configuration, read by vgpu-container-runtime, vgpu-hook and vgpuctl (VGPU_CONFIG names
# another file). Every key is optional; the defaults are shown.
# state_root = "/run/vgpu"
# library = "/usr/lib/vgpu/libvgpu.so"
# lower_runtime = "runc"
# hook_path = "/usr/bin/vgpu-hook"
# nvml_library = "libnvidia-ml.so.1"
# log_level = "error"
#
# vgpuctl monitor (vgpu-monitor.service; docs: /usr/share/doc/vgpu/monitor.md)
# [monitor]
# listen = "0.0.0.0:9394"
# interval_seconds = 10      # between watchdog passes
# tolerance = "64Mi"         # beyond a quota before the watchdog reports
# kill = false               # SIGKILL the processes that put a container over its quota
# nvml_library = "libnvidia-ml.so.1"   # default: nvml_library above
EOT

mkdir -p "$PKG/DEBIAN"
cat > "$PKG/DEBIAN/control" <<EOT
Package: vgpu
Version: $VERSION
Architecture: $ARCH
Maintainer: vgpu developers <vgpu@localhost>
Section: admin
Priority: optional
Depends: libc6
Recommends: runc | crun
Installed-Size: $(du -sk "$PKG" | cut -f1)
Description: GPU memory quotas for containers sharing an NVIDIA GPU
 An interposer preloaded into containers enforces a per-container GPU memory
 quota; an OCI runtime shim and hook set it up for Docker, containerd, CRI-O
 and Podman. Configure an engine with: vgpuctl runtime configure --runtime=NAME
EOT
echo /etc/vgpu/config.toml > "$PKG/DEBIAN/conffiles"
cat > "$PKG/DEBIAN/postinst" <<'EOT'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now vgpu-gc.timer >/dev/null 2>&1 || true
fi
EOT
cat > "$PKG/DEBIAN/prerm" <<'EOT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl disable --now vgpu-gc.timer >/dev/null 2>&1 || true
fi
EOT
chmod 0755 "$PKG/DEBIAN/postinst" "$PKG/DEBIAN/prerm"
mkdir -p "$OUT"
dpkg-deb --root-owner-group --build "$PKG" "$OUT/vgpu_${VERSION}_${ARCH}.deb" >/dev/null
echo "$OUT/vgpu_${VERSION}_${ARCH}.deb"
