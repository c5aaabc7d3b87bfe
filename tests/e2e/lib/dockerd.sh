# A private dockerd for a suite: its own data root, exec root and socket, no bridge, no iptables, so it never
# touches a Docker the machine may already run.
#   dockerd_start DIR [DAEMON_JSON]   starts it (log in DIR/dockerd.log), exports DOCKER_HOST, waits until
#                                     it answers (60 s), registers its stop with on_exit
#   dockerd_stop                      stops it and waits for it to go (containers are killed first)
# dockerd passes its own environment to the runtimes it starts: export VGPU_CONFIG (and FAKE_CUDA_DEVICES)
# before dockerd_start for the vgpu runtime to see them.

dockerd_start() {
    local dir=$1 conf=${2:-}
    mkdir -p "$dir"
    [ -n "$conf" ] || { conf=$dir/daemon.json; echo '{}' > "$conf"; }
    DOCKERD_DIR=$dir
    export DOCKER_HOST=unix://$dir/docker.sock
    dockerd --config-file "$conf" --data-root "$dir/data" --exec-root "$dir/exec" -H "$DOCKER_HOST" \
        --pidfile "$dir/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
        >"$dir/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    on_exit dockerd_stop
    if ! wait_for 60 docker version; then
        echo "dockerd did not start; its log:" >&2
        tail -20 "$dir/dockerd.log" >&2
        return 1
    fi
}

dockerd_stop() {
    [ -n "${DOCKERD_PID:-}" ] || return 0
    local ids
    ids=$(docker ps -aq 2>/dev/null) && [ -n "$ids" ] && docker rm -f $ids >/dev/null 2>&1
    kill "$DOCKERD_PID" 2>/dev/null
    local i
    for i in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$DOCKERD_PID" 2>/dev/null
    wait "$DOCKERD_PID" 2>/dev/null
    # dockerd mounts its data root's overlays; make sure none stays behind.
    grep -o " $DOCKERD_DIR[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
    DOCKERD_PID=
}
