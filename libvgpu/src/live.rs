//! Live limits: the limits file's entry for a ledger as the host's `vgpuctl update` last wrote it. The
//! protocol (the ledger's generation word around an in-place rewrite of the mounted file) is
//! `vgpu_ledger::live`'s; here only the library's side of reading it. Who follows it: `quota` (the
//! memory quota, on each allocation and memory query) and `compute` (the share's rate and window, on each
//! launch).

use std::path::Path;

use vgpu_ledger::live::read_stable;
use vgpu_ledger::{DeviceLimit, Ledger, Limits};

use crate::log;

/// The entry of the limits file at `file` whose ledger is `ledger_path`, read whole at the generation
/// `ledger` holds now, with that generation. None when it cannot be read now (the host is writing it, or
/// it is not whole: the next call looks again) or lists no such ledger any more.
pub fn entry(file: &Path, ledger: &Ledger, ledger_path: &Path) -> Option<(u64, DeviceLimit)> {
    match read_stable(file, || ledger.limits_generation()) {
        Ok((generation, limits)) => {
            let d = limits
                .devices
                .iter()
                .find(|d| limits.ledger_path(file, d) == ledger_path)?;
            Some((generation, d.clone()))
        }
        Err(e) => {
            log::debug(format_args!(
                "limits file {} (generation {}): {e}; read again on the next call",
                file.display(),
                ledger.limits_generation()
            ));
            None
        }
    }
}

/// The entry of the limits file at `file` whose ledger is `ledger_path`, read without the generation's
/// bracket: for a word left odd past `quota::ODD_BOUND` (an update that died half way, or a tenant putting
/// one off). The file is read-only to the tenant; a reading torn by a host still writing fails to parse
/// (None: looked at again later), and one that parses is replaced when the host's word turns even.
pub fn entry_unbracketed(file: &Path, ledger_path: &Path) -> Option<DeviceLimit> {
    match Limits::load(file) {
        Ok(limits) => limits
            .devices
            .iter()
            .find(|d| limits.ledger_path(file, d) == ledger_path)
            .cloned(),
        Err(e) => {
            log::debug(format_args!("{e}; read again later"));
            None
        }
    }
}
