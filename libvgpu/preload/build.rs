// Link the front as compactly as the loader allows: every process of the container maps it, so each
// page and segment it spares is spared on every `ls` and `bash`. One read-execute segment instead of
// separate read-only and executable ones, and no RELRO (its mprotect and separate read-write segment
// protect a handful of GOT entries that the front never writes after load).
// No libdl: the dl functions are found at first use (src/libdl.rs).
// With the `embedded-engine` feature (libvgpu-single.so), VGPU_ENGINE_PATH names the engine to carry.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-rosegment");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,norelro");
    if std::env::var_os("CARGO_FEATURE_EMBEDDED_ENGINE").is_some() {
        println!("cargo:rerun-if-env-changed=VGPU_ENGINE_PATH");
        let Some(path) = std::env::var_os("VGPU_ENGINE_PATH") else {
            eprintln!("libvgpu-preload: the embedded-engine feature needs VGPU_ENGINE_PATH (the built libvgpu_core.so)");
            std::process::exit(1);
        };
        let path = std::path::PathBuf::from(path);
        if !path.is_file() {
            eprintln!(
                "libvgpu-preload: VGPU_ENGINE_PATH={}: no such file",
                path.display()
            );
            std::process::exit(1);
        }
        println!("cargo:rerun-if-changed={}", path.display());
        println!("cargo:rustc-env=VGPU_EMBEDDED_ENGINE={}", path.display());
    }
}
