//! The `Ledger` handle: creating, opening and validating a ledger file, and what identifies it (path, GPU
//! uuid, provisioned limit). Charging lives in `commit`, slots and reclaim in `slot`, snapshots in `view`.

use super::error::{io_err, LedgerError};
use super::fd::LedgerFd;
use super::format::{
    Header, FILE_SIZE, FORMAT_VERSION, HEADER_SIZE, MAGIC, MAX_TOTAL, UUID_CAPACITY,
};
use super::shared::Shared;
use memmap2::MmapOptions;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

/// An open ledger file. `Send + Sync`; share it between threads.
pub struct Ledger {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.shared.path)
            .field("uuid", &self.shared.uuid)
            .finish()
    }
}

/// Check the header of an open ledger file before anything is mapped (a truncated file must give an error,
/// never a SIGBUS). Returns the GPU uuid and the provisioned limit.
fn validate(path: &Path, file: &File) -> Result<(String, u64), LedgerError> {
    let size = file.metadata().map_err(io_err(path))?.len();
    let mut bytes = [0u8; HEADER_SIZE];
    let have = size.min(HEADER_SIZE as u64) as usize;
    file.read_exact_at(&mut bytes[..have], 0)
        .map_err(io_err(path))?;
    check_header(path, size, &bytes[..have])
}

