# The OCI runtime cases shared by oci-runc.test.sh and oci-crun.test.sh: containers run through the shim
# (vgpu-container-runtime, lower runtime $RUNTIME) and through the hooks.d-style hook alone, with the fake
# GPU driver inside. Source after common.sh, rootfs.sh, bundle.sh, vgpu.sh with RUNTIME set; call oci_cases.

GIB=1073741824
MIB=1048576

oci_setup() {
    t_require "$HOOK" "$SHIM" "$LIBVGPU" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR/rt_client"
    command -v "$RUNTIME" >/dev/null || { echo "$SUITE: $RUNTIME not installed"; echo "0 passed, 1 failed"; exit 1; }
    ROOTFS=$WORK/rootfs
    rootfs_busybox "$ROOTFS"
    rootfs_add_libs "$ROOTFS" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$CLIENTS_DIR"/* "$LIBVGPU" "$T/vgpu/libvgpu_core.so"
    FAKESTATE=$WORK/fakestate
    mkdir -p "$FAKESTATE" "$WORK/rt"
    vgpu_config lower_runtime="\"$RUNTIME\""
    N=0
    on_exit "oci_cleanup_containers"
}

oci_cleanup_containers() {
    local id
    for id in $("$RUNTIME" --root "$WORK/rt" list -q 2>/dev/null); do
        "$RUNTIME" --root "$WORK/rt" ${RT_FLAGS:-} delete -f "$id"
    done
}

# new_bundle CMD...: a fresh bundle with the fake GPU; prints nothing, sets $B (bundle) and $ID.
new_bundle() {
    N=$((N + 1))
    ID=vgpu-e2e-$RUNTIME-$N
    B=$WORK/b$N
    bundle_new "$B" "$ROOTFS" "$@"
    fake_gpu_mounts "$B" "$FAKESTATE"
}

# shim ARGS...: the shim with the suite's runtime root, as an engine would call it.
# RT_FLAGS: extra global flags for the runtime (crun 1.8 needs --cgroup-manager=disabled on hybrid cgroup hosts).
shim() { "$SHIM" --root "$WORK/rt" ${RT_FLAGS:-} "$@"; }
# plain ARGS...: the lower runtime itself (no shim).
plain() { "$RUNTIME" --root "$WORK/rt" ${RT_FLAGS:-} "$@"; }

# create_quiet: creates $ID through the shim; the container's stdio goes to a file (a created container
# keeps its stdio open until it exits, so a command substitution would wait for it).
create_quiet() { shim create --bundle "$B" "$ID" </dev/null >"$WORK/create.log" 2>&1 || { cat "$WORK/create.log"; return 1; }; }

# The hooks a hooks.d file would install (Podman/CRI-O): no shim, explicit env.
add_hooksd_hooks() {
    bundle_jq "$B" '.hooks.createRuntime += [{"path": $h, "args": ["vgpu-hook","createRuntime"], "env": $e}]
        | .hooks.poststop += [{"path": $h, "args": ["vgpu-hook","poststop"], "env": $e}]' \
        --arg h "$HOOK" --argjson e "$(jq -n --arg c "VGPU_CONFIG=$VGPU_CONFIG" '["PATH=/usr/sbin:/usr/bin:/sbin:/bin", $c]')"
}

case_quota_is_total() {
    echo "-- the quota is the GPU's size inside, and allocations past it are refused"
    new_bundle rt_client device 0 info fill 64Mi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_eq "total seen = 1 GiB (env CUDA_DEVICE_MEMORY_LIMIT=1G)" "$(field total "$out")" "$GIB"
    check_eq "cuDeviceTotalMem = 1 GiB" "$(field devtotal "$out")" "$GIB"
    # The context already holds total - free (the fake driver charges it like a real one does).
    local bytes free; bytes=$(field bytes "$out"); free=$(field free "$out")
    if [ -n "$bytes" ] && [ -n "$free" ] && [ "$bytes" -le "$free" ] && [ "$bytes" -gt $((free - 64 * MIB)) ]; then
        pass "fill got $((bytes / MIB)) MiB (all the $((free / MIB)) MiB free of the quota), then out of memory"
    else fail "fill stops at the quota" "$out"; fi
    check_match "fill ended with CUDA_ERROR_OUT_OF_MEMORY" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
    check_eq "state removed after the container exits" "$(state_left)" ""

    new_bundle rt_client device 0 info fill 64Mi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    bundle_jq "$B" '.process.user = {"uid": 65534, "gid": 65534}'
    out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_eq "a non-root user in the container (uid 65534) gets the quota too" "$(field total "$out")" "$GIB"
    check_match "  ... and is refused past it" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"

    new_bundle rt_client device 0 info
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=all CUDA_DEVICE_MEMORY_LIMIT=1G
    bundle_annotate "$B" vgpu.io/memory-limit 512Mi
    out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_eq "annotation vgpu.io/memory-limit=512Mi wins over env" "$(field total "$out")" $((512 * MIB))
}

