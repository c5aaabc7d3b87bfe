//! Shared code of vgpu-hook and vgpu-container-runtime.
