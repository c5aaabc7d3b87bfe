//! Creating a container's ledger, the one ledger operation the OCI side needs on top of the ledger crate
//! (reading them is `vgpu_host::inventory`'s).
//! Not here: the ledger itself (`vgpu_ledger::region`) or where ledgers live (`vgpu_ledger::layout`).

use std::path::Path;
use vgpu_ledger::Ledger;

use crate::provision::ProvisionError;

/// Creates (or keeps) the ledger of GPU `uuid` at `path` with the provisioned limit. An I/O error stays in
/// the error (the provisioner tells a full file system by it: `ProvisionError::io_error`).
pub fn create(path: &Path, uuid: &str, limit: u64) -> Result<(), ProvisionError> {
    Ledger::open_or_create(path, uuid, limit).map_err(|err| ProvisionError::Ledger {
        path: path.to_path_buf(),
        err,
    })?;
    Ok(())
}
