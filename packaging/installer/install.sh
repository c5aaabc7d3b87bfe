#!/bin/sh
# The installer image's entrypoint (the Helm chart packaging/helm/vgpu, docs/install.md). The node's
# root filesystem is mounted at $VGPU_HOST_ROOT (default /host).
#   install.sh install     copy the binaries and the interposer onto the node, write /etc/vgpu/config.toml
#                          from the chart's policy unless the node has one the installer did not write
#                          (lower_runtime = NVIDIA's runtime by its path when the node has it), add the vgpu
#                          runtime to the engine, restart the engine if its config changed
#   install.sh uninstall   take the runtime out of the engine (vgpuctl runtime unconfigure: only what
#                          configure wrote) and remove exactly the files install wrote (its manifest)
#   install.sh gc-loop     vgpuctl gc every $VGPU_GC_INTERVAL seconds (default 600), for ever
#   install.sh monitor [ARGS]  vgpuctl monitor ARGS (docs/monitor.md): the node's metrics and watchdog, with
#                          the node's NVML from the driver root (the pod runs with the host's PIDs)
#   install.sh idle        sleep for ever (the uninstall DaemonSet's pod, once its init container is done)
# install and uninstall run vgpuctl chrooted into the node, against the node's own glibc and paths: what it
# configures is what the engine will run. gc-loop and monitor run the image's vgpuctl (with the image's
# glibc) against the few node paths the chart mounts, not the node's root: the state root at its own path
# ($VGPU_STATE_ROOT, default /run/vgpu), /etc/vgpu read-only (the node's config), and for the monitor the
# driver root read-only ($VGPU_DRIVER_ROOT, default /driver-root), where libnvidia-ml.so.1 is looked for.
# Settings (environment):
#   VGPU_ENGINE          containerd (default), docker, crio or podman
#   VGPU_ENGINE_CONFIG   the engine's config file on the node, if not the engine's default
#   VGPU_RESTART         systemd (default: systemctl restart ENGINE in the node's namespaces, through PID 1)
#                        or none (the operator restarts the engine)
#   VGPU_SET_AS_DEFAULT  true: also make vgpu the engine's default runtime (vgpuctl runtime configure
#                        --set-as-default; unconfigure restores the previous default)
#   VGPU_NVIDIA_RUNTIME  NVIDIA's runtime on the node, when it is not found in /usr/bin, /usr/local/bin,
#                        /usr/sbin, the GPU Operator's /usr/local/nvidia/toolkit or the node's PATH
#   VGPU_CHART_CONFIG    the chart's node policy (its ConfigMap <release>-node-config), written with the
#                        node's lower_runtime as /etc/vgpu/config.toml
#   VGPU_DEFAULT_MEMORY_LIMIT, VGPU_REQUIRE_MEMORY_LIMIT
#                        without VGPU_CHART_CONFIG, the node policy (default_memory_limit, e.g. 4Gi;
#                        require_memory_limit, true or false)
#   VGPU_STATE_ROOT      gc-loop, monitor: the node's state root, mounted at that same path (default /run/vgpu)
#   VGPU_DRIVER_ROOT     monitor: where the node's NVIDIA driver root is mounted (default /driver-root)
set -eu
HOST=${VGPU_HOST_ROOT:-/host}
STATE=${VGPU_STATE_ROOT:-/run/vgpu}
DRIVER_ROOT=${VGPU_DRIVER_ROOT:-/driver-root}
ENGINE=${VGPU_ENGINE:-containerd}
RESTART=${VGPU_RESTART:-systemd}
BIN=/usr/local/bin
LIB=/usr/lib/vgpu
MANIFEST=/etc/vgpu/installed-by-daemonset
PAYLOAD=/vgpu

say() { echo "vgpu-installer: $*" >&2; }
die() { say "$*"; exit 1; }

case "${1:-}" in install|uninstall) [ -d "$HOST/etc" ] || die "$HOST holds no node root filesystem (mount the node's / there)" ;; esac
case "$ENGINE" in containerd|docker|crio|podman) ;; *) die "VGPU_ENGINE=$ENGINE: not containerd, docker, crio or podman" ;; esac
case "$RESTART" in systemd|none) ;; *) die "VGPU_RESTART=$RESTART: not systemd or none" ;; esac
case "${VGPU_SET_AS_DEFAULT:-false}" in true|false|"") ;; *) die "VGPU_SET_AS_DEFAULT=$VGPU_SET_AS_DEFAULT: not true or false" ;; esac
case "${VGPU_REQUIRE_MEMORY_LIMIT:-false}" in true|false|"") ;; *) die "VGPU_REQUIRE_MEMORY_LIMIT=$VGPU_REQUIRE_MEMORY_LIMIT: not true or false" ;; esac
case "${VGPU_DEFAULT_MEMORY_LIMIT:-}" in *[!0-9A-Za-z.]*) die "VGPU_DEFAULT_MEMORY_LIMIT=$VGPU_DEFAULT_MEMORY_LIMIT: not a quantity (e.g. 4Gi)" ;; esac

