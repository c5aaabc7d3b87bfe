//! Why the configuration cannot be loaded ([`ConfigError`]), and why a GPU cannot be placed under it
//! ([`Unplaced`]). Each `Display` is one line for the library's log; the loader's error makes CUDA refuse
//! to start in the process (`settings`), an unplaced GPU is refused (`devices`).

use std::fmt;
use std::path::PathBuf;

use vgpu_ledger::envcompute::{RequestAboveLimit, WindowError};
use vgpu_ledger::envlimits::EnvLimitError;
use vgpu_ledger::limits::LimitsError;
use vgpu_ledger::memmode::ModeError;

/// A configuration that cannot be used: CUDA is refused in the process rather than run without its limit.
#[derive(Debug)]
pub enum ConfigError {
    /// The limits file (mounted, or named by `VGPU_LIMITS_FILE`) cannot be loaded.
    LimitsFile { path: PathBuf, err: LimitsError },
    /// A malformed memory limit variable (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`).
    Memory(EnvLimitError),
    /// A malformed compute share or policy variable (`CUDA_DEVICE_SM_LIMIT[_<i>]`,
    /// `GPU_CORE_UTILIZATION_POLICY`).
    Compute(EnvLimitError),
    /// A compute request above the limit of its GPU (`CUDA_DEVICE_SM_REQUEST[_<i>]` past
    /// `CUDA_DEVICE_SM_LIMIT[_<i>]`).
    Request(RequestAboveLimit),
    /// A malformed pacing window (`VGPU_COMPUTE_WINDOW`).
    Window(WindowError),
    /// Unified-memory settings that are malformed or contradict each other.
    Mode(ModeError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::LimitsFile { path, err } => {
                write!(f, "limits file {}: {err}", path.display())
            }
            ConfigError::Memory(e) | ConfigError::Compute(e) => fmt::Display::fmt(e, f),
            ConfigError::Request(e) => fmt::Display::fmt(e, f),
            ConfigError::Window(e) => fmt::Display::fmt(e, f),
            ConfigError::Mode(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// A GPU a limit applies to that the configuration cannot place: CUDA is refused on it, never run
/// unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaced {
    /// The limits file does not list the GPU (nor, for a MIG instance, its parent).
    NotInFile {
        uuid: String,
        parent: Option<String>,
        path: PathBuf,
    },
    /// Per-GPU limits are set by index and NVML cannot tell the GPU's.
    NoIndex { uuid: String },
}

impl fmt::Display for Unplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unplaced::NotInFile { uuid, parent, path } => {
                write!(f, "{uuid}")?;
                if let Some(p) = parent {
                    write!(f, " (MIG of {p})")?;
                }
                write!(f, " is not in the limits file {}", path.display())
            }
            Unplaced::NoIndex { uuid } => write!(
                f,
                "{uuid}: NVML cannot tell its index, which {}_<i> needs",
                vgpu_ledger::keys::env::MEMORY_LIMIT
            ),
        }
    }
}