case_no_quota() {
    echo "-- no quota: config.json untouched, the whole GPU"
    new_bundle rt_client device 0 info
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    local before after out
    before=$(sha256sum < "$B/config.json")
    check "create through the shim" create_quiet
    after=$(sha256sum < "$B/config.json")
    check_eq "config.json byte for byte unchanged" "$after" "$before"
    plain delete -f "$ID" >/dev/null 2>&1
    # HAMi-core's grammar: 0 in the env is no limit, so no quota (an annotation of 0 is refused: case_bad_input).
    new_bundle rt_client device 0 info
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=0
    before=$(sha256sum < "$B/config.json")
    check "env CUDA_DEVICE_MEMORY_LIMIT=0: create through the shim" create_quiet
    check_eq "  ... config.json byte for byte unchanged" "$(sha256sum < "$B/config.json")" "$before"
    plain delete -f "$ID" >/dev/null 2>&1
    new_bundle sh -c 'rt_client device 0 info; cat /etc/ld.so.preload; grep -q . /run/vgpu/limits.json 2>/dev/null || echo no-limits-file'
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_eq "sees the whole 16 GiB GPU" "$(field total "$out")" $((16 * GIB))
    check_not "nothing preloaded" grep -q libvgpu <<<"$out"
    check_match "no limits file" no-limits-file "$out"
    check_eq "no state" "$(state_left)" ""
}

case_shared_in_container() {
    echo "-- two processes in one container share its quota"
    # Each process's context costs 256 MiB on the fake GPU, as on a real one: 256 + 1000 + 256 of 2 GiB used.
    new_bundle sh -c 'rt_client device 0 !alloc 1000Mi sleep 3 & sleep 1; rt_client device 0 alloc 600Mi alloc 400Mi; wait'
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=2G
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    local allocs; allocs=$(printf '%s\n' "$out" | grep 'op=alloc')
    check_match "first process got 1000 MiB" 'size=1048576000 .*rc=0' "$allocs"
    check_match "second process refused 600 MiB (alone it would fit)" 'size=629145600 .*err=CUDA_ERROR_OUT_OF_MEMORY' "$allocs"
    check_match "second process got 400 MiB" 'size=419430400 .*rc=0' "$allocs"
}

case_two_containers() {
    echo "-- two containers on one GPU: independent quotas"
    new_bundle rt_client device 0 !alloc 700Mi sleep 4
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local idA=$ID
    shim run --bundle "$B" "$ID" >"$WORK/a.out" 2>&1 &
    local pa=$!
    sleep 1.5
    new_bundle rt_client device 0 info alloc 700Mi alloc 100Mi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    wait $pa
    # A context costs 256 MiB: each container uses 956 MiB of its own 1 GiB, 1912 MiB together.
    check_match "container A held 700 MiB of its 1 GiB" 'op=alloc .*rc=0' "$(cat "$WORK/a.out")"
    check_eq "container B sees 1 GiB" "$(field total "$out")" $GIB
    check_match "container B got 700 MiB while A holds 700 MiB" 'op=alloc .*rc=0' "$(printf '%s\n' "$out" | grep 'op=alloc' | head -1)"
    check_match "container B refused 100 MiB more (its own quota)" 'op=alloc .*err=CUDA_ERROR_OUT_OF_MEMORY' "$(printf '%s\n' "$out" | grep 'op=alloc' | tail -1)"
    check_eq "no state left by either" "$(state_left)" ""
}

