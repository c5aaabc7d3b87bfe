//! The library's one error type, turned into a CUDA or NVML return code only at the exported edge.
//! What each failure means for the caller lives here; where failures are detected does not.

use std::fmt;

use crate::ffi::{
    nvmlReturn_t, CUresult, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY,
    NVML_ERROR_UNKNOWN,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// CUDA is refused in this process: its configuration could not be read (logged once, when loaded).
    Refused,
    /// A limit applies to a device but cannot be enforced there (its UUID or its ledger is unusable).
    Unenforceable,
    /// A ledger cannot be opened or attached.
    Ledger(String),
    /// The device cannot be identified (no UUID from the driver).
    NoUuid,
    /// The quota refuses the request.
    OutOfMemory,
}

impl Error {
    /// The code a CUDA driver API caller gets. A quota that cannot be enforced fails CUDA's start, as the
    /// driver does when it cannot initialise: it never silently becomes no quota.
    pub fn cuda(&self) -> CUresult {
        match self {
            Error::OutOfMemory => CUDA_ERROR_OUT_OF_MEMORY,
            Error::Refused | Error::Unenforceable | Error::Ledger(_) | Error::NoUuid => {
                CUDA_ERROR_NOT_INITIALIZED
            }
        }
    }

    /// The code an NVML caller gets: NVML has no code for "over a quota" or "refused", only unknown.
    pub fn nvml(&self) -> nvmlReturn_t {
        NVML_ERROR_UNKNOWN
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Ledger(m) => f.write_str(m),
            Error::Refused => f.write_str("CUDA is refused in this process"),
            Error::Unenforceable => f.write_str("a limit applies but cannot be enforced"),
            Error::NoUuid => f.write_str("the driver gives no UUID for the device"),
            Error::OutOfMemory => f.write_str("over the quota"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_at_the_edge() {
        assert_eq!(Error::OutOfMemory.cuda(), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(Error::Unenforceable.cuda(), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(Error::Refused.cuda(), CUDA_ERROR_NOT_INITIALIZED);
        assert_eq!(Error::Unenforceable.nvml(), NVML_ERROR_UNKNOWN);
        assert_eq!(
            Error::Ledger("ledger x: bad magic".into()).to_string(),
            "ledger x: bad magic"
        );
    }
}
