//! The host's side of a live update (`vgpuctl update`): rewriting what a running container's processes
//! read, steps 1-3 of the protocol `vgpu_ledger::live` describes (the library's read is there, beside the
//! protocol both sides follow). Not here: the host's own `limits.json`, which the caller replaces
//! atomically first (`crate::limits_file`); deciding the new limits (`vgpuctl update`).
//!
//! Host-only: the interposer never writes a limits file nor a generation, so none of this is linked into it.

use nix::libc;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vgpu_ledger::layout;
use vgpu_ledger::limits::{Limits, MAX_LIMITS_FILE};
use vgpu_ledger::region::GENERATION_OFFSET;

/// Why an update could not be published. `Display` is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The container was created before live updates (no second name of its mounted limits file).
    #[error("{}: missing: the container was created before live updates were possible; recreate it to change its limits", .0.display())]
    NoMountedFile(PathBuf),
    /// A file of the container's state is not a regular file or cannot be opened or written.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The new file would be larger than the host's readers take.
    #[error("{}: would be {len} bytes, more than {MAX_LIMITS_FILE}", path.display())]
    TooLarge { path: PathBuf, len: u64 },
}

/// A fresh generation for an update: even, not 0, and drawn from the kernel's random source, so a tenant
/// cannot write the value the next update will leave before it comes (a predictable one, such as a count
/// of updates, let it make its processes apply the old file at that value and never read the update).
fn fresh_generation() -> io::Result<u64> {
    let mut b = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok((u64::from_ne_bytes(b) & !1).max(2))
}

/// Writes `generation` into the ledger open as `file` (host tools never map a ledger). One 8-byte
/// `pwrite` at an 8-aligned offset; a reader that catches it half written sees a value that is neither the
/// old nor the new one, which makes it look again, never apply a file it has not read whole.
pub fn write_generation(file: &File, generation: u64) -> io::Result<()> {
    file.write_all_at(&generation.to_le_bytes(), GENERATION_OFFSET)
}

/// The container's copy of `limits`: what the library reads (`devices`), without the host's facts (host
/// PIDs, cgroup path, the creator), which are better kept out of the tenant's sight.
pub fn container_copy(limits: &Limits) -> Limits {
    Limits {
        pid_ns: None,
        init_pid: None,
        init_start_time: None,
        cgroup: None,
        creator: None,
        ..limits.clone()
    }
}

/// Whether the running container whose state folder is `dir` can follow an update: its mounted limits file
/// has its second name. A container created by a package before live updates has none; the caller checks
/// this before it writes anything, so such a container is refused with its files as they were.
pub fn check_publishable(dir: &Path) -> Result<(), PublishError> {
    let mounted = dir.join(layout::MOUNTED_LIMITS_FILE_NAME);
    match std::fs::symlink_metadata(&mounted) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(PublishError::NoMountedFile(mounted)),
        Err(e) => Err(io_err(&mounted, e)),
    }
}

/// Publishes `limits` to the running container whose state folder is `dir`: steps 1-3 of the protocol,
/// over `limits.mounted.json` and every ledger `limits` lists. `limits.updates` must already count this
/// update. The host's own `limits.json` is the caller's to write (atomically) first.
pub fn publish(dir: &Path, limits: &Limits) -> Result<(), PublishError> {
    let mounted = dir.join(layout::MOUNTED_LIMITS_FILE_NAME);
    let mut text = serde_json::to_vec_pretty(&container_copy(limits))
        .map_err(|e| io_err(&mounted, io::Error::other(e)))?;
    text.push(b'\n');
    if text.len() as u64 > MAX_LIMITS_FILE {
        return Err(PublishError::TooLarge {
            path: mounted,
            len: text.len() as u64,
        });
    }
    let file = match open_for_write(&mounted) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(PublishError::NoMountedFile(mounted))
        }
        r => r.map_err(|e| io_err(&mounted, e))?,
    };
    let ledgers = limits
        .devices
        .iter()
        .map(|d| {
            let p = dir.join(&d.ledger);
            open_for_write(&p)
                .map(|f| (p.clone(), f))
                .map_err(|e| io_err(&p, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let whole = fresh_generation().map_err(|e| io_err(Path::new("/dev/urandom"), e))?;
    let set = |g: u64| {
        ledgers
            .iter()
            .try_for_each(|(p, f)| write_generation(f, g).map_err(|e| io_err(p, e)))
    };
    set(whole.saturating_sub(1))?;
    file.write_all_at(&text, 0)
        .and_then(|_| file.set_len(text.len() as u64))
        .map_err(|e| io_err(&mounted, e))?;
    set(whole)
}

fn io_err(path: &Path, source: io::Error) -> PublishError {
    PublishError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a state file for writing in place: never through a link, never a FIFO or device (no blocking
/// open), a regular file only.
fn open_for_write(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if m.mode() & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is not a regular file",
        ));
    }
    Ok(f)
}

#[cfg(test)]
mod tests;