/// Check a ledger's first bytes (`head`, at most `HEADER_SIZE` of them) and its size. Returns the GPU uuid
/// and the provisioned limit. No error shows the file's bytes: the file may be anything (a tenant's).
pub(super) fn check_header(
    path: &Path,
    size: u64,
    head: &[u8],
) -> Result<(String, u64), LedgerError> {
    let have = head.len().min(HEADER_SIZE);
    let mut bytes = [0u8; HEADER_SIZE];
    bytes[..have].copy_from_slice(&head[..have]);
    let truncated = |size| LedgerError::Truncated {
        path: path.to_path_buf(),
        size,
        expected: FILE_SIZE as u64,
    };
    if have < MAGIC.len() {
        return Err(truncated(size));
    }
    if bytes[..8] != MAGIC {
        return Err(LedgerError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    let h = Header::from_bytes(&bytes);
    // The version comes before any size check: another version may well have another size.
    if have >= 12 && h.version != FORMAT_VERSION {
        return Err(LedgerError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: h.version,
            supported: FORMAT_VERSION,
        });
    }
    if have < HEADER_SIZE {
        return Err(truncated(size));
    }
    let corrupt = |what: String| LedgerError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    let expect = Header::new("", 0);
    let geometry = (
        h.header_size,
        h.slot_count,
        h.slot_size,
        h.commit_offset,
        h.slots_offset,
    );
    let wanted = (
        expect.header_size,
        expect.slot_count,
        expect.slot_size,
        expect.commit_offset,
        expect.slots_offset,
    );
    if geometry != wanted {
        return Err(corrupt(format!(
            "geometry (header size, slots, slot size, commit offset, slots offset) is {geometry:?}, version 1 has {wanted:?}"
        )));
    }
    if h.file_size != FILE_SIZE as u64 {
        return Err(corrupt(format!(
            "header says the file has {} bytes, version 1 files have {FILE_SIZE}",
            h.file_size
        )));
    }
    if size < FILE_SIZE as u64 {
        return Err(truncated(size));
    }
    if size > FILE_SIZE as u64 {
        return Err(corrupt(format!(
            "file has {size} bytes, version 1 files have {FILE_SIZE}"
        )));
    }
    let len = h.uuid_len as usize;
    if len == 0 || len > UUID_CAPACITY {
        return Err(corrupt(format!("GPU uuid length {len}")));
    }
    let uuid = std::str::from_utf8(&h.uuid[..len])
        .ok()
        .filter(|u| !u.contains('\0'))
        .ok_or_else(|| corrupt("GPU uuid is not text".into()))?;
    Ok((uuid.to_string(), h.provisioned_limit))
}

fn check_uuid(path: &Path, uuid: &str) -> Result<(), LedgerError> {
    if uuid.is_empty() || uuid.len() > UUID_CAPACITY || uuid.contains('\0') {
        return Err(LedgerError::InvalidArgument {
            path: path.to_path_buf(),
            what: format!("GPU uuid {uuid:?} must be 1 to {UUID_CAPACITY} bytes without NUL"),
        });
    }
    Ok(())
}

impl Ledger {
    /// Join the ledger at `path`, creating it first if it does not exist. Any number of processes may call
    /// this at once: the file is built under a temporary name in the same folder and hard-linked into place
    /// (which fails if the name exists), so joiners only ever see a complete file. Mode 0666: the hook
    /// creates it as root and the container's processes, maybe not root, charge it; it lives in a folder
    /// only that container mounts.
    pub fn open_or_create(path: &Path, uuid: &str, limit: u64) -> Result<Ledger, LedgerError> {
        Self::open_or_create_with_mode(path, uuid, limit, 0o666)
    }

    /// As [`open_or_create`](Self::open_or_create), a file this call creates getting `mode` (the library's
    /// environment mode: 0600, for one user alone). An existing file keeps its mode.
    pub fn open_or_create_with_mode(
        path: &Path,
        uuid: &str,
        limit: u64,
        mode: u32,
    ) -> Result<Ledger, LedgerError> {
        check_uuid(path, uuid)?;
        // Informational only; a ledger holds at most MAX_TOTAL whatever the limit ("unlimited" = u64::MAX).
        let limit = limit.min(MAX_TOTAL);
        for _ in 0..16 {
            match Ledger::open(path) {
                Ok(ledger) if ledger.shared.uuid == uuid => return Ok(ledger),
                Ok(ledger) => {
                    return Err(LedgerError::UuidMismatch {
                        path: path.to_path_buf(),
                        found: ledger.shared.uuid.clone(),
                        expected: uuid.to_string(),
                    })
                }
                Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                }
                Err(e) => return Err(e),
            }
            Self::create(path, uuid, limit, mode)?;
        }
        Err(LedgerError::Io {
            path: path.to_path_buf(),
            source: io::Error::other("the file keeps disappearing"),
        })
    }

    /// Build a fresh ledger under a temporary name and link it to `path` unless someone else was first.
    fn create(path: &Path, uuid: &str, limit: u64, mode: u32) -> Result<(), LedgerError> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(io_err(path))?;
        let file = tmp.as_file();
        // Allocated for real, not sparse: on a full file system creating fails here, with an error, instead
        // of a process dying of SIGBUS later on a page of the mapping that cannot be backed.
        nix::fcntl::posix_fallocate(file, 0, FILE_SIZE as i64)
            .map_err(|e| io_err(path)(io::Error::from(e)))?;
        file.write_all_at(&Header::new(uuid, limit).to_bytes(), 0)
            .map_err(io_err(path))?;
        // Explicit chmod: the umask must not take write access from the container's non-root processes.
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io_err(path))?;
        match std::fs::hard_link(tmp.path(), path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()), // another process won; join its file
            Err(e) => Err(io_err(path)(e)),
        }
    }

    /// Join an existing, valid ledger for charging.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        Self::map(path, true)
    }

    /// The monitor's view: snapshots and `used()` only. Never writes to the file and never takes a lock
    /// (liveness is asked with F_OFD_GETLK), so it cannot disturb the container.
    pub fn open_readonly(path: &Path) -> Result<Ledger, LedgerError> {
        Self::map(path, false)
    }

    /// Maps the file; the descriptor it was opened through is closed again before this returns (the mapping
    /// keeps the file), so no descriptor of ours outlives the call.
    fn map(path: &Path, writable: bool) -> Result<Ledger, LedgerError> {
        let reopen = std::path::absolute(path).map_err(io_err(path))?;
        let file = LedgerFd::open(&reopen, writable, None).map_err(io_err(path))?;
        let (uuid, provisioned_limit) = validate(path, &file)?;
        let mut options = MmapOptions::new();
        options.len(FILE_SIZE);
        let map = if writable {
            options.map_raw(&*file)
        } else {
            options.map_raw_read_only(&*file)
        }
        .map_err(io_err(path))?;
        // The mapping is of the file validated above only if the descriptor stayed ours throughout.
        file.check().map_err(io_err(path))?;
        let shared = Shared {
            map,
            identity: file.identity(),
            path: path.to_path_buf(),
            reopen,
            writable,
            uuid,
            provisioned_limit,
        };
        Ok(Ledger {
            shared: Arc::new(shared),
        })
    }

    pub(super) fn require_writable(&self) -> Result<(), LedgerError> {
        if self.shared.writable {
            Ok(())
        } else {
            Err(LedgerError::ReadOnly {
                path: self.shared.path.clone(),
            })
        }
    }

    pub fn uuid(&self) -> String {
        self.shared.uuid.clone()
    }

    /// The limit written at creation; informational only (see docs/architecture.md).
    pub fn provisioned_limit(&self) -> u64 {
        self.shared.provisioned_limit
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    #[cfg(test)]
    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }
}
