# The two README commands: `make demo` (the main job) and `make test`. Both install what they need.
# Build products:
#   target/release/{vgpu-hook,vgpu-container-runtime,vgpuctl}   host binaries
#   target/vgpu/{libvgpu.so,libvgpu_core.so}  the interposer (preload front + engine), glibc 2.17
#   target/fake/{libcuda.so.1,libnvidia-ml.so.1}   the fake driver and NVML
#   target/clients/{rt_client,linked_client}       C test clients
SHELL := /bin/bash
CARGO ?= cargo
ZIG_TARGET := x86_64-unknown-linux-gnu.2.17

.PHONY: all deps build libvgpu fake clients test unit e2e demo bench gpu-bundle package installer-image clean

all: build

deps:
	@bash tests/setup/deps.sh

build: deps
	$(CARGO) build --release --workspace
	@$(MAKE) --no-print-directory libvgpu fake clients

# The shipped interposer, two files that always travel together: libvgpu.so, the no_std preload front every
# process loads, and libvgpu_core.so, the engine it loads beside itself on the first CUDA/NVML call.
# zig links both against glibc 2.17 symbols only.
libvgpu:
	$(CARGO) zigbuild --release -p libvgpu --target $(ZIG_TARGET)
	$(CARGO) zigbuild --release --manifest-path libvgpu/preload/Cargo.toml --target $(ZIG_TARGET) \
		--target-dir target/preload
	@mkdir -p target/vgpu
	cp target/x86_64-unknown-linux-gnu/release/libvgpu_core.so target/vgpu/libvgpu_core.so
	cp target/preload/x86_64-unknown-linux-gnu/release/libvgpu.so target/vgpu/libvgpu.so

# The fake driver under its real sonames.
fake:
	@mkdir -p target/fake
	cp target/release/libfake_cuda.so target/fake/libcuda.so.1
	ln -sf libcuda.so.1 target/fake/libcuda.so
	cp target/release/libfake_nvml.so target/fake/libnvidia-ml.so.1
	ln -sf libnvidia-ml.so.1 target/fake/libnvidia-ml.so

clients: fake
	@bash tests/clients/build.sh

unit: build
	$(CARGO) test --release --workspace

e2e: build
	@bash tests/e2e/run-all.sh

test: build
	$(CARGO) test --release --workspace
	@bash tests/e2e/run-all.sh

demo: build
	@bash tests/demo.sh

bench: build
	@bash tests/bench/run.sh
	@bash tests/bench/container-start.sh
	@bash tests/bench/monitor.sh

# The .deb and the .rpm in target/package/ (docs/install.md): host binaries and interposer for glibc 2.17,
# vgpuctl's completions and man pages generated from its CLI.
package: build
	@bash packaging/build.sh

# The Kubernetes installer image vgpu/installer:VERSION, by docker import (nothing pulled), in the Docker
# that DOCKER_HOST names (packaging/kubernetes/vgpu-daemonset.yaml).
installer-image: package
	@bash packaging/installer/build.sh

# What the GPU machine needs (no Rust there): the built interposer, tools and scripts travel in the tree.
gpu-bundle: build
	@bash tests/gpu/bundle.sh

clean:
	$(CARGO) clean
