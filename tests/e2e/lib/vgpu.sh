# vgpu specifics for the suites.
#   vgpu_config [KEY=VALUE...]   writes $WORK/config.toml (state root $WORK/state, the built library, hook and
#                                fake NVML, lower runtime runc) with overrides, exports VGPU_CONFIG
#   state_left                   what is left under the state root's containers/ (empty when clean; vgpu's
#                                marker .vgpu-state, which stays, is not listed)

vgpu_config() {
    STATE=$WORK/state
    local kv
    declare -A c=(
        [state_root]="\"$STATE\"" [library]="\"$LIBVGPU\"" [hook_path]="\"$HOOK\""
        [nvml_library]="\"$FAKE_DIR/libnvidia-ml.so.1\"" [lower_runtime]='"runc"'
    )
    for kv in "$@"; do c[${kv%%=*}]=${kv#*=}; done
    : > "$WORK/config.toml"
    for kv in "${!c[@]}"; do echo "$kv = ${c[$kv]}" >> "$WORK/config.toml"; done
    export VGPU_CONFIG=$WORK/config.toml
}

state_left() {
    # Nothing left is no output and status 0 (callers run under set -e and pipefail).
    ls -A "$STATE/containers" 2>/dev/null | grep -vx '.vgpu-state' || true
}
