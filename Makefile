# The two README commands: `make demo` (the main job) and `make test`. Both install what they need.
# Build products (under $CARGO_TARGET_DIR when it is set, else target/):
#   target/release/{vgpu-hook,vgpu-container-runtime,vgpuctl}   host binaries
#   target/vgpu/{libvgpu.so,libvgpu_core.so}  the interposer (preload front + engine), glibc 2.17
#   target/vgpu-aarch64/                      the same for aarch64 (`make libvgpu VGPU_ARCH=aarch64`)
#   target/fake/{libcuda.so.1,libnvidia-ml.so.1}   the fake driver and NVML
#   target/clients/{rt_client,linked_client}       C test clients
SHELL := /bin/bash
CARGO ?= cargo
# The interposer's architecture: x86_64 (the default) or aarch64 (Grace Hopper; `make package-arm64`).
VGPU_ARCH ?= x86_64
ZIG_TARGET := $(VGPU_ARCH)-unknown-linux-gnu.2.17
LIBVGPU_DIR := vgpu$(if $(filter-out x86_64,$(VGPU_ARCH)),-$(VGPU_ARCH))
# Cargo's target folder, absolute, so the copies below and the test scripts find what cargo built.
TARGET := $(abspath $(or $(CARGO_TARGET_DIR),target))
export CARGO_TARGET_DIR := $(TARGET)

.PHONY: all deps build-deps build libvgpu fake clients lint surface test unit e2e demo bench soak gpu-bundle package package-arm64 installer-image clean

all: build

# The build needs only a compiler, the CUDA headers and zig; the engines are for test, demo and bench.
build-deps:
	@bash tests/setup/deps.sh build

deps:
	@bash tests/setup/deps.sh

build: build-deps
	$(CARGO) build --release --workspace
	@$(MAKE) --no-print-directory libvgpu fake clients

# The shipped interposer, two files that always travel together: libvgpu.so, the no_std preload front every
# process loads, and libvgpu_core.so, the engine it loads beside itself on the first CUDA/NVML call.
# zig links both against glibc 2.17 symbols only. And libvgpu-single.so, the front carrying the engine
# (loaded from a memfd where no libvgpu_core.so lies beside it): for a place that mounts one file (HAMi).
libvgpu:
	$(CARGO) zigbuild --release -p libvgpu --target $(ZIG_TARGET)
	$(CARGO) zigbuild --release --manifest-path libvgpu/preload/Cargo.toml --target $(ZIG_TARGET) \
		--target-dir $(TARGET)/preload
	@mkdir -p $(TARGET)/$(LIBVGPU_DIR)
	cp $(TARGET)/$(VGPU_ARCH)-unknown-linux-gnu/release/libvgpu_core.so $(TARGET)/$(LIBVGPU_DIR)/libvgpu_core.so
	cp $(TARGET)/preload/$(VGPU_ARCH)-unknown-linux-gnu/release/libvgpu.so $(TARGET)/$(LIBVGPU_DIR)/libvgpu.so
	VGPU_ENGINE_PATH=$(abspath $(TARGET)/$(LIBVGPU_DIR)/libvgpu_core.so) $(CARGO) zigbuild --release \
		--manifest-path libvgpu/preload/Cargo.toml --features embedded-engine --target $(ZIG_TARGET) \
		--target-dir $(TARGET)/preload-single
	cp $(TARGET)/preload-single/$(VGPU_ARCH)-unknown-linux-gnu/release/libvgpu.so $(TARGET)/$(LIBVGPU_DIR)/libvgpu-single.so

# The fake driver under its real sonames.
fake:
	@mkdir -p $(TARGET)/fake
	cp $(TARGET)/release/libfake_cuda.so $(TARGET)/fake/libcuda.so.1
	ln -sf libcuda.so.1 $(TARGET)/fake/libcuda.so
	cp $(TARGET)/release/libfake_nvml.so $(TARGET)/fake/libnvidia-ml.so.1
	ln -sf libnvidia-ml.so.1 $(TARGET)/fake/libnvidia-ml.so

clients: fake
	@LIBCUDA_DIR=$(TARGET)/fake OUT=$(TARGET)/clients bash tests/clients/build.sh

# The classified driver surface (libvgpu/abi/surface.tsv, docs/driver-surface.md) from the CUDA 13 headers
# (fetched by deps.sh into .deps/cuda13, never committed) and libvgpu/abi/classes.txt.
surface: build-deps
	python3 libvgpu/abi/gen/surface.py .deps/cuda13/include

unit: build deps
	$(CARGO) test --release --workspace

e2e: build deps
	@bash tests/e2e/run-all.sh

# The lint gate first: formatting and clippy (warnings are errors) on every crate, the preload front too, and
# no dependency a crate does not use (cargo machete, over both workspaces); the layout rules (tests/layout)
# run with the unit tests.
lint: build-deps
	$(CARGO) machete
	$(CARGO) fmt --all --check
	$(CARGO) fmt --manifest-path libvgpu/preload/Cargo.toml --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) clippy --release --manifest-path libvgpu/preload/Cargo.toml --target-dir $(TARGET)/preload -- -D warnings
	@# libvgpu-single.so's code too; any file stands in for the engine's bytes in a check.
	VGPU_ENGINE_PATH=$(abspath libvgpu/preload/Cargo.toml) $(CARGO) clippy --release \
		--manifest-path libvgpu/preload/Cargo.toml --features embedded-engine --target-dir $(TARGET)/preload-lint -- -D warnings

test: build deps lint
	$(CARGO) test --release --workspace
	@bash tests/e2e/run-all.sh

demo: build deps
	@bash tests/demo.sh

bench: build deps
	@bash tests/bench/run.sh
	@bash tests/bench/container-start.sh
	@bash tests/bench/monitor.sh
	@bash tests/bench/unified.sh

# The soak (issue 47, docs/soak.md): tests/soak/soak.c's seeded mix of contexts, resets, fork, threads, streams,
# events, graphs, pools and VMM, SOAK_RUNS times (1000) on the fake driver under the library in the quota,
# share, spill and oversubscribe modes; `make test` runs a short pass (tests/e2e/soak.test.sh).
soak: build deps
	@SOAK_RUNS=$${SOAK_RUNS:-1000} bash tests/soak/run.sh

# The .deb and the .rpm in target/package/ (docs/install.md): host binaries for glibc 2.28, the interposer for 2.17,
# vgpuctl's completions and the man pages of the three binaries generated from their CLIs.
package: build deps
	@bash packaging/build.sh

# The same packages for aarch64 (an arm64 .deb, an aarch64 .rpm) in target/package-arm64/: the interposer
# and the host binaries cross-built by zig with the same glibc floors (2.17, 2.28). Untested on arm64
# hardware: the artefacts' architecture and glibc symbols are checked (tests/e2e/package-arm64.test.sh).
package-arm64: build deps
	@rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || true
	@$(MAKE) --no-print-directory libvgpu VGPU_ARCH=aarch64
	@VGPU_ARCH=aarch64 bash packaging/build.sh

# The Kubernetes installer image vgpu/installer:VERSION, by docker import (nothing pulled), in the Docker
# that DOCKER_HOST names (the Helm chart, packaging/helm/vgpu).
installer-image: package
	@bash packaging/installer/build.sh

# What the GPU machine needs (no Rust there): the built interposer, tools and scripts travel in the tree.
gpu-bundle: build
	@bash tests/gpu/bundle.sh

clean:
	$(CARGO) clean
