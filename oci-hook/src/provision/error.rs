//! Why the per-container state could not be made, recorded or removed (`crate::provision`, removal:
//! `vgpu_host::removal`). Each `Display`
//! is the one line the shim or the hook prints; a cause already in the line is not also its `source()`.

use std::io;
use std::path::PathBuf;
use vgpu_host::removal::RemoveError;
use vgpu_host::state_root::MARKER_FILE_NAME;
use vgpu_host::walk::PrepareError;
use vgpu_ledger::layout::LayoutError;
use vgpu_ledger::limits::LimitsError;
use vgpu_ledger::LedgerError;

/// The state of container `id` is there already: it belongs to a live container with this id, or to a
/// create of it in progress. Nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error(
    "container {id}: its state {} already exists (a container with this id is running or being \
     created; state left by a crash is collected after gc_pending_grace_seconds)",
    dir.display()
)]
pub struct AlreadyExists {
    pub id: String,
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A container id or GPU UUID that is no safe file name.
    #[error(transparent)]
    Name(#[from] LayoutError),
    #[error(transparent)]
    AlreadyExists(#[from] AlreadyExists),
    /// The container's folder is there and vgpu did not make it.
    #[error(
        "{} exists and was not made by vgpu (no {MARKER_FILE_NAME} marker in it): refusing to replace it; \
         remove it or set state_root to a folder of vgpu's own",
        dir.display()
    )]
    NotOurs { dir: PathBuf },
    /// A folder to change or remove that vgpu did not make.
    #[error("{} was not made by vgpu (no {MARKER_FILE_NAME} marker in it): left alone", dir.display())]
    Unmarked { dir: PathBuf },
    /// `<root>/containers/` holds something and no marker.
    #[error("{}", vgpu_host::walk::not_ours_message(dir))]
    ForeignRoot { dir: PathBuf },
    /// The state root's file system is full (ENOSPC, EDQUOT).
    #[error(
        "no space left on the state root {} for the state of container {id} (its ledgers take {}, \
         allocated up front so that no GPU process dies of a full disk later): free space there or set \
         state_root elsewhere",
        root.display(),
        vgpu_ledger::format_bytes(*needed)
    )]
    NoSpace {
        root: PathBuf,
        id: String,
        needed: u64,
    },
    #[error("container init pid {pid}: cannot read /proc/{pid}/stat")]
    NoStartTime { pid: u32 },
    #[error("cannot create ledger {}: {}", path.display(), ledger_cause(err))]
    Ledger { path: PathBuf, err: LedgerError },
    /// The container's limits file cannot be read.
    #[error("container {id}: {err}")]
    Limits { id: String, err: LimitsError },
    /// A file system operation failed; `what` says which ("cannot remove /x").
    #[error("{what}: {err}")]
    Io { what: String, err: io::Error },
    /// A file system operation failed, with the system's reason alone.
    #[error(transparent)]
    BareIo(#[from] io::Error),
    /// A rename that failed (`what`: which), the system's reason.
    #[error("{what}: {err}")]
    Rename {
        what: String,
        err: nix::errno::Errno,
    },
    /// The state folder could not be removed (`vgpu_host::removal`).
    #[error(transparent)]
    Remove(#[from] RemoveError),
}

/// A ledger's I/O error is shown as the system's reason alone (the line names the ledger already).
fn ledger_cause(err: &LedgerError) -> String {
    match err {
        LedgerError::Io { source, .. } => source.to_string(),
        e => e.to_string(),
    }
}

impl From<PrepareError> for ProvisionError {
    fn from(e: PrepareError) -> ProvisionError {
        match e {
            PrepareError::Io { what, err } => ProvisionError::Io { what, err },
            PrepareError::NotOurs { dir } => ProvisionError::ForeignRoot { dir },
        }
    }
}

impl ProvisionError {
    /// `what`: `err`, for an I/O error with its context.
    pub(crate) fn io(what: impl Into<String>, err: io::Error) -> ProvisionError {
        ProvisionError::Io {
            what: what.into(),
            err,
        }
    }

    /// The I/O error under this one, if any (the provisioner tells a full file system by it).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            ProvisionError::Io { err, .. }
            | ProvisionError::BareIo(err)
            | ProvisionError::Remove(RemoveError::Io { err, .. }) => Some(err),
            ProvisionError::Ledger {
                err: LedgerError::Io { source, .. },
                ..
            } => Some(source),
            _ => None,
        }
    }
}
