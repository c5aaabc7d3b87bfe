//! `nvml_readings LIB SECONDS`: prints each GPU's processes and their SM utilisation from the host tools'
//! NVML binding once a second, for the GPU suite (tests/gpu/nvml_sampling.sh): a process that stops
//! working must read as idle at the next reading, not at its last busy sample NVML still buffers.
use std::time::Duration;
use vgpu_host::nvml::{Library, Nvml};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(lib), Some(secs)) = (args.get(1), args.get(2).and_then(|s| s.parse::<u64>().ok()))
    else {
        eprintln!("usage: nvml_readings LIB SECONDS");
        std::process::exit(2);
    };
    let nvml = match Library::load(lib) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("nvml_readings: {e}");
            std::process::exit(1);
        }
    };
    for t in 0..secs {
        match nvml.readings() {
            Ok(rs) => {
                for r in rs {
                    println!(
                        "t={t} gpu={} util={:?} procs={:?}",
                        r.index, r.utilization, r.process_utilization
                    );
                }
            }
            Err(e) => println!("t={t} error={e}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