case_kill_and_gc() {
    echo "-- SIGKILLed and removed: no state; poststop never came: garbage-collected"
    new_bundle sleep 100
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    shim run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
    local pid; pid=$(plain state "$ID" | jq -r .pid)
    check_eq "limits.json records the container's init pid" "$(jq -r .init_pid "$STATE/containers/$ID/limits.json")" "$pid"
    plain kill "$ID" KILL
    wait_for 10 sh -c "$RUNTIME --root '$WORK/rt' ${RT_FLAGS:-} state '$ID' | jq -e '.status == \"stopped\"'"
    plain delete "$ID"
    check_eq "state gone after kill -9 and delete" "$(state_left)" ""

    new_bundle sleep 100
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    shim run -d --bundle "$B" "$ID" </dev/null >/dev/null 2>&1
    pid=$(plain state "$ID" | jq -r .pid)
    kill -9 "$pid"
    # The engine "crashes": its record of the container is lost, poststop never runs.
    wait_for 10 sh -c "! kill -0 $pid"
    rm -rf "$WORK/rt/$ID"
    check_eq "state still there without poststop" "$(state_left)" "$ID"
    echo '{"id":"another-container","bundle":"/nonexistent"}' | "$HOOK" poststop
    check_eq "the next hook run collects it" "$(state_left)" ""
}

# bad_case WHAT EXPECT: creates $B/$ID through the shim expecting failure with one line matching EXPECT.
bad_case() {
    local what=$1 expect=$2 out rc=0
    rm -f "$WORK/log.json"
    out=$(shim --log "$WORK/log.json" --log-format json create --bundle "$B" "$ID" 2>&1) || rc=$?
    local lines; lines=$(printf '%s\n' "$out" | grep -c .)
    if [ "$rc" != 0 ] && [ "$lines" = 1 ] && printf '%s' "$out" | grep -Eq -- "$expect"; then
        pass "$what: $out"
    else
        fail "$what (rc=$rc, wanted one line /$expect/)" "$out"
    fi
    check_match "  ... and the engine's log has it as a JSON error" '"level":"error".*"msg":"vgpu: ' "$(cat "$WORK/log.json" 2>/dev/null)"
    check_eq "  ... nothing under the state root" "$(state_left)" ""
    check_eq "  ... no container" "$(plain list -q 2>/dev/null | grep -c "^$ID\$")" 0
}

case_bad_input() {
    echo "-- bad input: one clear line, nothing provisioned"
    local v
    for v in "4Qi:unknown unit" "0:greater than zero" "-1G:negative" "64Gi:larger than" "4GB:decimal unit"; do
        new_bundle true
        bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
        bundle_annotate "$B" vgpu.io/memory-limit "${v%%:*}"
        bad_case "quota ${v%%:*}" "${v#*:}"
    done
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT_1=1G
    bad_case "quota for GPU 1 of a one-GPU container" "has no GPU 1"
    new_bundle true
    bundle_env "$B" CUDA_DEVICE_MEMORY_LIMIT=1G
    bad_case "quota without any GPU" "gets no GPU"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=3 CUDA_DEVICE_MEMORY_LIMIT=1G
    bad_case "quota on a GPU the host does not have" "no GPU with index 3"
    new_bundle true
    echo '{"ociVersion": "1.0.2", "process": ' > "$B/config.json"
    bad_case "malformed config.json" "malformed .*config.json"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local saved=$VGPU_CONFIG
    sed 's|^lower_runtime = .*|lower_runtime = "/nonexistent/runc"|' "$saved" > "$WORK/config-missing.toml"
    VGPU_CONFIG=$WORK/config-missing.toml bad_case "missing lower runtime" 'lower runtime "/nonexistent/runc" not found'
    export VGPU_CONFIG=$saved
}

