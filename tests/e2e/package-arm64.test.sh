#!/usr/bin/env bash
# The aarch64 packages (issue 26 item 8: Grace Hopper / GH200 nodes): `make package-arm64`'s steps (the
# interposer cross-built by zig for aarch64 and glibc 2.17, the host binaries for aarch64 and glibc 2.28,
# the .deb and the .rpm), then every artefact read back without running it (this machine is x86-64):
# each ELF file is AArch64, the binaries ask for /lib/ld-linux-aarch64.so.1, no symbol needs a glibc
# past the floor (2.28; the interposer 2.17), and the packages' metadata say arm64 / aarch64 with the
# same Depends and file list as the x86-64 ones. Untested on arm64 hardware (docs/install.md).
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
t_init package-arm64
for c in dpkg-deb rpm readelf cargo-deb cargo-generate-rpm cargo-zigbuild; do
    command -v "$c" >/dev/null || { echo "package-arm64: $c missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done

echo "-- make package-arm64's steps"
rustup target add aarch64-unknown-linux-gnu > "$WORK/rustup.out" 2>&1
make -C "$REPO" --no-print-directory libvgpu VGPU_ARCH=aarch64 > "$WORK/libvgpu.out" 2>&1
ok_if "the interposer builds for aarch64 (make libvgpu VGPU_ARCH=aarch64)" test $? = 0
((FAILED)) && { tail -30 "$WORK/libvgpu.out"; t_done; }
VGPU_ARCH=aarch64 bash "$REPO/packaging/build.sh" > "$WORK/built" 2> "$WORK/build.err"
DEB=$(grep '\.deb$' "$WORK/built"); RPM=$(grep '\.rpm$' "$WORK/built")
ok_if "the arm64 .deb builds" test -f "$DEB"
ok_if "the aarch64 .rpm builds" test -f "$RPM"
((FAILED)) && { tail -30 "$WORK/build.err"; t_done; }
out=$(VGPU_ARCH=sparc bash "$REPO/packaging/build.sh" 2>&1)
check_match "an architecture vgpu does not package is refused with one line" \
    '^package: VGPU_ARCH=sparc is not an architecture vgpu packages \(x86_64, aarch64\)$' "$out"

echo "-- the .deb's metadata"
dpkg-deb -f "$DEB" > "$WORK/control"
check_match "Architecture: arm64" '^Architecture: arm64$' "$(cat "$WORK/control")"
check_match "Depends names the same glibc floor" '^Depends: .*libc6 \(>= 2\.28\)' "$(cat "$WORK/control")"
check_match "the product's description" '^Description: GPU memory quotas and compute shares' "$(cat "$WORK/control")"
check_match "the file name says arm64" '_arm64\.deb$' "$DEB"

echo "-- every ELF file in it: AArch64, glibc floors"
dpkg-deb -x "$DEB" "$WORK/x"
elves=$(find "$WORK/x" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \; | sort)
check_eq "the three binaries and the three libraries are the ELF files" "$(printf '%s\n' "$elves" | sed "s|$WORK/x||" | tr '\n' ' ')" \
    "/usr/bin/vgpu-container-runtime /usr/bin/vgpu-hook /usr/bin/vgpuctl /usr/lib/vgpu/libvgpu-single.so /usr/lib/vgpu/libvgpu.so /usr/lib/vgpu/libvgpu_core.so "
# The newest GLIBC_ version any of the files asks for (readelf reads any architecture; objdump only this one's).
floor() { readelf -W --dyn-syms "$@" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1; }
for f in $elves; do
    name=${f#"$WORK/x"}
    check_match "$name: AArch64" 'Machine: +AArch64' "$(readelf -h "$f")"
    case "$name" in
    /usr/bin/*)
        check_match "  ... asks for the aarch64 loader" 'Requesting program interpreter: /lib/ld-linux-aarch64.so.1' "$(readelf -l "$f")"
        need=$(floor "$f")
        check_eq "  ... needs glibc 2.28 at most (newest: ${need:-none})" "$(printf '%s\n2.28\n' "$need" | sort -V | tail -1)" 2.28 ;;
    *)
        need=$(floor "$f")
        check_eq "  ... needs glibc 2.17 at most (newest: ${need:-none})" "$(printf '%s\n2.17\n' "$need" | sort -V | tail -1)" 2.17 ;;
    esac
done
check "the completions and man pages were generated (by this machine's vgpuctl)" \
    test -s "$WORK/x/usr/share/bash-completion/completions/vgpuctl" -a -s "$WORK/x/usr/share/man/man1/vgpuctl.1.gz"
check "the docs are installed" test -s "$WORK/x/usr/share/doc/vgpu/install.md"

echo "-- the .rpm, read back"
check_match "the .rpm is aarch64" '^Architecture: aarch64$' "$(rpm -qpi "$RPM" 2>/dev/null)"
check_match "  ... and requires the glibc floor" 'libc.so.6\(GLIBC_2.28\)' "$(rpm -qpR "$RPM" 2>/dev/null)"
rpm -qpl "$RPM" 2>/dev/null | grep -E '^/usr/(bin|lib/vgpu)/' | sort > "$WORK/rpm-files"
check_eq "  ... with the same binaries and libraries" "$(tr '\n' ' ' < "$WORK/rpm-files")" \
    "/usr/bin/vgpu-container-runtime /usr/bin/vgpu-hook /usr/bin/vgpuctl /usr/lib/vgpu/libvgpu-single.so /usr/lib/vgpu/libvgpu.so /usr/lib/vgpu/libvgpu_core.so /usr/lib/vgpu/package-hooks "
((FAILED)) && tail -20 "$WORK/build.err"
t_done
