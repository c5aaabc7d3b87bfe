//! `vgpu-container-runtime`: the OCI runtime shim; see `vgpu_oci::shim` and docs/oci.md.
//! It takes runc's command line as is, so no argument parser of its own (its man page describes it:
//! `vgpu_oci::cli::shim_command`).

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `run` returns only on error, after reporting it on stderr and in the engine's --log file.
    let _ = vgpu_oci::shim::run(args);
    std::process::exit(1);
}
