use clap::Parser;

/// vgpuctl: configure container engines for vgpu and show GPU memory usage.
#[derive(Parser)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
