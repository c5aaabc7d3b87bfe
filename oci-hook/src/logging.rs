//! Logs of the shim, the hook and vgpuctl, through `tracing`: the level is the vgpu config's `log_level`,
//! the destination its `log_file` (appended to, written by `tracing-appender`'s file appender, which starts
//! a new file every hour or day under `log_rotation` and keeps `log_max_files` of them) or else stderr.
//! Never stdout: the hook's and the shim's stdout belong to the engine, vgpuctl's to its output.
//! User-facing one-line errors are not logs and are printed as before. The writer is the blocking one:
//! the hook and the shim live for a moment, and a background writer thread would lose their last lines.
use crate::config::{Config, LogLevel, LogRotation};
use std::path::Path;
use tracing::Level;
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

fn level(l: LogLevel) -> Level {
    match l {
        LogLevel::Debug => Level::DEBUG,
        LogLevel::Info => Level::INFO,
        LogLevel::Warn => Level::WARN,
        LogLevel::Error => Level::ERROR,
    }
}

/// Where the logs go: `log_file`, or stderr.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    pub file: Option<&'a Path>,
    pub rotation: LogRotation,
    pub max_files: Option<usize>,
}

/// Installs the subscriber for `program` from `cfg` (once per process; later calls do nothing). A log
/// file that cannot be opened is said on stderr, and the logs go to stderr instead.
pub fn init(program: &'static str, cfg: &Config) {
    let to = Destination {
        file: cfg.log_file.as_deref(),
        rotation: cfg.log_rotation,
        max_files: cfg.log_max_files,
    };
    init_with(program, cfg.log_level, to);
}

/// As `init`, from the level and destination themselves (vgpuctl, when the config cannot be loaded).
pub fn init_with(program: &'static str, log_level: LogLevel, to: Destination) {
    let writer = match to.file.map(|p| (p, appender(p, to.rotation, to.max_files))) {
        Some((_, Ok(f))) => BoxMakeWriter::new(f),
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

impl Default for Destination<'_> {
    fn default() -> Self {
        Destination {
            file: None,
            rotation: LogRotation::Never,
            max_files: None,
        }
    }
}

/// The appender of `path`: the file itself without rotation, `<path>.<date>` with it.
fn appender(
    path: &Path,
    rotation: LogRotation,
    max_files: Option<usize>,
) -> Result<RollingFileAppender, String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err("not a file path".into());
    };
    let mut b = RollingFileAppender::builder()
        .rotation(match rotation {
            LogRotation::Never => Rotation::NEVER,
            LogRotation::Hourly => Rotation::HOURLY,
            LogRotation::Daily => Rotation::DAILY,
        })
        .filename_prefix(name.to_string_lossy());
    if let Some(n) = max_files {
        b = b.max_log_files(n);
    }
    b.build(dir).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn without_rotation_the_file_is_log_file_appended_to() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("vgpu.log");
        std::fs::write(&p, "before\n").unwrap();
        let a = appender(&p, LogRotation::Never, None).unwrap();
        a.make_writer().write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "before\nafter\n");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn with_rotation_the_file_carries_its_date() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("vgpu.log");
        let a = appender(&p, LogRotation::Daily, Some(3)).unwrap();
        a.make_writer().write_all(b"line\n").unwrap();
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("vgpu.log.20"), "{names:?}");
    }

    #[test]
    fn a_log_file_that_cannot_be_opened_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("file"), "").unwrap();
        assert!(appender(&d.path().join("file/vgpu.log"), LogRotation::Never, None).is_err());
    }
}
