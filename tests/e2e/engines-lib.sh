# Shared by tests/e2e/engines-*.test.sh (sourced, not run), on top of the common suite helpers in lib/
# (t_init, t_require, t_done, rootfs_*, dockerd_*, vgpu_config). What it adds:
#   ok_if WHAT CMD...      passes when CMD succeeds; unlike `check`, CMD's output goes where the caller
#                          redirects it (`ok_if "x" vgpuctl ... > file`), the result line to the suite's stdout
#   fingerprint FILE       sha256 of FILE, or "absent"
#   engine_rootfs DIR [PROGRAM...]  busybox rootfs with PROGRAMs in /bin and every library they and the
#                          interposer and the fake driver need (as any real distribution image has them)
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
. "$(dirname "${BASH_SOURCE[0]}")/lib/rootfs.sh"
. "$(dirname "${BASH_SOURCE[0]}")/lib/dockerd.sh"
. "$(dirname "${BASH_SOURCE[0]}")/lib/vgpu.sh"
VGPUCTL=$T/release/vgpuctl
CORE=$T/vgpu/libvgpu_core.so

exec 3>&1
ok_if() {
    local what=$1; shift
    if "$@"; then pass "$what" >&3; else fail "$what" >&3; fi
}

fingerprint() { if [ -e "$1" ]; then sha256sum < "$1" | cut -c1-64; else echo absent; fi; }

engine_rootfs() {
    local dir=$1; shift
    rootfs_busybox "$dir" || return 1
    [ $# -gt 0 ] && cp -L "$@" "$dir/bin/"
    rootfs_add_libs "$dir" "$LIBVGPU" "$CORE" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1" "$@"
}
