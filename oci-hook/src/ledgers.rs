//! The two ledger operations the OCI side needs, on top of the ledger crate.
//! Not here: the ledger itself (`vgpu_ledger::region`) or where ledgers live (`vgpu_ledger::layout`).

use anyhow::{anyhow, Result};
use std::path::Path;
use vgpu_ledger::{Ledger, LedgerError, Snapshot};

/// Creates (or keeps) the ledger of GPU `uuid` at `path` with the provisioned limit. An I/O error stays in
/// the error's chain (the provisioner tells a full file system by it).
pub fn create(path: &Path, uuid: &str, limit: u64) -> Result<()> {
    Ledger::open_or_create(path, uuid, limit).map_err(|e| match e {
        LedgerError::Io { source, .. } => {
            anyhow::Error::new(source).context(format!("cannot create ledger {}", path.display()))
        }
        e => anyhow!("cannot create ledger {}: {e}", path.display()),
    })?;
    Ok(())
}

/// True when a process holds a slot of the ledger at `path` (read-only OFD-lock test). Read as every host
/// tool reads a ledger (`Snapshot::read`: no link followed, no FIFO waited on, nothing mapped): the folder is
/// the tenant's. A ledger that cannot be read has no live users to protect.
pub fn any_slot_alive(path: &Path) -> bool {
    match Snapshot::read(path) {
        Ok(s) => s.slots.iter().any(|s| s.alive),
        Err(_) => false,
    }
}
