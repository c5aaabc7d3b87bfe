//! Logs of the shim, the hook and vgpuctl, through `tracing`: the level is the vgpu config's `log_level`,
//! the destination its `log_file` (appended to) or else stderr. Never stdout: the hook's and the shim's
//! stdout belong to the engine, vgpuctl's to its output. User-facing one-line errors are not logs and
//! are printed as before.
use crate::config::Config;
use std::path::Path;
use std::sync::Mutex;
use tracing::Level;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

fn level(name: &str) -> Level {
    match name {
        "debug" => Level::DEBUG,
        "info" => Level::INFO,
        "warn" => Level::WARN,
        _ => Level::ERROR,
    }
}

/// Installs the subscriber for `program` from `cfg` (once per process; later calls do nothing). A log
/// file that cannot be opened is said on stderr, and the logs go to stderr instead.
pub fn init(program: &'static str, cfg: &Config) {
    init_with(program, &cfg.log_level, cfg.log_file.as_deref());
}

/// As `init`, from the level and file themselves (vgpuctl, when the config cannot be loaded).
pub fn init_with(program: &'static str, log_level: &str, log_file: Option<&Path>) {
    let writer = match log_file.map(|p| (p, open(p))) {
        Some((_, Ok(f))) => BoxMakeWriter::new(Mutex::new(f)),
        Some((p, Err(e))) => {
            eprintln!(
                "{program}: cannot open log_file {}: {e}; logging to stderr",
                p.display()
            );
            BoxMakeWriter::new(std::io::stderr)
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level(log_level))
        .with_writer(writer)
        .with_ansi(false)
        .with_target(false)
        .try_init();
    tracing::debug!(program, version = crate::version::LONG, "logging started");
}

fn open(p: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
}