case_security() {
    echo "-- security: read-only limits and preload, ledger header edits change nothing, symlinked image paths, no LD_PRELOAD in hooks"
    new_bundle sh -c '
        echo x > /run/vgpu/limits.json 2>/dev/null && echo limits-writable
        echo x > /etc/ld.so.preload 2>/dev/null && echo preload-writable
        printf "\377\377\377\377\377\377\377\077" | dd of=$(ls /run/vgpu/ledgers/*.ledger) bs=1 seek=24 count=8 conv=notrunc 2>/dev/null && echo header-edited
        rt_client device 0 info fill 64Mi'
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    check_not "tenant cannot write limits.json" grep -q limits-writable <<<"$out"
    check_not "tenant cannot write /etc/ld.so.preload" grep -q preload-writable <<<"$out"
    check_match "tenant can scribble on its ledger header" header-edited "$out"
    local bytes; bytes=$(field bytes "$out")
    if [ -n "$bytes" ] && [ "$bytes" -le "$GIB" ]; then pass "...which changes nothing: still capped at 1 GiB ($((bytes / MIB)) MiB)"; else fail "ledger header edit raised the quota" "$out"; fi

    # An image whose /etc and /usr/local are symlinks to host folders.
    local evil=$WORK/evilroot host=$WORK/hostdir
    mkdir -p "$host/etc" "$host/local"
    echo /host-evil.so > "$host/etc/ld.so.preload"
    cp -a "$ROOTFS" "$evil"
    rm -rf "$evil/etc" "$evil/usr/local"
    ln -s "$host/etc" "$evil/etc"
    ln -s "$host/local" "$evil/usr/local"
    local snap; snap=$(cd "$host" && find . -printf '%p %s %T@\n' | sort)
    new_bundle cat /etc/ld.so.preload
    bundle_jq "$B" '.root.path = $r' --arg r "$evil"
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    out=$(shim run --bundle "$B" "$ID" 2>&1)
    # runc follows the dangling /usr/local symlink inside the rootfs; crun refuses to (openat2 fails): both
    # are safe. What matters is what the container sees when it runs, and that nothing lands outside.
    if [ "$RUNTIME" = crun ] && [[ "$out" == *"openat2 \`usr/local\`"* ]]; then
        pass "symlinked /usr/local: crun refuses the mount target inside the rootfs ($out)"
        check_eq "  ... and the shim removed the state of the failed create" "$(state_left)" ""
    else
        check_eq "symlinked /etc: the container's preload is the library only (the host file was not read)" "$out" /usr/local/vgpu/libvgpu.so
    fi
    check_eq "symlinked /etc, /usr/local: nothing written outside the rootfs (shim path)" "$(cd "$host" && find . -printf '%p %s %T@\n' | sort)" "$snap"
    rm -rf "$evil/${host#/}"
    new_bundle cat /etc/ld.so.preload
    bundle_jq "$B" '.root.path = $r' --arg r "$evil"
    bundle_annotate "$B" vgpu.io/memory-limit 1Gi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    add_hooksd_hooks
    out=$(plain run --bundle "$B" "$ID" 2>&1)
    check_eq "hooks.d path, symlinked /etc: preload is the library only" "$out" /usr/local/vgpu/libvgpu.so
    check_eq "hooks.d path: nothing written outside the rootfs" "$(cd "$host" && find . -printf '%p %s %T@\n' | sort)" "$snap"

    # The image's LD_PRELOAD must never reach the hooks (they run on the host with its privileges).
    printf '#include <stdio.h>\n__attribute__((constructor)) static void hit(void){FILE*f=fopen("%s","a");if(f){fputs("loaded\\n",f);fclose(f);}}\n' \
        "$WORK/preload-hit" > "$WORK/hit.c"
    gcc -shared -fPIC -o "$WORK/hit.so" "$WORK/hit.c"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G LD_PRELOAD="$WORK/hit.so"
    check "create with LD_PRELOAD in the image's env" create_quiet
    check_eq "the hooks' env is explicit: PATH and VGPU_CONFIG only" \
        "$(jq -c '[.hooks[][] | select(.path == $h) | .env] | unique' --arg h "$HOOK" "$B/config.json")" \
        "[[\"PATH=/usr/sbin:/usr/bin:/sbin:/bin\",\"VGPU_CONFIG=$VGPU_CONFIG\"]]"
    plain start "$ID" >/dev/null 2>&1; sleep 0.3
    plain delete -f "$ID" >/dev/null 2>&1
    check "the image's LD_PRELOAD reached no hook" test ! -e "$WORK/preload-hit"
    check_eq "no state" "$(state_left)" ""
}

case_hooksd() {
    echo "-- hooks.d path (no shim): the hook provisions and bind-mounts before pivot_root"
    new_bundle sh -c 'rt_client device 0 info alloc 600Mi alloc 300Mi; echo x > /run/vgpu/limits.json 2>/dev/null || echo limits-ro; cat /etc/ld.so.preload'
    bundle_annotate "$B" vgpu.io/memory-limit 1Gi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    add_hooksd_hooks
    add_hooksd_hooks   # twice: the stage is idempotent
    local out; out=$(plain run --bundle "$B" "$ID" 2>&1)
    check_eq "hook-mounted quota seen as total" "$(field total "$out")" $GIB
    check_match "600 MiB granted" 'op=alloc .*rc=0' "$(printf '%s\n' "$out" | grep 'op=alloc' | head -1)"
    check_match "300 MiB more refused" 'op=alloc .*err=CUDA_ERROR_OUT_OF_MEMORY' "$(printf '%s\n' "$out" | grep 'op=alloc' | tail -1)"
    check_match "limits.json mounted read-only" limits-ro "$out"
    check_match "ld.so.preload mounted" '^/usr/local/vgpu/libvgpu.so$' "$out"
    check_eq "poststop removed the state" "$(state_left)" ""
    new_bundle true
    bundle_annotate "$B" vgpu.io/memory-limit 99Gi
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    add_hooksd_hooks
    # crun drops a hook's stderr unless the annotation run.oci.hooks.stderr names a file for it.
    bundle_annotate "$B" run.oci.hooks.stderr "$WORK/hook-stderr"
    out=$(plain run --bundle "$B" "$ID" 2>&1; cat "$WORK/hook-stderr" 2>/dev/null)
    check_match "hooks.d path: bad quota fails the container with the hook's line" 'vgpu: annotation vgpu.io/memory-limit.*larger than' "$out"
    check_eq "  ... and leaves nothing" "$(state_left)" ""
    echo '{"id":"never-created","bundle":"/nonexistent"}' > "$WORK/st.json"
    check "poststop without prestart is fine (twice)" sh -c "'$HOOK' poststop < '$WORK/st.json' && '$HOOK' poststop < '$WORK/st.json'"
}

case_precreate() {
    echo "-- precreate (Podman): the spec on stdin, the edited spec on stdout"
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    check "no quota: output byte for byte the input" sh -c "'$HOOK' precreate < '$B/config.json' | cmp -s - '$B/config.json'"
    bundle_annotate "$B" vgpu.io/memory-limit 2Gi
    local out; out=$("$HOOK" precreate < "$B/config.json")
    check_eq "quota: env added for the library" "$(jq -c '[.process.env[] | select(startswith("CUDA_DEVICE_MEMORY_LIMIT_0=") or startswith("VGPU_LIMITS_FILE="))]' <<<"$out")" \
        "[\"CUDA_DEVICE_MEMORY_LIMIT_0=$((2 * GIB))\",\"VGPU_LIMITS_FILE=/run/vgpu/limits.json\"]"
    check_eq "unknown fields kept" "$(jq -c '.linux.maskedPaths' <<<"$out")" "$(jq -c '.linux.maskedPaths' "$B/config.json")"
}

case_chained_lower_runtime() {
    echo "-- a wrapping lower runtime (as nvidia-container-runtime is): its own edits and ours both apply"
    # A stand-in for nvidia-container-runtime: on create/run it edits config.json itself, then execs $RUNTIME.
    cat > "$WORK/wrapper-runtime" <<WRAP
#!/bin/sh
case " \$* " in *" create "*|*" run "*)
    b=\$(pwd); prev=
    for a in "\$@"; do [ "\$prev" = --bundle ] && b=\$a; prev=\$a; done
    jq '.process.env += ["INJECTED_BY_LOWER=1"]' "\$b/config.json" > "\$b/config.json.w" && mv "\$b/config.json.w" "\$b/config.json";;
esac
exec $RUNTIME "\$@"
WRAP
    chmod +x "$WORK/wrapper-runtime"
    local saved=$VGPU_CONFIG
    sed "s|^lower_runtime = .*|lower_runtime = \"$WORK/wrapper-runtime\"|" "$saved" > "$WORK/config-wrapper.toml"
    export VGPU_CONFIG=$WORK/config-wrapper.toml
    new_bundle sh -c 'echo injected=$INJECTED_BY_LOWER; rt_client device 0 info'
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
    local out; out=$(shim run --bundle "$B" "$ID" 2>&1)
    export VGPU_CONFIG=$saved
    check_match "the wrapping runtime's injection reached the container" '^injected=1$' "$out"
    check_eq "  ... and so did the quota" "$(field total "$out")" "$GIB"
    check_eq "  ... and the state went at the end" "$(state_left)" ""
}

case_compute_window() {
    echo "-- the compute share's pacing window: vgpu.io/compute-window (else env VGPU_COMPUTE_WINDOW) into limits.json"
    # limits.json as one line (jq -c), of $ID.
    window_limits() { jq -c . "$STATE/containers/$ID/limits.json"; }
    # two_gpus CMD...: the shim's (fake) NVML sees two GPUs.
    two_gpus() { FAKE_CUDA_DEVICES=2 "$@"; }
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 VGPU_COMPUTE_WINDOW=2s
    bundle_annotate "$B" vgpu.io/compute-limit 30
    bundle_annotate "$B" vgpu.io/compute-window 250ms
    check "shim: vgpu.io/compute-limit=30 with vgpu.io/compute-window=250ms is created" create_quiet
    check_match "  ... limits.json has the window beside the share: \"compute_window_ms\":250 (the annotation wins over env 2s)" \
        '"compute_limit":30,"compute_window_ms":250' "$(window_limits)"
    plain delete -f "$ID" >/dev/null 2>&1
    check_eq "  ... removed with its container" "$(state_left)" ""
    # The env alone, through the hooks.d path: the file as the container sees it.
    new_bundle cat /run/vgpu/limits.json
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=30 VGPU_COMPUTE_WINDOW=2s
    add_hooksd_hooks
    local out; out=$(plain run --bundle "$B" "$ID" 2>&1)
    check_eq "hooks.d (no shim): env VGPU_COMPUTE_WINDOW=2s, the container's limits.json has compute_window_ms 2000" \
        "$(jq -c '.devices[0] | [.compute_limit, .compute_window_ms]' <<<"$out" 2>&1)" "[30,2000]"
    check_eq "  ... poststop removed the state" "$(state_left)" ""
    # Not asked: the file has no such field; on a GPU with a memory quota alone it is never written.
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0,1 CUDA_DEVICE_MEMORY_LIMIT_1=1G
    bundle_annotate "$B" vgpu.io/compute-limit.0 30
    check "a share without a window, and a memory quota on another GPU, are created" two_gpus create_quiet
    check_eq "  ... limits.json has no compute_window_ms" "$(window_limits | grep -c compute_window)" 0
    plain delete -f "$ID" >/dev/null 2>&1
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0,1 CUDA_DEVICE_MEMORY_LIMIT_1=1G
    bundle_annotate "$B" vgpu.io/compute-limit.0 30
    bundle_annotate "$B" vgpu.io/compute-window 2s
    check "a window with a share on GPU 0 and a memory quota alone on GPU 1 is created" two_gpus create_quiet
    check_eq "  ... the window is on the share's GPU only" \
        "$(jq -c '[.devices[] | [.index, .compute_limit, .compute_window_ms]]' "$STATE/containers/$ID/limits.json")" \
        "[[0,30,2000],[1,null,null]]"
    plain delete -f "$ID" >/dev/null 2>&1
    # A window alone asks for nothing, as the policy alone: config.json untouched, no state.
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    bundle_annotate "$B" vgpu.io/compute-window 250ms
    local before; before=$(sha256sum < "$B/config.json")
    check "a window without a share: created" create_quiet
    check_eq "  ... config.json byte for byte unchanged" "$(sha256sum < "$B/config.json")" "$before"
    check_eq "  ... no state" "$(state_left)" ""
    plain delete -f "$ID" >/dev/null 2>&1
    # Malformed: one line naming the setting, nothing provisioned.
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    bundle_annotate "$B" vgpu.io/compute-limit 30
    bundle_annotate "$B" vgpu.io/compute-window 1m
    bad_case "vgpu.io/compute-window=1m" 'vgpu: annotation vgpu.io/compute-window="1m": unknown unit; a compute window is a whole number of ms or s, 10ms to 10s$'
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_SM_LIMIT=30 VGPU_COMPUTE_WINDOW=5ms
    bad_case "env VGPU_COMPUTE_WINDOW=5ms" 'env VGPU_COMPUTE_WINDOW="5ms": out of range'
    new_bundle true
    bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
    bundle_annotate "$B" vgpu.io/compute-limit 30
    bundle_annotate "$B" vgpu.io/compute-windows 250ms
    bad_case "a misspelt vgpu.io/compute-windows" 'annotation vgpu.io/compute-windows is not one vgpu defines \(did you mean vgpu.io/compute-window\?\)'
}

oci_cases() {
    oci_setup
    case_quota_is_total
    case_no_quota
    case_shared_in_container
    case_two_containers
    case_kill_and_gc
    case_bad_input
    case_security
    case_hooksd
    case_precreate
    case_chained_lower_runtime
    case_compute_window
}
