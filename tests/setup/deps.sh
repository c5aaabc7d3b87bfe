#!/usr/bin/env bash
# Installs what vgpu needs on a fresh Debian 12 machine. `deps.sh build` (what `make build` runs): only
# the build's needs — a C compiler, CUDA/NVML headers (build time only, never committed), zig +
# cargo-zigbuild for the glibc-2.17 build of libvgpu.so. `deps.sh` (`make test`, `make demo`, `make bench`):
# that and the container engines from Debian's packages and the suites' tools. Idempotent; quiet when all
# is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-all}
case $mode in build|all) ;; *) echo "usage: $0 [build|all]" >&2; exit 2 ;; esac

# protoc: the CRI bindings (k8s-cri) of tests/cri-client are generated when the workspace builds.
# prometheus: promtool and a real Prometheus server, the strict parsers of tests/e2e/exporter.test.sh.
apt_pkgs=(gcc make python3-pip protobuf-compiler)
[ "$mode" = all ] && apt_pkgs+=(runc crun podman docker.io containerd uidmap fuse-overlayfs iptables
                                jq hyperfine procps util-linux prometheus)
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CUDA driver API and NVML headers, for the C test clients and the GPU suite's programs.
if [ ! -f .deps/cuda/include/cuda.h ] || [ ! -f .deps/cuda/include/nvml.h ]; then
    echo "deps: fetching CUDA headers"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12
    mkdir -p .deps/cuda/include
    for w in "$tmp"/*.whl; do
        (cd "$tmp" && python3 -m zipfile -e "$w" x >/dev/null)
    done
    cp -r "$tmp"/x/nvidia/cuda_runtime/include/. .deps/cuda/include/
    cp "$tmp"/x/nvidia/nvml_dev/include/nvml.h .deps/cuda/include/
    rm -rf "$tmp"
fi

# CUDA 13 driver headers (cuda.h, cudaTypedefs.h and the interop headers), from which `make surface`
# lists and classifies the driver's whole surface (libvgpu/abi/gen/surface.py).
if [ ! -f .deps/cuda13/include/cudaTypedefs.h ]; then
    echo "deps: fetching CUDA 13 headers"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" "nvidia-cuda-runtime==13.0.*"
    mkdir -p .deps/cuda13/include
    (cd "$tmp" && python3 -m zipfile -e "$tmp"/*.whl x >/dev/null)
    cp -r "$tmp"/x/nvidia/cu13/include/. .deps/cuda13/include/
    rm -rf "$tmp"
fi

# zig + cargo-zigbuild: libvgpu.so is built against glibc 2.17 so old images can preload it.
if ! command -v cargo-zigbuild >/dev/null || ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "deps: installing ziglang and cargo-zigbuild"
    python3 -m pip install -q ziglang cargo-zigbuild
fi
# cargo machete: the lint gate's check that no crate lists a dependency it does not use (`make lint`).
if ! command -v cargo-machete >/dev/null; then
    echo "deps: installing cargo-machete"
    cargo install -q cargo-machete --locked
fi
rustup target list --installed 2>/dev/null | grep -q x86_64-unknown-linux-gnu || true

# C test clients (tests/clients/build.sh): the C library's headers (only recommended by gcc, so not
# pulled in with --no-install-recommends) and binutils (readelf, used by the fake-driver suite).
client_pkgs=()
for p in libc6-dev binutils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || client_pkgs+=("$p")
done
if ((${#client_pkgs[@]})); then
    echo "deps: installing ${client_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${client_pkgs[@]}" >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${client_pkgs[@]}" >/dev/null; }
fi

[ "$mode" = build ] && exit 0

# OCI end-to-end suites (tests/e2e/lib/rootfs.sh): a static busybox makes the containers' root filesystems.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed"; then
    echo "deps: installing busybox-static"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static >/dev/null
fi

# Engine suites (tests/e2e/engines-*.test.sh): PyYAML checks the Kubernetes example, systemd-analyze the
# gc timer units, dpkg-deb builds the package.
for p in python3-yaml systemd dpkg; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "deps: installing $p"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
    fi
done

# Packages (make package, tests/e2e/package.test.sh, installer.test.sh): cargo-deb and cargo-generate-rpm
# build them, dpkg-shlibdeps (dpkg-dev) reads the binaries' glibc floor, rpm reads the .rpm back, and
# kubernetes-validate checks the Kubernetes manifests against the API's schemas offline, helm-python-sdk
# renders and lints the chart with Helm's own engine.
for p in dpkg-dev rpm; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        echo "deps: installing $p"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
    fi
done
for c in cargo-deb cargo-generate-rpm; do
    if ! command -v "$c" >/dev/null; then
        echo "deps: installing $c"
        cargo install -q --locked "$c"
    fi
done
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
    echo "deps: installing kubernetes-validate"
    python3 -m pip install -q kubernetes-validate
fi
# cel-python evaluates the chart's tenant-quota admission policy's CEL against sample pods
# (tests/e2e/quota-policy.test.sh).
if ! python3 -c 'import celpy' 2>/dev/null; then
    echo "deps: installing cel-python"
    python3 -m pip install -q cel-python
fi
# A real Helm (v4, its Go library with a C API) for the chart's lint, template and upgrade tests
# (tests/e2e/helm.test.sh): helm-python-sdk ships it, no helm binary to fetch.
if ! python3 -c 'import helm_python' 2>/dev/null; then
    echo "deps: installing helm-python-sdk"
    python3 -m pip install -q helm-python-sdk==0.2.2
fi
