#!/usr/bin/env bash
# The packages for real: `make package`'s .deb installed on this machine with dpkg, containers run through
# the installed shim and interposer on the fake driver, engines configured by the installed vgpuctl, then
# `dpkg -r` (engines restored, units disabled, files gone) and `dpkg --purge` (nothing of the package left).
# The .rpm is built from the same metadata and read back with rpm (upgrade.test.sh installs, upgrades and
# erases it).
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
t_init package
t_require "$T/vgpu/libvgpu.so" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$CLIENTS_DIR/rt_client"
for c in dpkg-deb rpm cargo-deb cargo-generate-rpm; do
    command -v "$c" >/dev/null || { echo "package: $c missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done
if dpkg-query -W -f='${Status}' vgpu 2>/dev/null | grep -q installed; then
    echo "package: a vgpu package is already installed on this machine; remove it first (dpkg --purge vgpu)"
    echo "0 passed, 1 failed"; exit 1
fi

# What this suite changes outside $WORK goes back however it exits: the package, and the engine configs
# the installed vgpuctl edits (compared byte for byte after removal).
ENGINE_FILES=(/etc/docker/daemon.json /etc/containerd/config.toml)
mkdir -p "$WORK/saved"
for f in "${ENGINE_FILES[@]}"; do
    [ -e "$f" ] && cp -a "$f" "$WORK/saved/$(basename "$f")"
done
restore_engines() {
    local f
    for f in "${ENGINE_FILES[@]}"; do
        if [ -e "$WORK/saved/$(basename "$f")" ]; then cp -a "$WORK/saved/$(basename "$f")" "$f"; else rm -f "$f"; fi
    done
    rm -f /usr/share/containers/oci/hooks.d/vgpu-{createruntime,poststop}.json /etc/containerd/vgpu.d/99-vgpu.toml
    rmdir /etc/containerd/vgpu.d 2>/dev/null
    [ "$HOOKS_DIR_WAS" = yes ] || rmdir -p /usr/share/containers/oci/hooks.d 2>/dev/null
    rm -f /etc/cdi/vgpu.yaml
    [ "$CDI_DIR_WAS" = yes ] || rmdir /etc/cdi 2>/dev/null
}
HOOKS_DIR_WAS=no; [ -d /usr/share/containers/oci/hooks.d ] && HOOKS_DIR_WAS=yes
CDI_DIR_WAS=no; [ -d /etc/cdi ] && CDI_DIR_WAS=yes
on_exit "dpkg --purge vgpu; restore_engines"
declare -A before
for f in "${ENGINE_FILES[@]}"; do before[$f]=$(fingerprint "$f"); done

echo "-- make package"
bash "$REPO/packaging/build.sh" > "$WORK/built" 2> "$WORK/build.err"
DEB=$(grep '\.deb$' "$WORK/built"); RPM=$(grep '\.rpm$' "$WORK/built")
ok_if "the .deb builds" test -f "$DEB"
ok_if "the .rpm builds" test -f "$RPM"
((FAILED)) && { tail -30 "$WORK/build.err"; t_done; }

echo "-- the .deb's metadata"
dpkg-deb -f "$DEB" > "$WORK/control"
check_match "Package: vgpu" '^Package: vgpu$' "$(cat "$WORK/control")"
check_match "the short description is the product's" \
    '^Description: GPU memory quotas and compute shares for containers sharing an NVIDIA GPU$' "$(cat "$WORK/control")"
# The glibc floor: the newest GLIBC_ symbol version the binaries need, which Depends must name (zig builds
# the host binaries for 2.28, the interposer for 2.17).
floor() { objdump -T "$@" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1; }
dpkg-deb -x "$DEB" "$WORK/x"
need=$(floor "$WORK"/x/usr/bin/* "$WORK"/x/usr/lib/vgpu/*.so)
check_eq "the binaries and the interposer need glibc 2.28 at most" "$(printf '%s\n2.28\n' "$need" | sort -V | tail -1)" 2.28
check_eq "the interposer needs glibc 2.17 at most" "$(printf '%s\n2.17\n' "$(floor "$WORK"/x/usr/lib/vgpu/*.so)" | sort -V | tail -1)" 2.17
for f in "$WORK"/x/usr/bin/* "$WORK"/x/usr/lib/vgpu/*.so; do
    check_match "${f#"$WORK/x"}: x86-64" 'Machine: +Advanced Micro Devices X86-64' "$(readelf -h "$f")"
done
check_match "Architecture: amd64" '^Architecture: amd64$' "$(cat "$WORK/control")"
check_match "Depends names that floor (libc6 >= $need)" "^Depends: .*libc6 \(>= $need\)" "$(cat "$WORK/control")"
check_match "Recommends a lower runtime" '^Recommends: runc \| crun$' "$(cat "$WORK/control")"
check_eq "config.toml is the only conffile" "$(dpkg-deb -I "$DEB" conffiles)" /etc/vgpu/config.toml
check "a copyright file" test -s "$WORK/x/usr/share/doc/vgpu/copyright"
check "postinst, prerm and postrm run package-hooks or purge" bash -c "dpkg-deb -I '$DEB' prerm | grep -q 'package-hooks removing' && dpkg-deb -I '$DEB' postinst | grep -q 'package-hooks installed' && dpkg-deb -I '$DEB' postrm | grep -q purge"

echo "-- dpkg -i"
dpkg -i "$DEB" > "$WORK/install.out" 2>&1
check "dpkg -i installs it" test $? = 0
# The doctor fails here (no libnvidia-ml.so.1 at the packaged config's soname): the install succeeds anyway.
check_match "postinst ran vgpuctl doctor, one line per check" '^(ok|warn|FAIL|-) +config +/etc/vgpu/config.toml: parses' "$(cat "$WORK/install.out")"
check_match "  ... whose failure (NVML) does not fail the install" '^FAIL +nvml +cannot load NVML' "$(cat "$WORK/install.out")"
check_match "  ... ending with its count" '^vgpuctl doctor: [1-9][0-9]* failed' "$(cat "$WORK/install.out")"
dpkg -L vgpu | sort > "$WORK/files"
for f in /usr/bin/vgpuctl /usr/bin/vgpu-hook /usr/bin/vgpu-container-runtime /usr/lib/vgpu/libvgpu.so \
         /usr/lib/vgpu/libvgpu_core.so /usr/lib/vgpu/libvgpu-single.so /lib/systemd/system/vgpu-gc.timer /lib/systemd/system/vgpu-monitor.service \
         /etc/vgpu/config.toml /usr/share/man/man1/vgpuctl.1.gz /usr/share/man/man1/vgpuctl-runtime-configure.1.gz \
         /usr/share/man/man1/vgpu-hook.1.gz /usr/share/man/man1/vgpu-container-runtime.1.gz \
         /usr/share/bash-completion/completions/vgpuctl /usr/share/zsh/vendor-completions/_vgpuctl \
         /usr/share/fish/vendor_completions.d/vgpuctl.fish /usr/share/vgpu/helm/vgpu/Chart.yaml /usr/share/vgpu/helm/vgpu/templates/daemonset.yaml \
         /usr/share/doc/vgpu/install.md; do
    check "installed: $f" test -s "$f"
done
links=$(find /usr/share/doc/vgpu -name '*.md' | while read -r f; do
    grep -oE '\]\([^)#: ]+' "$f" | sed 's/^](//' | while read -r l; do
        [ -e "$(dirname "$f")/$l" ] || echo "$f -> $l"
    done
done)
check_eq "every link of an installed page leads to an installed file" "$links" ""
check "  ... the example pod among them" test -s /usr/share/doc/vgpu/examples/pod-with-quota.yaml
check_match "vgpuctl --version runs from /usr/bin" '^vgpuctl ' "$(/usr/bin/vgpuctl --version 2>&1)"
check_match "the man page documents runtime configure's flags" 'set\\-as\\-default' "$(zcat /usr/share/man/man1/vgpuctl-runtime-configure.1.gz)"
check_match "  ... containerd's --drop-in among them" 'drop\\-in' "$(zcat /usr/share/man/man1/vgpuctl-runtime-configure.1.gz)"
check_match "vgpu-hook's page names its stages" 'createRuntime' "$(zcat /usr/share/man/man1/vgpu-hook.1.gz)"
check_match "vgpu-container-runtime's page says what it does with runc's command line" 'lower runtime' "$(zcat /usr/share/man/man1/vgpu-container-runtime.1.gz)"
# bash calls a completion function with the command, the word being completed and the one before it.
complete_words() {
    bash -c '. /usr/share/bash-completion/completions/vgpuctl; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
             _vgpuctl vgpuctl "${@: -1}" "${@: -2:1}"; printf "%s\n" "${COMPREPLY[@]}"' _ "$@" 2>&1
}
check_match "bash completion offers the subcommands" '^runtime$' "$(complete_words vgpuctl "")"
check_match "  ... and runtime's" '^configure$' "$(complete_words vgpuctl runtime "")"
check "the packaged config.toml (all defaults) is accepted" /usr/bin/vgpuctl status --state-root "$WORK/none"
check "postinst enabled the gc timer (systemctl enable, no running systemd needed)" \
    test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
# The gc unit's command on a fresh boot: a custom state_root that does not exist yet.
execstart=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/vgpu-gc.service)
printf 'state_root = "%s"\n' "$WORK/custom/not-yet" > "$WORK/custom.toml"
check_match "gc.service's ExecStart with a custom state_root not made yet: nothing to do, exit 0" '^0 removed' \
    "$(VGPU_CONFIG=$WORK/custom.toml $execstart 2>&1)"
check_not "gc.service needs no path that exists only after the first container (no ReadWritePaths=/run/vgpu)" \
    grep -E '^(ReadWritePaths|ReadOnlyPaths|InaccessiblePaths)=[^-]' /lib/systemd/system/vgpu-gc.service

echo "-- containers through the installed shim, hook and interposer (runc, fake driver)"
RUNTIME=runc
HOOK=/usr/bin/vgpu-hook SHIM=/usr/bin/vgpu-container-runtime LIBVGPU=/usr/lib/vgpu/libvgpu.so
oci_setup
new_bundle rt_client device 0 info fill 64Mi
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 512Mi
out=$(shim run --bundle "$B" "$ID" 2>&1)
check_eq "vgpu.io/memory-limit=512Mi: the container sees 512 MiB" "$(field total "$out")" $((512 * MIB))
check_match "  ... and is refused past it" 'op=fill .*err=CUDA_ERROR_OUT_OF_MEMORY' "$out"
check_match "  ... through /usr/lib/vgpu/libvgpu.so" '/usr/lib/vgpu/libvgpu.so' "$(cat "$STATE"/containers/*/ld.so.preload 2>/dev/null; grep -rh library "$VGPU_CONFIG")"
check_eq "  ... and its state is gone after it exits" "$(state_left)" ""
new_bundle rt_client device 0 info
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0
bundle_annotate "$B" vgpu.io/memory-limit 12parsecs
check_match "a bad quota fails the container with one line" 'vgpu.io/memory-limit' "$(shim run --bundle "$B" "$ID" 2>&1)"

echo "-- engines configured by the installed vgpuctl (their default files)"
check "docker configured" /usr/bin/vgpuctl runtime configure --runtime=docker
# A drop-in outside conf.d: only vgpuctl's record says where it is (the main file gets an imports entry).
check "containerd configured (--drop-in /etc/containerd/vgpu.d/99-vgpu.toml)" \
    /usr/bin/vgpuctl runtime configure --runtime=containerd --drop-in /etc/containerd/vgpu.d/99-vgpu.toml
check "podman configured (hooks.d)" /usr/bin/vgpuctl runtime configure --runtime=podman
check "vgpu's CDI spec written (fake NVML)" /usr/bin/vgpuctl cdi generate --nvml-library "$FAKE_DIR/libnvidia-ml.so.1"
check "  ... naming the installed hook" grep -q 'path: /usr/bin/vgpu-hook' /etc/cdi/vgpu.yaml
check "daemon.json names the installed shim" grep -q /usr/bin/vgpu-container-runtime /etc/docker/daemon.json

echo "-- dpkg -r with an engine config vgpuctl cannot parse: the removal stops, nothing is left half-done"
cp /etc/docker/daemon.json "$WORK/daemon.configured"
echo '{"runtimes": {"vgpu": {"path": "/usr/bin/vgpu-container-runtime"}}, oops' > /etc/docker/daemon.json
out=$(dpkg -r vgpu 2>&1)
check_match "dpkg -r fails naming the engine and the command to run" \
    'could not unconfigure docker; fix its config, then run: vgpuctl runtime unconfigure --runtime=docker' "$out"
check "  ... the package stays installed" test -x /usr/bin/vgpuctl
check "  ... with its gc timer enabled again (postinst abort-remove)" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
cp "$WORK/daemon.configured" /etc/docker/daemon.json

echo "-- dpkg -r"
out=$(dpkg -r vgpu 2>&1); rc=$?
check_eq "dpkg -r removes it" "$rc" 0
for e in docker containerd; do
    check_match "  ... and says $e must be restarted now" "vgpu: restart $e now \\(e.g. systemctl restart $e\\)" "$out"
done
check_eq "  ... not podman (it reads its hooks at every command)" "$(printf '%s\n' "$out" | grep -c 'restart podman')" 0
[ "$HOOKS_DIR_WAS" = no ] && check_not "the hooks folder configure created is gone with the hooks" test -e /usr/share/containers/oci/hooks.d
for f in "${ENGINE_FILES[@]}"; do
    if [ "${before[$f]}" = absent ] && [ "$f" = /etc/docker/daemon.json ]; then
        # Issue 46: configure made it; unconfigure left `{}` behind, now it removes it again.
        check_not "$f, which configure created, is gone again (not left as {})" test -e "$f"
    elif [ "${before[$f]}" = absent ]; then
        # configure made it; unconfigure leaves the file without vgpu's entry (an empty config).
        check_not "$f names vgpu no more" grep -q vgpu "$f"
    else
        check_eq "$f is as before configure" "$(fingerprint "$f")" "${before[$f]}"
    fi
done
check_eq "the podman hooks are gone" "$(ls /usr/share/containers/oci/hooks.d/vgpu-* 2>/dev/null)" ""
check_not "vgpu's CDI spec is gone" test -e /etc/cdi/vgpu.yaml
check_not "containerd's drop-in outside conf.d is gone (found through vgpuctl's record)" test -e /etc/containerd/vgpu.d/99-vgpu.toml
check_not "the gc timer is disabled" test -L /etc/systemd/system/timers.target.wants/vgpu-gc.timer
check_eq "no binary, library or unit left; only the conffile" \
    "$(while read -r f; do [ -f "$f" ] && echo "$f"; done < "$WORK/files")" /etc/vgpu/config.toml

echo "-- dpkg --purge"
check "dpkg --purge purges it" dpkg --purge vgpu
check_eq "nothing of the package left (files and folders of its own)" \
    "$(while read -r f; do [ -e "$f" ] && case "$f" in */vgpu*|*/_vgpuctl) echo "$f";; esac; done < "$WORK/files")" ""
check_not "dpkg no longer knows it" dpkg -s vgpu

echo "-- the .rpm, read back"
rpm -qpl "$RPM" 2>/dev/null | sort > "$WORK/rpm-files"
sed 's|^/lib/systemd|/usr/lib/systemd|; s|/zsh/vendor-completions/|/zsh/site-functions/|' "$WORK/files" |
    grep -Ev '^/usr/share/doc/vgpu/(copyright|changelog)' | while read -r f; do [ -d "$WORK/x$f" ] || [ -d "${WORK}/x${f/\/usr\/lib\/systemd//lib/systemd}" ] || echo "$f"; done | sort > "$WORK/deb-files"
check_eq "the .rpm holds the .deb's files (systemd units under /usr/lib)" "$(diff "$WORK/deb-files" "$WORK/rpm-files")" ""
check_match "the .rpm's summary is the product's" '^Summary +: GPU memory quotas and compute shares for containers' \
    "$(rpm -qpi "$RPM" 2>/dev/null)"
check_eq "config.toml is the .rpm's config file" "$(rpm -qpc "$RPM" 2>/dev/null)" /etc/vgpu/config.toml
check_match "Requires names the glibc floor" "libc.so.6\(GLIBC_$need\)" "$(rpm -qpR "$RPM" 2>/dev/null)"
check_match "%preun takes vgpu out of the engines on erase" 'package-hooks removing' "$(rpm -qp --scripts "$RPM" 2>/dev/null)"
check_match "%post enables the units" 'package-hooks installed' "$(rpm -qp --scripts "$RPM" 2>/dev/null)"
check_match "%postun removes vgpu's own folders on erase (the .rpm lists none)" 'rmdir "\$d"' "$(rpm -qp --scripts "$RPM" 2>/dev/null | sed -n '/^postuninstall/,$p')"
((FAILED)) && tail -20 "$WORK/build.err"
t_done
