//! The ledger's errors: `Refused` (a charge over the limit) and `LedgerError` (a file that cannot be used,
//! or a failed operation on one). Only the types and their messages; the checks that raise them are elsewhere.

use super::format::SLOT_COUNT;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::quantity::format_bytes;

/// A charge that would take the ledger past its limit. Nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub requested: u64,
    pub used: u64,
    pub limit: u64,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU memory quota exceeded: requested {}, {} of {} already in use",
            format_bytes(self.requested),
            format_bytes(self.used),
            format_bytes(self.limit)
        )
    }
}

impl std::error::Error for Refused {}

/// A ledger file that cannot be used, or a failed operation on one. `Display` names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("vgpu ledger {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The file's bytes are never shown: it may be anything (a tenant can make its ledger a link to a host
    /// file for a tool that follows links, or write any bytes in it).
    #[error("vgpu ledger {}: not a vgpu ledger (bad magic)", path.display())]
    BadMagic { path: PathBuf },
    #[error("vgpu ledger {}: format version {found}; this build supports version {supported}", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("vgpu ledger {}: truncated: {size} bytes, expected {expected}", path.display())]
    Truncated {
        path: PathBuf,
        size: u64,
        expected: u64,
    },
    #[error("vgpu ledger {}: corrupt header: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error("vgpu ledger {}: belongs to GPU {found}, not {expected}", path.display())]
    UuidMismatch {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("vgpu ledger {}: all {SLOT_COUNT} process slots are held by live processes", path.display())]
    NoFreeSlot { path: PathBuf },
    #[error("vgpu ledger {}: opened read-only", path.display())]
    ReadOnly { path: PathBuf },
    #[error("vgpu ledger {}: {what}", path.display())]
    InvalidArgument { path: PathBuf, what: String },
}

/// `map_err` helper: an I/O error on the ledger at `path`.
pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LedgerError + '_ {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    }
}
