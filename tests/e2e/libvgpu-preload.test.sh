#!/usr/bin/env bash
# The preload front (libvgpu.so) and the engine (libvgpu_core.so): the front forwards exactly the engine's
# entry points, a process that never calls CUDA never loads the engine, a CUDA process does, and a missing
# engine makes CUDA fail with one line instead of running without the quota.
# Needs `make build`.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
TD=$(realpath -m "${CARGO_TARGET_DIR:-target}")  # cargo's target folder
FRONT=$TD/vgpu/libvgpu.so
CORE=$TD/vgpu/libvgpu_core.so
RT=$TD/clients/rt_client
LN=$TD/clients/linked_client
for f in "$FRONT" "$CORE" "$RT" "$LN" $TD/clients/libctor.so $TD/fake/libcuda.so.1; do
    [ -e "$f" ] || { echo "libvgpu-preload.test: $f missing (run make build)"; echo "0 passed, 1 failed"; exit 1; }
done
W=$(mktemp -d /tmp/vgpu-preload-test.XXXXXX)
trap 'rm -rf "$W"' EXIT
pass=0; fail=0
check() { local name=$1; shift; if "$@"; then pass=$((pass + 1)); echo "ok   $name"; else fail=$((fail + 1)); echo "FAIL $name"; fi; }
export LD_LIBRARY_PATH=$TD/fake FAKE_CUDA_STATE_DIR=$W/fake FAKE_CUDA_DEVICES=1 FAKE_CUDA_CONTEXT_BYTES=0
mkdir -p "$W/fake"

exports() { nm -D --defined-only "$1" | awk '$2 == "T" || $2 == "W" {print $3}' | sort; }
exports "$FRONT" > "$W/front"
exports "$CORE" | grep -vx vgpu_dlsym_route > "$W/core"
grep -vx dlsym "$W/front" > "$W/front-forwarded"
check "the front forwards exactly the engine's entry points ($(wc -l < "$W/core") symbols, dlsym its own)" \
    diff -u "$W/core" "$W/front-forwarded"
check "dlsym is the front's (routed through the engine's vgpu_dlsym_route)" grep -qx dlsym "$W/front"
check "the front needs only libc" \
    test "$(readelf -d "$FRONT" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | grep -v -e '^libc\.so\.6$' -e '^ld-linux' | wc -l)" = 0
check "the front has no constructor" bash -c "! readelf -d '$FRONT' | grep -q -e INIT_ARRAY -e '(INIT)'"

# A non-CUDA process maps the front only.
maps=$(LD_PRELOAD=$FRONT cat /proc/self/maps)
check "a non-CUDA process maps libvgpu.so" grep -q 'libvgpu\.so' <<<"$maps"
check "a non-CUDA process never loads libvgpu_core.so" bash -c "! grep -q libvgpu_core <<<\"\$1\"" _ "$maps"

# CUDA processes get the quota through the front, both ways of reaching the driver.
for c in "$RT" "$LN"; do
    out=$(LD_PRELOAD=$FRONT CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/cache "$c" info fill 256Mi 2>&1)
    check "$(basename "$c") through the front: total is the quota" grep -q "op=info .*total=1073741824 " <<<"$out"
    check "$(basename "$c") through the front: fill stops at the quota (4 x 256 MiB)" grep -q "op=fill .*count=4 " <<<"$out"
done

# Without the engine beside it, CUDA fails closed with exactly one line on stderr.
mkdir -p "$W/lonely" && cp "$FRONT" "$W/lonely/libvgpu.so"
for c in "$RT" "$LN"; do
    LD_PRELOAD=$W/lonely/libvgpu.so CUDA_DEVICE_MEMORY_LIMIT=1g "$c" info >"$W/out" 2>"$W/err"
    st=$?
    # (the runtime-style client gets no function from cuGetProcAddress; the linked one gets
    # CUDA_ERROR_NOT_INITIALIZED from cuInit)
    check "$(basename "$c") without the engine: CUDA is refused, not unlimited (exit $st)" \
        bash -c "test $st != 0 && grep -q 'op=init .*rc=[1-9]' '$W/out' && ! grep -q 'op=info .*total=' '$W/out'"
    check "$(basename "$c") without the engine: one line naming the missing file" \
        bash -c "test \$(wc -l < '$W/err') = 1 && grep -q 'libvgpu_core.so' '$W/err'"
done

# Regression (lock order): a library constructor that calls CUDA runs inside dlopen, holding the loader's
# lock; a one-time lock the interposer held across dlsym (building its driver-address table) while that
# constructor waited for it deadlocked both threads. The fake lines the two up every time
# (FAKE_CUDA_DLOPEN_RACE, tests/fake-driver.md); `timeout` turns a deadlock into a failure.
CTOR=$TD/clients/libctor.so
LD_PRELOAD=$FRONT CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=$W/cache FAKE_CUDA_DLOPEN_RACE=$CTOR \
    timeout 20 "$RT" info >"$W/out" 2>"$W/err"
st=$?
check "a constructor calling CUDA inside dlopen while another thread resolves: no deadlock (exit $st)" test $st = 0
check "  and the constructor got the driver function" grep -q 'ctorlib: cuGetProcAddress rc=0 found=1' "$W/err"
check "  and the other thread its answer" grep -q 'op=info .*total=1073741824 ' "$W/out"

echo "libvgpu-preload: $pass passed, $fail failed"
((fail == 0))
