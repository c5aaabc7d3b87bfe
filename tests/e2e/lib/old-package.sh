# The packages of an older commit of this repository, for the upgrade suite (sourced after common.sh):
#   old_package COMMIT   sets OLD_DEB and OLD_RPM to the .deb and .rpm that COMMIT's own `make package`
#                        recipe builds (its Makefile's libvgpu target, then its packaging/build.sh), from a
#                        `git worktree` of COMMIT under $WORK. On failure: one line saying why, status 1.
# The packages are labelled 0.1.0-0.git<commit> (Debian revision, rpm release) so that they sort below
# this build's 0.1.0-1 as a real older release would: the project has not raised its version between the
# two. That label, in the worktree's package metadata, is the only change made to COMMIT's tree.
# Cost: the first run builds the interposer and the host binaries of COMMIT (minutes on 2 cores). Cargo's
# registry is shared, and cargo's target folder for COMMIT ($T/old-package/COMMIT/target) starts as a copy
# of this build's (the dependencies that did not change are not built again). The packages are kept in
# $T/old-package/COMMIT/packages: a second run builds nothing.

old_package() {
    local commit=$1
    local label=0.git${commit:0:9}
    local cache=$T/old-package/$commit
    local src=$WORK/old-src log=$WORK/old-package.log
    OLD_DEB= OLD_RPM=
    if ! git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
        echo "$SUITE: $REPO is not a git checkout: the older package is built from commit $commit of its history" >&2
        return 1
    fi
    if ! git -C "$REPO" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "$SUITE: commit $commit (the older package's) is not in this clone's history (a shallow clone? git fetch --unshallow)" >&2
        return 1
    fi
    _old_found "$cache/packages" && return 0
    rm -rf "$cache/packages" "$src"
    git -C "$REPO" worktree prune
    if ! git -C "$REPO" worktree add --detach --quiet "$src" "$commit" > "$log" 2>&1; then
        echo "$SUITE: cannot check out commit $commit in a git worktree: $(tail -1 "$log")" >&2
        return 1
    fi
    on_exit "git -C '$REPO' worktree remove --force '$src'"
    local manifest=$src/runtime-config/Cargo.toml
    sed -i -e "/^\[package.metadata.deb\]\$/a revision = \"$label\"" \
        -e "/^\[package.metadata.generate-rpm\]\$/a release = \"$label\"" "$manifest"
    if [ "$(grep -c "= \"$label\"\$" "$manifest")" != 2 ]; then
        echo "$SUITE: commit $commit: $manifest has no [package.metadata.deb] and [package.metadata.generate-rpm] to label" >&2
        return 1
    fi
    # This build's dependencies, where cargo's target folder for the commit does not exist yet: the
    # interposer's (glibc 2.17: the target triple's folder, the preload front's) and the host binaries'
    # (glibc 2.28, with their build scripts and proc macros). The interposer's build scripts and proc
    # macros are built again (under a minute): they share target/release with the plain workspace build.
    local ct=$cache/target s
    if [ ! -d "$ct" ]; then
        mkdir -p "$ct/glibc-2.28"
        for s in x86_64-unknown-linux-gnu preload; do [ -d "$T/$s" ] && cp -a "$T/$s" "$ct/"; done
        for s in release x86_64-unknown-linux-gnu; do [ -d "$T/glibc-2.28/$s" ] && cp -a "$T/glibc-2.28/$s" "$ct/glibc-2.28/"; done
    fi
    if ! (cd "$src" && export CARGO_TARGET_DIR=$ct && make --no-print-directory libvgpu && bash packaging/build.sh) >> "$log" 2>&1; then
        echo "$SUITE: commit $commit: its make libvgpu / packaging/build.sh failed (log: $log, last line: $(tail -1 "$log"))" >&2
        return 1
    fi
    mkdir -p "$cache/packages.new"
    cp "$src"/target/package/*.deb "$src"/target/package/*.rpm "$cache/packages.new/" &&
        mv "$cache/packages.new" "$cache/packages"
    git -C "$REPO" worktree remove --force "$src"
    # The packages are what a second run needs; cargo's folder (hundreds of MiB) goes.
    rm -rf "$ct"
    _old_found "$cache/packages" || { echo "$SUITE: commit $commit: its build made no .deb and .rpm" >&2; return 1; }
}

# _old_found DIR: sets OLD_DEB and OLD_RPM when DIR holds exactly one of each.
_old_found() {
    local debs=("$1"/*.deb) rpms=("$1"/*.rpm)
    [ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ] && [ ${#rpms[@]} = 1 ] && [ -f "${rpms[0]}" ] || return 1
    OLD_DEB=${debs[0]} OLD_RPM=${rpms[0]}
}
