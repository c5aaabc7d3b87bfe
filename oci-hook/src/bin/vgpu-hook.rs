//! `vgpu-hook <stage>`: see `vgpu_oci::hook` and docs/oci.md; its command line: `vgpu_oci::cli`.

use clap::Parser;

fn main() {
    let cli = vgpu_oci::cli::HookCli::parse();
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = vgpu_oci::hook::run(&cli.stage, &mut stdin, &mut stdout) {
        eprintln!("vgpu: {e:#}");
        std::process::exit(1);
    }
}
