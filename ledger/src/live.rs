//! Live updates of a running container's limits (`vgpuctl update`): how the host rewrites what the
//! container's processes read, and how they read it without ever applying half a file. Both sides are
//! here because they must agree byte for byte (docs/architecture.md, "Live updates").
//!
//! The container's `/run/vgpu/limits.json` is a bind mount of one inode, fixed when the container was
//! created: a file renamed over the host's `limits.json` afterwards (the owner's record does that) never
//! reaches the container. So provisioning gives that inode a second name, `limits.mounted.json`
//! (`layout::MOUNTED_LIMITS_FILE_NAME`), and an update rewrites *that* file in place, under the node's
//! admission lock, bracketed by the ledgers' generation word (a seqlock):
//!
//! 1. every ledger of the container: generation `g − 1` (odd: being written), `g` a fresh random even
//!    number (`fresh_generation`: the tenant cannot write it ahead of the update);
//! 2. the mounted file: the new bytes written over the old from offset 0, then cut to their length;
//! 3. every ledger: generation `g` (even: whole).
//!
//! A reader (the library) compares the generation with the one it applied, one load; when it moved and is
//! even it reads the file, parses it, and loads the generation again: only if it is still the same value
//! is the file applied (`read_stable`). The generation is tenant-writable memory, so it is only a hint to
//! look: the limits come from the read-only mounted file. A tenant that forges it can make its own
//! processes read the file more often, or (writing an odd value) put off reading it; it cannot make them
//! skip an update, whose generation it cannot guess. Removing the preload does more, and the watchdog is
//! the wall against that (docs/security.md).

use nix::libc;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::layout;
use crate::limits::{Limits, LimitsErrorKind, MAX_LIMITS_FILE};
use crate::region::write_generation;

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

/// Publishes `limits` to the running container whose state folder is `dir`: steps 1-3 of the module's
/// protocol, over `limits.mounted.json` and every ledger `limits` lists. `limits.updates` must already
/// count this update. The host's own `limits.json` is the caller's to write (atomically) first.
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

/// Why a reading was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The host is writing (odd generation), or wrote again while the file was read.
    #[error("being rewritten")]
    Moving,
    #[error("cannot read: {0}")]
    Io(#[from] io::Error),
    #[error("{0:?}")]
    Invalid(LimitsErrorKind),
}

/// Reads the limits file at `path` as of the generation `generation()` returns: the generation is loaded
/// before and after the read, and the file counts only when both loads agree on one even value. Returns
/// that generation and the limits.
pub fn read_stable(path: &Path, generation: impl Fn() -> u64) -> Result<(u64, Limits), ReadError> {
    let before = generation();
    if before % 2 == 1 {
        return Err(ReadError::Moving);
    }
    let bytes = std::fs::read(path)?;
    let parsed = Limits::from_slice(&bytes);
    if generation() != before {
        return Err(ReadError::Moving);
    }
    Ok((before, parsed.map_err(ReadError::Invalid)?))
}

#[cfg(test)]
mod tests;
