# Shared by tests/e2e/engines-*.test.sh (sourced, not run): counters, file fingerprints, a tiny rootfs
# made of the host's own binaries, and the vgpu config the engines' hooks and shim read.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VGPUCTL=$ROOT/target/release/vgpuctl
SHIM=$ROOT/target/release/vgpu-container-runtime
HOOK=$ROOT/target/release/vgpu-hook
LIBVGPU=${LIBVGPU:-$ROOT/target/vgpu/libvgpu.so}   # the glibc-2.17 build that ships
passed=0; failed=0

# Results go to fd 3 (the suite's stdout), so `check ... > file` captures only the command's output.
exec 3>&1
ok()   { passed=$((passed + 1)); echo "ok   - $*" >&3; }
bad()  { failed=$((failed + 1)); echo "FAIL - $*" >&3; }
# check "description" command...: passes when the command succeeds.
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
finish() { echo "$passed passed, $failed failed"; ((failed == 0)); }
fingerprint() { if [ -e "$1" ]; then sha256sum < "$1" | cut -c1-64; else echo absent; fi; }

need() {
    local f
    for f in "$@"; do
        [ -e "$f" ] || { echo "missing $f: run 'make build' first"; bad "prerequisite $f"; finish; exit 1; }
    done
}

# make_rootfs DIR [PROGRAM...]: sh, cat, ls, env, sleep, the given programs and their libraries from the
# host (nothing is pulled).
make_rootfs() {
    local dir=$1 b lib; shift
    mkdir -p "$dir"/{bin,etc,proc,sys,dev,tmp,run,usr/local/bin}
    for b in sh cat ls env sleep; do cp -L "$(command -v $b)" "$dir/bin/$b"; done
    for b in "$@"; do cp -L "$b" "$dir/bin/"; done
    # Plus what the preloaded interposer needs (libgcc_s, ...), as any real distribution image has.
    for lib in $( (ldd "$dir"/bin/*; [ -e "$LIBVGPU" ] && ldd "$LIBVGPU") | grep -P '^\t' | grep -o '/[^ ]*' | sort -u); do
        mkdir -p "$dir$(dirname "$lib")"; cp -L "$lib" "$dir$lib"
    done
    echo 'root:x:0:0:root:/:/bin/sh' > "$dir/etc/passwd"
    echo 'root:x:0:' > "$dir/etc/group"
}

# write_vgpu_config FILE STATE_ROOT: the config the shim and the hook read (VGPU_CONFIG=FILE).
write_vgpu_config() {
    cat > "$1" <<EOT
state_root = "$2"
library = "$LIBVGPU"
hook_path = "$HOOK"
nvml_library = "$ROOT/target/fake/libnvidia-ml.so.1"
lower_runtime = "runc"
log_level = "warn"
EOT
}