vgpuctl() { chroot "$HOST" "$BIN/vgpuctl" "$@"; }
engine_args() {
    set -- --runtime="$ENGINE"
    [ -n "${VGPU_ENGINE_CONFIG:-}" ] && set -- "$@" --config "$VGPU_ENGINE_CONFIG"
    echo "$@"
}
# NVIDIA's runtime on the node (a path on the node), or nothing: the operator's setting, then where the
# packages and the GPU Operator put it, then the node's own PATH (its /bin/sh, chrooted).
nvidia_runtime() {
    if [ -n "${VGPU_NVIDIA_RUNTIME:-}" ]; then
        [ -x "$HOST$VGPU_NVIDIA_RUNTIME" ] || die "VGPU_NVIDIA_RUNTIME=$VGPU_NVIDIA_RUNTIME: not an executable on the node"
        echo "$VGPU_NVIDIA_RUNTIME"; return
    fi
    for d in /usr/bin /usr/local/bin /usr/sbin /usr/local/nvidia/toolkit; do
        [ -x "$HOST$d/nvidia-container-runtime" ] && { echo "$d/nvidia-container-runtime"; return; }
    done
    if [ -x "$HOST/bin/sh" ]; then
        chroot "$HOST" /bin/sh -lc 'command -v nvidia-container-runtime' 2>/dev/null | grep '^/' || true
    fi
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

MARKER="# Written by the vgpu installer DaemonSet"
# chart_policy: the node policy, the chart's ConfigMap (mounted at $VGPU_CHART_CONFIG), else from the
# environment (an installer run without the chart).
chart_policy() {
    if [ -n "${VGPU_CHART_CONFIG:-}" ] && [ -f "$VGPU_CHART_CONFIG" ]; then
        head -1 "$VGPU_CHART_CONFIG" | grep -q "^$MARKER" || die "$VGPU_CHART_CONFIG: not the chart's node config (its first line must start with '$MARKER')"
        grep -v '^lower_runtime' "$VGPU_CHART_CONFIG"
        return
    fi
    printf '%s\n' "$MARKER; rewritten at each install, removed by its uninstall." \
        "hook_path = \"$BIN/vgpu-hook\"" "library = \"$LIB/libvgpu.so\""
    [ -n "${VGPU_DEFAULT_MEMORY_LIMIT:-}" ] && echo "default_memory_limit = \"$VGPU_DEFAULT_MEMORY_LIMIT\""
    [ "${VGPU_REQUIRE_MEMORY_LIMIT:-false}" = true ] && echo "require_memory_limit = true"
    true
}

install() {
    mkdir -p "$HOST/etc/vgpu"
    for f in vgpuctl vgpu-hook vgpu-container-runtime; do put "$PAYLOAD/$f" "$BIN/$f" 755; done
    # libvgpu-single.so: the front carrying its engine, for HAMi's device plugin (docs/engines/hami.md).
    for f in libvgpu.so libvgpu_core.so libvgpu-single.so; do put "$PAYLOAD/$f" "$LIB/$f" 644; done
    # The node's config is the chart's while the installer wrote it (its first line says so): rewritten
    # from the chart's policy at every install, so `helm upgrade` reconciles it; an operator's is left.
    if [ ! -e "$HOST/etc/vgpu/config.toml" ] || head -1 "$HOST/etc/vgpu/config.toml" | grep -q "^$MARKER"; then
        lower=$(nvidia_runtime)
        lower=${lower:-runc}
        # lower_runtime right after the first line (the marker), before any table of the policy
        # ([monitor]): a key after a table header would be that table's.
        chart_policy > /tmp/policy.toml
        { head -1 /tmp/policy.toml; echo "lower_runtime = \"$lower\""; tail -n +2 /tmp/policy.toml; } > /tmp/config.toml
        if cmp -s /tmp/config.toml "$HOST/etc/vgpu/config.toml"; then
            say "/etc/vgpu/config.toml is up to date"
        else
            put /tmp/config.toml /etc/vgpu/config.toml 644
            say "wrote /etc/vgpu/config.toml (lower_runtime = $lower)"
        fi
    else
        say "/etc/vgpu/config.toml is not the installer's: left as it is"
    fi
    before=$(fingerprint)
    # shellcheck disable=SC2046
    set -- $(engine_args)
    [ "${VGPU_SET_AS_DEFAULT:-false}" = true ] && set -- "$@" --set-as-default
    # lower_runtime is the installer's to decide (above): configure leaves it.
    vgpuctl runtime configure "$@" --runtime-path "$BIN/vgpu-container-runtime" --hook-path "$BIN/vgpu-hook" \
        --no-nvidia-lower-runtime >&2
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

# The node's libnvidia-ml.so.1 under the mounted driver root (the DRA plugin's folders), or nothing (the
# monitor then serves the ledgers' figures only, vgpu_nvml_up 0, and says so).
nvml_library() {
    for d in usr/lib64 usr/lib/x86_64-linux-gnu usr/lib/aarch64-linux-gnu usr/lib lib64 lib/x86_64-linux-gnu lib; do
        [ -e "$DRIVER_ROOT/$d/libnvidia-ml.so.1" ] && { echo "$DRIVER_ROOT/$d/libnvidia-ml.so.1"; return; }
    done
    say "no libnvidia-ml.so.1 under the driver root $DRIVER_ROOT: the monitor runs without NVML"
}
monitor() {
    lib=$(nvml_library)
    if [ -n "$lib" ]; then set -- --nvml-library "$lib" "$@"; fi
    exec /vgpu/vgpuctl monitor --state-root "$STATE" "$@"
}

case "${1:-}" in
install) install ;;
uninstall) uninstall ;;
gc-loop) while :; do /vgpu/vgpuctl gc --state-root "$STATE" || true; sleep "${VGPU_GC_INTERVAL:-600}"; done ;;
monitor) shift; monitor "$@" ;;
idle) while :; do sleep 3600; done ;;
*) die "usage: install.sh install|uninstall|gc-loop|monitor [ARGS]|idle" ;;
esac
