//! Logs of the shim, the hook and vgpuctl, through `tracing`: the level is the vgpu config's `log_level`,
//! the destination its `log_file` (appended to, written by `tracing-appender`'s file appender, which starts
//! a new file every hour or day under `log_rotation` and keeps `log_max_files` of them) or else stderr.
//! Never stdout: the hook's and the shim's stdout belong to the engine, vgpuctl's to its output.
//! User-facing one-line errors are not logs and are printed as before. The writer is the blocking one:
//! the hook and the shim live for a moment, and a background writer thread would lose their last lines.
//! Every record is written through [`Printable`]: a record is one line whatever a tenant put in the names
//! and paths it carries (control characters escaped by `crate::printable`).
use crate::config::{Config, LogLevel, LogRotation};
use std::io::Write;
use std::path::Path;
use tracing::Level;
use tracing_appender::rolling::{RollingFileAppender, Rotation};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::MakeWriter;

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
    let _ = tracing::subscriber::set_global_default(subscriber(log_level, writer));
    tracing::debug!(program, version = crate::version::LONG, "logging started");
}

/// The subscriber writing records of `log_level` and above, one line each, to `writer`.
fn subscriber<W>(log_level: LogLevel, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_max_level(level(log_level))
        .with_writer(Printable(writer))
        .with_ansi(false)
        .with_target(false)
        .finish()
}

/// A writer whose records come out with their control characters escaped. The formatter writes a record
/// whole, in one `write_all` of its text ending in a newline: that last newline is kept, any other is
/// escaped.
struct Printable<M>(M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Printable<M> {
    type Writer = PrintableWriter<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        PrintableWriter(self.0.make_writer())
    }
}

struct PrintableWriter<W>(W);

impl<W: Write> Write for PrintableWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0
            .write_all(crate::printable::printable_line(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
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
    use std::sync::{Arc, Mutex};

    /// A record carrying a tenant's name with a newline and a terminal escape is one line, escaped: no
    /// forged second record, no raw escape byte (the formatter escapes that one itself, not newlines).
    #[test]
    fn a_record_is_one_line_whatever_its_names_hold() {
        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Captured::default();
        let w = out.clone();
        let pod = "p\nERROR vgpu-hook: forged\x1b[2J";
        tracing::subscriber::with_default(subscriber(LogLevel::Info, move || w.clone()), || {
            tracing::info!(pod, "provisioned pod {pod}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.ends_with('\n') && !text.contains('\x1b'), "{text:?}");
        assert!(
            text.contains("provisioned pod p\\nERROR vgpu-hook: forged"),
            "{text}"
        );
    }

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

    /// `log_max_files` bounds the disk the logs take: opening the log (each hook or shim run does) leaves
    /// the newest `n - 1` older files and the current one; other files of the folder are not touched.
    #[test]
    fn with_rotation_only_log_max_files_are_kept() {
        let d = tempfile::tempdir().unwrap();
        for day in 1..=5 {
            std::fs::write(d.path().join(format!("vgpu.log.2020-01-0{day}")), "old\n").unwrap();
        }
        std::fs::write(d.path().join("other.log"), "not ours\n").unwrap();
        let a = appender(&d.path().join("vgpu.log"), LogRotation::Daily, Some(3)).unwrap();
        a.make_writer().write_all(b"line\n").unwrap();
        let mut names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names.contains(&"other.log".to_string()), "{names:?}");
        assert_eq!(
            names
                .iter()
                .filter(|n| n.starts_with("vgpu.log.2020"))
                .count(),
            2,
            "{names:?}"
        );
    }

    #[test]
    fn a_log_file_that_cannot_be_opened_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("file"), "").unwrap();
        assert!(appender(&d.path().join("file/vgpu.log"), LogRotation::Never, None).is_err());
    }
}
