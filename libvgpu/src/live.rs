//! Live limits: the limits file's entry for a ledger as the host's `vgpuctl update` last wrote it. The
//! protocol (the ledger's generation word around an in-place rewrite of the mounted file) is
//! `vgpu_ledger::live`'s; here only the library's side of reading it, and the watch of the read-only
//! file itself (`FileWatch`), which no tenant can hide an update from. Who follows it: `quota` (the
//! memory quota, on each allocation and memory query) and `compute` (the share's rate and window, on each
//! launch).

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

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

/// How often the mounted limits file itself is looked at, whatever the ledger's generation word says.
/// The word is in the tenant's ledger: a tenant that writes back the value its processes applied hides
/// every update behind it (issue 48: a shrink from 1 GiB to 512 MiB stayed 1 GiB, and 300 MiB more was
/// granted). The file is read-only in the container; its change time and size are the host's alone.
pub const FILE_CHECK_MS: u64 = 1000;
/// A file changed less than this long ago may still be being written by the host (an update takes
/// milliseconds): it is looked at again this long after, not read now.
const SETTLE_NS: u64 = 100_000_000;

/// One quota's watch of its limits file: when to look next and the file as last applied.
pub struct FileWatch {
    /// `clock::coarse_ms()` at which the file is looked at next; `u64::MAX`: never (nothing to follow).
    due: AtomicU64,
    /// The file as last applied (`stamp`; 0: not read since the process loaded it).
    seen: AtomicU64,
}

impl FileWatch {
    pub const fn off() -> FileWatch {
        FileWatch {
            due: AtomicU64::new(u64::MAX),
            seen: AtomicU64::new(0),
        }
    }

    /// Starts watching `file` as it is now (the file the process loaded at start): the first look is
    /// `FILE_CHECK_MS` later, and reads the file only if it changed. (Reading it at the first call put a
    /// file read and a parse inside a program's first launch.)
    pub fn start(&self, file: &Path) {
        if let Some((s, _)) = stamp(file) {
            self.seen.store(s, Relaxed);
        }
        self.due
            .store(crate::clock::coarse_ms() + FILE_CHECK_MS, Relaxed);
    }

    /// Whether the file is to be looked at now: one coarse clock read.
    #[inline]
    pub fn due(&self) -> bool {
        let due = self.due.load(Relaxed);
        due != u64::MAX && crate::clock::coarse_ms() >= due
    }

    /// The entry of the limits file at `file` for `ledger_path` when the file changed since it was last
    /// applied and is whole: not changed within `SETTLE_NS`, and the same before and after it was read.
    /// None otherwise (looked at again in `FILE_CHECK_MS`, or sooner while it settles).
    #[cold]
    pub fn changed(&self, file: &Path, ledger_path: &Path) -> Option<DeviceLimit> {
        let now = crate::clock::coarse_ms();
        self.due.store(now + FILE_CHECK_MS, Relaxed);
        let (before, age_ns) = stamp(file)?;
        if before == self.seen.load(Relaxed) {
            return None;
        }
        let soon = now + SETTLE_NS / 1_000_000;
        if age_ns < SETTLE_NS {
            self.due.store(soon, Relaxed);
            return None;
        }
        let d = entry_unbracketed(file, ledger_path);
        if stamp(file).map(|s| s.0) != Some(before) {
            self.due.store(soon, Relaxed);
            return None;
        }
        self.seen.store(before, Relaxed);
        d
    }

    /// An update was applied through the generation word: the file as it is now is the applied one.
    pub fn applied(&self, file: &Path) {
        if let Some((s, _)) = stamp(file) {
            self.seen.store(s, Relaxed);
        }
    }
}

/// The file's identity and change as the host left it (inode, size, modification and change times,
/// hashed), and how long ago it last changed (ns). None when it cannot be asked.
fn stamp(file: &Path) -> Option<(u64, u64)> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        m.ino(),
        m.dev(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
        .hash(&mut h);
    let changed_ns = (m.ctime().max(m.mtime()) as i128) * 1_000_000_000
        + i128::from(if m.ctime() >= m.mtime() {
            m.ctime_nsec()
        } else {
            m.mtime_nsec()
        });
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let age = u64::try_from(now_ns - changed_ns).unwrap_or(0);
    Some((h.finish().max(1), age))
}
