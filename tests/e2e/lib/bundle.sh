# OCI bundles for runc/crun, edited with jq.
#   bundle_new DIR ROOTFS CMD...    config.json from `runc spec` ($RUNC if set; no terminal, rootfs at ROOTFS, command CMD)
#   bundle_env DIR NAME=VALUE...    appends to process.env
#   bundle_annotate DIR KEY VALUE   sets an annotation
#   bundle_bind DIR SRC DST [ro]    appends a bind mount
#   bundle_jq DIR FILTER [ARGS...]  any other edit (jq filter applied in place)
#   fake_gpu_mounts DIR STATEDIR    the fake driver, the test clients and the shared fake-GPU state
#                                   (FAKE_CUDA_STATE_DIR) mounted into the container, LD_LIBRARY_PATH set
# The rootfs is shared read-only between bundles (root.readonly), so one rootfs serves every container.

bundle_jq() {
    local dir=$1 filter=$2; shift 2
    jq "$@" "$filter" "$dir/config.json" > "$dir/config.json.new" && mv "$dir/config.json.new" "$dir/config.json"
}

bundle_new() {
    local dir=$1 rootfs=$2; shift 2
    mkdir -p "$dir"
    rm -f "$dir/config.json"
    (cd "$dir" && "${RUNC:-runc}" spec)
    local args
    args=$(jq -n '$ARGS.positional' --args -- "$@")
    bundle_jq "$dir" '.process.terminal = false | .root.path = $r | .root.readonly = true
        | .process.args = $a | .hostname = "vgpu-test"' --arg r "$rootfs" --argjson a "$args"
}

bundle_env() {
    local dir=$1 kv; shift
    for kv in "$@"; do bundle_jq "$dir" '.process.env += [$kv]' --arg kv "$kv"; done
}

bundle_annotate() {
    bundle_jq "$1" '.annotations[$k] = $v' --arg k "$2" --arg v "$3"
}

bundle_bind() {
    local opts='["rbind","rw"]'
    [ "${4:-}" = ro ] && opts='["rbind","ro"]'
    bundle_jq "$1" '.mounts += [{"destination": $d, "type": "bind", "source": $s, "options": $o}]' \
        --arg s "$2" --arg d "$3" --argjson o "$opts"
}

fake_gpu_mounts() {
    local dir=$1 state=$2
    bundle_bind "$dir" "$FAKE_DIR" /opt/fake ro
    bundle_bind "$dir" "$CLIENTS_DIR" /opt/clients ro
    bundle_bind "$dir" "$state" /fakestate
    bundle_jq "$dir" '.mounts += [{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","nodev","mode=1777"]}]'
    bundle_env "$dir" LD_LIBRARY_PATH=/opt/fake FAKE_CUDA_STATE_DIR=/fakestate PATH=/opt/clients:/bin
}
