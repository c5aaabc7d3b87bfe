//! The engine room's one error (`EngineError`): every way `vgpuctl runtime configure|unconfigure` (and
//! doctor's reading of the engines' files) can refuse. One enum for the room rather than one per engine
//! module: the engines share most of their refusals (a file that does not parse, a value of the wrong
//! shape, a `vgpu` entry that is not vgpu's, a bad install option), and the `ContainerEngine` trait returns
//! one type. Each variant carries what was wrong (the file, the key, the value as given); its `Display` is
//! the whole line the operator reads, and the e2e suites grep these lines, so they are kept word for word.
use crate::fsutil::FileError;
use std::path::PathBuf;

/// Why an engine's files were not (or could not be) configured.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    // --- the files as found ---
    /// A file vgpuctl was asked to edit does not parse (`syntax::parse_error` folds `msg` to one line).
    #[error("{}:{line}:{column}: cannot parse: {msg} (file left untouched)", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        msg: String,
    },
    /// A value vgpuctl reads or edits has another shape than the one it needs (`what`: the value and the
    /// shape, as `"runtimes" is not a JSON object`).
    #[error("{}: {what}", path.display())]
    Shape { path: PathBuf, what: String },
    /// An entry named `vgpu` that vgpuctl did not write (`what`: which entry; `why`: why it is not vgpu's).
    #[error("{}: {what} exists and is not vgpu's ({why}); left untouched (configure --force replaces it)", path.display())]
    Foreign {
        path: PathBuf,
        what: String,
        why: String,
    },
    /// containerd: a file read after vgpu's defines a handler `vgpu` of its own, which would win.
    #[error(
        "{}: the containerd runtime handler vgpu exists and is not vgpu's ({why}); containerd reads this file \
         after {}, so it would override vgpu's handler, and vgpuctl does not edit files it did not write: \
         remove or rename it there",
        src.display(),
        ours.display()
    )]
    ImportedForeign {
        src: PathBuf,
        why: String,
        ours: PathBuf,
    },
    /// containerd: a config `version` other than 2 and 3 (`version`: as written).
    #[error("{}: unsupported containerd config version {version} (vgpuctl knows 2 and 3)", path.display())]
    UnsupportedVersion { path: PathBuf, version: String },
    /// containerd: no `version` key (config version 1, which vgpuctl does not edit).
    #[error(
        "{}: no `version` key, so containerd reads it as config version 1, which vgpuctl does not edit; \
         add `version = 2` (containerd 1.x) after checking the file, or migrate it",
        path.display()
    )]
    NoVersion { path: PathBuf },
    /// containerd: `parent` imports a file that is not there.
    #[error(
        "{}: imports {}, which does not exist (containerd would not start); fix the imports first",
        parent.display(),
        path.display()
    )]
    MissingImport { parent: PathBuf, path: PathBuf },
    /// An import pattern that is not a glob (`err`: the glob crate's reason).
    #[error("bad import pattern {pattern}: {err}")]
    BadPattern {
        pattern: String,
        err: glob::PatternError,
    },
    /// A folder that could not be listed.
    #[error("cannot list {}: {err}", dir.display())]
    List { dir: PathBuf, err: std::io::Error },

    // --- containerd: where vgpu's handler goes ---
    /// `--drop-in` names the main config.
    #[error("--drop-in {} is the main config itself", target.display())]
    DropInIsMain { target: PathBuf },
    /// `--drop-in` asked for while vgpu's handler is in the main file.
    #[error(
        "{}: vgpu's handler is in this file (configured without --drop-in); unconfigure first, then \
         configure --drop-in",
        path.display()
    )]
    HandlerInMainFile { path: PathBuf },
    /// `--drop-in` asked for while vgpu is configured through another drop-in.
    #[error(
        "{}: vgpu is already configured through the drop-in {}; unconfigure first to move it to {}",
        path.display(),
        other.display(),
        target.display()
    )]
    OtherDropIn {
        path: PathBuf,
        other: PathBuf,
        target: PathBuf,
    },
    /// No `--drop-in` while vgpu is configured through the drop-in `drop_in`.
    #[error(
        "{}: vgpu is configured through the drop-in {}; configure with --drop-in {} (or unconfigure first to \
         move the handler into {})",
        path.display(),
        drop_in.display(),
        drop_in.display(),
        path.display()
    )]
    ConfiguredThroughDropIn { path: PathBuf, drop_in: PathBuf },
    /// containerd 1.x: `src`, read after the drop-in `target`, restates a plugin's section.
    #[error(
        "{}: restates [plugins.\"{plugin}\"] and is read after {}, and containerd 1.x (config version 2) \
         then ignores the drop-in's section; choose a --drop-in path read after it",
        src.display(),
        target.display()
    )]
    RestatesAfterDropIn {
        src: PathBuf,
        plugin: String,
        target: PathBuf,
    },
    /// containerd 1.x: `src` restates the section of the main file `main` that vgpu's handler goes in.
    #[error(
        "{}: restates [plugins.\"{plugin}\"], and containerd 1.x (config version 2) then ignores that whole \
         section of {}, where vgpuctl would add its handler; use --drop-in (a file read after this one)",
        src.display(),
        main.display()
    )]
    RestatesMain {
        src: PathBuf,
        plugin: String,
        main: PathBuf,
    },
    /// `--set-as-default`: `src`, read after the file vgpuctl writes (`target`), sets the default runtime
    /// too (`drop_in`: vgpuctl writes a drop-in, else the main file; the advice differs).
    #[error(
        "{}: sets default_runtime_name and is read after {}, so --set-as-default there would be \
         overridden; {}, or change it there",
        src.display(),
        target.display(),
        if *drop_in { "choose a --drop-in path read after it" } else { "use --drop-in (a file read after this one)" }
    )]
    DefaultOverridden {
        src: PathBuf,
        target: PathBuf,
        drop_in: bool,
    },

    // --- the options ---
    /// `--runtime-path` that does not name the shim.
    #[error("--runtime-path must name a file called {shim}, got {given:?}")]
    RuntimePathName { shim: &'static str, given: String },
    /// Podman's `--hook-path` that does not name the hook (`hook`: its name, vgpu-hook).
    #[error("--hook-path must name a file called {hook}, got {given:?}")]
    HookPathName { hook: &'static str, given: String },
    /// A relative `--hook-path`.
    #[error("--hook-path must be absolute, got {0:?}")]
    HookPathNotAbsolute(String),
    /// A `--hook-env` that is not `KEY=VALUE`.
    #[error("--hook-env wants KEY=VALUE, got {0:?}")]
    HookEnv(String),
    /// An option of other engines (`owners`: theirs, as "containerd and CRI-O").
    #[error("--{long} is for {owners} only")]
    OtherEnginesOption { long: String, owners: String },
    /// An option of another engine that the engine named refuses in its own words.
    #[error("{0}")]
    Refused(&'static str),
    /// The options did not fit the engine's clap structs.
    #[error(transparent)]
    Args(#[from] clap::Error),

    // --- vgpuctl's record ---
    /// The record was written by a vgpuctl with another record version.
    #[error("{}: record version {version} is not one this vgpuctl knows ({known}); a newer vgpuctl wrote it", path.display())]
    RecordVersion {
        path: PathBuf,
        version: u32,
        known: u32,
    },
    /// The record's path has no parent folder to lock.
    #[error("the record's path has no folder")]
    RecordFolderless,
    /// The record's folder could not be made (`env`: the variable that moves it).
    #[error("cannot create {} for vgpuctl's record (set {env} to move it): {err}", dir.display())]
    RecordDir {
        dir: PathBuf,
        env: &'static str,
        err: std::io::Error,
    },
    /// The record's folder could not be opened to lock it.
    #[error("cannot open {}: {err}", dir.display())]
    OpenFolder { dir: PathBuf, err: std::io::Error },
    /// The record's folder could not be locked.
    #[error("cannot lock {}: {err}", dir.display())]
    Lock {
        dir: PathBuf,
        err: nix::errno::Errno,
    },

    // --- applying ---
    /// Reading, writing or removing a file.
    #[error(transparent)]
    File(#[from] FileError),
    /// Writing what was done (or would be) to the terminal.
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

impl EngineError {
    /// `path: what`, a value of the wrong shape.
    pub fn shape(path: &std::path::Path, what: impl Into<String>) -> Self {
        EngineError::Shape {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }
    /// Whether this is a write to a reader that has gone (`vgpuctl runtime configure --dry-run | head`).
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, EngineError::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// The engine room's results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
