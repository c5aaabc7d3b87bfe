//! A memory quota given as a quantity, the one rule wherever an operator or a tenant writes one (the
//! config file's `default_memory_limit`, the `vgpu.io/memory-limit*` annotations, `vgpuctl update
//! --memory-limit`): a quantity (`vgpu_ledger::quantity`'s grammar, which the limit environment shares with
//! the library), greater than zero (no quota is written by leaving it out), and at least
//! `vgpu_ledger::MIN_QUOTA` (no CUDA context fits in less). Not here: the environment's grammar, where `0`
//! means no limit (`vgpu_ledger::envlimits`).

use vgpu_ledger::quantity::{check_min_quota, parse_quantity, BelowFloor, QuantityError};

/// A memory quota given as a quantity that is not one ([`parse`]). `Display` is one line naming
/// where it came from (`setting`) and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("{setting}={value:?}: {err}")]
    Quantity {
        setting: String,
        value: String,
        err: QuantityError,
    },
    #[error("{setting}={value:?}: a memory limit must be greater than zero")]
    Zero { setting: String, value: String },
    #[error("{setting}={value:?}: {err}")]
    BelowFloor {
        setting: String,
        value: String,
        err: BelowFloor,
    },
}

/// A memory quota given as a quantity: greater than zero and at least the smallest quota. `source` names
/// where it came from in the message (`default_memory_limit="1"`: ...).
pub fn parse(value: &str, source: &str) -> Result<u64, LimitError> {
    let (setting, value) = (source.to_string(), value.to_string());
    let bytes = match parse_quantity(value.trim()) {
        Ok(0) => return Err(LimitError::Zero { setting, value }),
        Ok(b) => b,
        Err(err) => {
            return Err(LimitError::Quantity {
                setting,
                value,
                err,
            })
        }
    };
    check_min_quota(bytes).map_err(|err| LimitError::BelowFloor {
        setting,
        value,
        err,
    })?;
    Ok(bytes)
}
