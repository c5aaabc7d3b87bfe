#!/bin/sh
# The installer image's entrypoint (packaging/kubernetes/vgpu-daemonset.yaml, docs/install.md). The node's
# root filesystem is mounted at $VGPU_HOST_ROOT (default /host).
#   install.sh install     copy the binaries and the interposer onto the node, write /etc/vgpu/config.toml
#                          if the node has none (lower_runtime = nvidia-container-runtime when the node has
#                          it), add the vgpu runtime to the engine, restart the engine if its config changed
#   install.sh uninstall   take the runtime out of the engine (vgpuctl runtime unconfigure: only what
#                          configure wrote) and remove exactly the files install wrote (its manifest)
#   install.sh gc-loop     vgpuctl gc every $VGPU_GC_INTERVAL seconds (default 600), for ever
#   install.sh monitor [ARGS]  vgpuctl monitor ARGS (docs/monitor.md): the node's metrics and watchdog, with
#                          the node's config, NVML and /proc (the pod runs with the host's PIDs and network)
# vgpuctl runs chrooted into the node, against the node's own glibc and paths: what it configures is what
# the engine will run. Settings (environment):
#   VGPU_ENGINE          containerd (default), docker, crio or podman
#   VGPU_ENGINE_CONFIG   the engine's config file on the node, if not the engine's default
#   VGPU_RESTART         systemd (default: systemctl restart ENGINE in the node's namespaces, through PID 1)
#                        or none (the operator restarts the engine)
set -eu
HOST=${VGPU_HOST_ROOT:-/host}
ENGINE=${VGPU_ENGINE:-containerd}
RESTART=${VGPU_RESTART:-systemd}
BIN=/usr/local/bin
LIB=/usr/lib/vgpu
MANIFEST=/etc/vgpu/installed-by-daemonset
PAYLOAD=/vgpu

say() { echo "vgpu-installer: $*" >&2; }
die() { say "$*"; exit 1; }

[ -d "$HOST/etc" ] || die "$HOST holds no node root filesystem (mount the node's / there)"
case "$ENGINE" in containerd|docker|crio|podman) ;; *) die "VGPU_ENGINE=$ENGINE: not containerd, docker, crio or podman" ;; esac
case "$RESTART" in systemd|none) ;; *) die "VGPU_RESTART=$RESTART: not systemd or none" ;; esac

vgpuctl() { chroot "$HOST" "$BIN/vgpuctl" "$@"; }
engine_args() {
    set -- --runtime="$ENGINE"
    [ -n "${VGPU_ENGINE_CONFIG:-}" ] && set -- "$@" --config "$VGPU_ENGINE_CONFIG"
    echo "$@"
}
# The engine's config fingerprint, to restart only on a change (all of /etc for CRI-O and Podman drop-ins).
fingerprint() {
    case "$ENGINE" in
    containerd) f=${VGPU_ENGINE_CONFIG:-/etc/containerd/config.toml} ;;
    docker) f=${VGPU_ENGINE_CONFIG:-/etc/docker/daemon.json} ;;
    crio) f=/etc/crio ;;
    podman) echo none; return ;;
    esac
    if [ -e "$HOST$f" ]; then find "$HOST$f" -type f -exec cat {} + 2>/dev/null | md5sum; else echo absent; fi
}
restart_engine() {
    [ "$ENGINE" = podman ] && return 0
    if [ "$RESTART" = none ]; then say "restart $ENGINE on the node to apply its new config"; return 0; fi
    say "restarting $ENGINE"
    nsenter -t 1 -m -u -i -n -p -- systemctl restart "$ENGINE" || die "could not restart $ENGINE (VGPU_RESTART=none and restart it yourself)"
}
# put SRC DEST MODE: an atomic copy (a running shim is never seen half-written), recorded in the manifest.
put() {
    mkdir -p "$HOST$(dirname "$2")"
    cp "$1" "$HOST$2.vgpu-new"
    chmod "$3" "$HOST$2.vgpu-new"
    mv -f "$HOST$2.vgpu-new" "$HOST$2"
    grep -qx "$2" "$HOST$MANIFEST" 2>/dev/null || echo "$2" >> "$HOST$MANIFEST"
}

install() {
    mkdir -p "$HOST/etc/vgpu"
    for f in vgpuctl vgpu-hook vgpu-container-runtime; do put "$PAYLOAD/$f" "$BIN/$f" 755; done
    for f in libvgpu.so libvgpu_core.so; do put "$PAYLOAD/$f" "$LIB/$f" 644; done
    if [ ! -e "$HOST/etc/vgpu/config.toml" ]; then
        lower=runc
        for d in /usr/bin /usr/local/bin /usr/sbin; do
            [ -x "$HOST$d/nvidia-container-runtime" ] && { lower=nvidia-container-runtime; break; }
        done
        printf '%s\n' "# Written by the vgpu installer DaemonSet; removed by its uninstall." \
            "hook_path = \"$BIN/vgpu-hook\"" "library = \"$LIB/libvgpu.so\"" "lower_runtime = \"$lower\"" \
            > /tmp/config.toml
        put /tmp/config.toml /etc/vgpu/config.toml 644
        say "wrote /etc/vgpu/config.toml (lower_runtime = $lower)"
    else
        say "/etc/vgpu/config.toml exists: left as it is"
    fi
    before=$(fingerprint)
    # shellcheck disable=SC2046
    vgpuctl runtime configure $(engine_args) --runtime-path "$BIN/vgpu-container-runtime" --hook-path "$BIN/vgpu-hook" >&2
    [ "$before" = "$(fingerprint)" ] || restart_engine
    say "installed"
}

uninstall() {
    if [ -x "$HOST$BIN/vgpuctl" ]; then
        before=$(fingerprint)
        # shellcheck disable=SC2046
        vgpuctl runtime unconfigure $(engine_args) >&2
        [ "$before" = "$(fingerprint)" ] || restart_engine
    fi
    if [ -f "$HOST$MANIFEST" ]; then
        while read -r f; do rm -f "$HOST$f"; done < "$HOST$MANIFEST"
        rm -f "$HOST$MANIFEST"
    fi
    rmdir "$HOST$LIB" "$HOST/etc/vgpu" 2>/dev/null || true
    say "uninstalled"
}

case "${1:-}" in
install) install ;;
uninstall) uninstall ;;
gc-loop) while :; do vgpuctl gc || true; sleep "${VGPU_GC_INTERVAL:-600}"; done ;;
monitor) shift; exec chroot "$HOST" "$BIN/vgpuctl" monitor "$@" ;;
*) die "usage: install.sh install|uninstall|gc-loop|monitor [ARGS]" ;;
esac
