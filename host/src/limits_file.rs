//! limits.json as the host writes it (the hook's provisioning, `vgpuctl update`, gc's tests): its bytes
//! (`WriteLimits::to_file_bytes`: validated, pretty JSON and a newline, at most `MAX_LIMITS_FILE`) replaced
//! atomically, mode 0644 whatever was there, synced. Not here: the format and its parsing
//! (`vgpu_ledger::limits`, which the library links: it only reads the file), reading it on the host
//! (`crate::hostfile::load_limits`), a live update's rewrite in place (`crate::live`).

use std::io;
use std::path::Path;
use vgpu_ledger::limits::MAX_LIMITS_FILE;
use vgpu_ledger::Limits;

use crate::atomic::{write_atomic, WriteOptions};

/// How the limits file is written: mode 0644 whatever was there, synced (docs/architecture.md).
const WRITE_OPTIONS: WriteOptions = WriteOptions::with_mode(0o644).durable();

/// The host's write of a limits file.
pub trait WriteLimits {
    /// The file's bytes as the host writes them: validated, pretty JSON and a newline, at most
    /// [`MAX_LIMITS_FILE`]. An error is one line without the path (the writer names it).
    fn to_file_bytes(&self) -> io::Result<Vec<u8>>;

    /// Write the file atomically (temporary file in the same folder, then rename), mode 0644: readable by
    /// the container's non-root processes, writable by nobody inside (it is mounted read-only anyway).
    /// An invalid or oversized file is refused, nothing written; errors name the path.
    fn write_atomic(&self, path: &Path) -> io::Result<()>;
}

impl WriteLimits for Limits {
    fn to_file_bytes(&self) -> io::Result<Vec<u8>> {
        self.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        text.push(b'\n');
        // The host's readers take no larger file (`MAX_LIMITS_FILE`): one written larger would hide the
        // container from them all (status, admission, gc, the monitor).
        if text.len() as u64 > MAX_LIMITS_FILE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "would be {} bytes, more than the host's readers take ({})",
                    text.len(),
                    MAX_LIMITS_FILE
                ),
            ));
        }
        Ok(text)
    }

    fn write_atomic(&self, path: &Path) -> io::Result<()> {
        let text = self
            .to_file_bytes()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        write_atomic(path, &text, WRITE_OPTIONS)
    }
}

#[cfg(test)]
mod tests;
