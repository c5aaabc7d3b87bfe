//! Whose is the entry named `vgpu` in an engine's files: vgpuctl never clobbers one it did not write.
use super::error::EngineError;
use std::path::Path;

/// The state of an engine's `vgpu` entry (runtime, handler, drop-in or hook file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// There is none.
    Absent,
    /// vgpuctl wrote it (recognised by the binary it runs or vgpuctl's header).
    Ours,
    /// Someone else's: where it is and why it is not vgpu's.
    Foreign {
        path: std::path::PathBuf,
        why: String,
    },
}

/// The refusal for an entry named `vgpu` that vgpuctl did not write: one line, saying what it is.
pub fn foreign(path: &Path, what: &str, why: &str) -> EngineError {
    EngineError::Foreign {
        path: path.to_path_buf(),
        what: what.to_string(),
        why: why.to_string(),
    }
}
