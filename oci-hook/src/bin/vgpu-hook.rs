//! `vgpu-hook <stage>`: see `vgpu_oci::hook` and docs/oci.md.

use clap::Parser;

/// vgpu OCI hook: provisions and removes a container's GPU memory quota state.
#[derive(Parser)]
#[command(name = "vgpu-hook", version = vgpu_oci::version::LONG, about)]
struct Cli {
    /// createRuntime, prestart, precreate or poststop.
    stage: String,
}

fn main() {
    let cli = Cli::parse();
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = vgpu_oci::hook::run(&cli.stage, &mut stdin, &mut stdout) {
        eprintln!("vgpu: {e:#}");
        std::process::exit(1);
    }
}
