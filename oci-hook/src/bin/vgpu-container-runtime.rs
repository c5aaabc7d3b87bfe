use clap::Parser;

/// vgpu-container-runtime (placeholder until the OCI issue lands).
#[derive(Parser)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
