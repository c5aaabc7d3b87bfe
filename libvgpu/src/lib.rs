//! libvgpu.so: see docs/architecture.md.
