//! Live updates of a running container's limits (`vgpuctl update`): the protocol by which the host rewrites
//! what the container's processes read, and the library's read, which never applies half a file. The
//! protocol is written here once, beside the reader the interposer links; the host's write of it is
//! `vgpu_host::live::publish` (docs/architecture.md, "Live updates").
//!
//! The container's `/run/vgpu/limits.json` is a bind mount of one inode, fixed when the container was
//! created: a file renamed over the host's `limits.json` afterwards (the owner's record does that) never
//! reaches the container. So provisioning gives that inode a second name, `limits.mounted.json`
//! (`layout::MOUNTED_LIMITS_FILE_NAME`), and an update rewrites *that* file in place, under the node's
//! admission lock, bracketed by the ledgers' generation word (a seqlock). `vgpu_host::live::publish` takes
//! these steps:
//!
//! 1. every ledger of the container: generation `g − 1` (odd: being written), `g` a fresh random even
//!    number (drawn from `/dev/urandom`: the tenant cannot write it ahead of the update);
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

use std::io;
use std::path::Path;

use crate::limits::{Limits, LimitsErrorKind};

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
