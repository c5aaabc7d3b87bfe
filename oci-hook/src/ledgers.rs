//! Creating a container's ledger, the one ledger operation the OCI side needs on top of the ledger crate
//! (reading them is `vgpu_host::inventory`'s).
//! Not here: the ledger itself (`vgpu_ledger::region`) or where ledgers live (`vgpu_ledger::layout`).

use std::path::Path;
use vgpu_ledger::{Ledger, LedgerError};

/// Creates (or keeps) the ledger of GPU `uuid` at `path` with the provisioned limit. An I/O error stays
/// `LedgerError::Io` (the provisioner tells a full file system by it).
pub fn create(path: &Path, uuid: &str, limit: u64) -> Result<(), LedgerError> {
    Ledger::open_or_create(path, uuid, limit)?;
    Ok(())
}
