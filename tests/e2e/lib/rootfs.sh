# Container root filesystems made from this machine's files (no image is ever pulled).
#   rootfs_busybox DIR            static busybox and its applets in DIR/bin, plus /etc, /tmp, /proc, ...
#   rootfs_add_libs DIR FILE...   copies the shared libraries FILEs need (ldd closure, dynamic loader
#                                 included) into DIR at their host paths, so glibc programs and libraries
#                                 bind-mounted later (test clients, the fake driver, libvgpu.so) run there
#   rootfs_tar DIR FILE           a tarball of DIR for `docker import`
# Needs the busybox-static package (tests/setup/deps.sh installs it).

rootfs_busybox() {
    local dir=$1 bb=/bin/busybox a
    [ -x "$bb" ] || { echo "rootfs_busybox: $bb missing (apt-get install busybox-static)" >&2; return 1; }
    mkdir -p "$dir"/{bin,etc,tmp,proc,sys,dev,run,root,usr/local}
    chmod 1777 "$dir/tmp"
    cp "$bb" "$dir/bin/busybox"
    for a in $("$bb" --list); do
        [ -e "$dir/bin/$a" ] || ln -s busybox "$dir/bin/$a"
    done
    echo "root:x:0:0:root:/root:/bin/sh" > "$dir/etc/passwd"
    echo "nobody:x:65534:65534:nobody:/:/bin/sh" >> "$dir/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$dir/etc/group"
}

rootfs_add_libs() {
    local dir=$1 f lib; shift
    for f in "$@"; do
        # ldd prints "name => /path (addr)" and "/lib64/ld-linux-x86-64.so.2 (addr)".
        for lib in $(ldd "$f" 2>/dev/null | grep -Eo '/[^ ]+' | grep -v '^/proc'); do
            [ -e "$lib" ] || continue
            mkdir -p "$dir$(dirname "$lib")"
            [ -e "$dir$lib" ] || cp -L "$lib" "$dir$lib"
        done
    done
    # Debian keeps libraries under /lib/x86_64-linux-gnu with /lib64 for the loader: both exist here.
    return 0
}

rootfs_tar() {
    tar -C "$1" -cf "$2" .
}
