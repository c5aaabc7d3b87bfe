//! The ledger ("shared region"): one memory-mapped file per GPU and container, charged and refunded by every
//! process of the container without any lock on the charge/refund path.
//!
//! How it stays exact (docs/architecture.md, "The ledger", has the short version):
//!
//! * The *commit word* holds the ledger's total plus the last committed operation `(slot, kind, seq,
//!   amount, refund, gen)`. Committing an operation is one 128-bit CAS of that word; a charge's CAS is only
//!   attempted when `total + amount <= limit`, so the total can never pass the limit, whatever the timing.
//! * Each slot has one `(usage, applied_seq)` pair per kind. After the commit the operation is *applied* to
//!   its pair with a 128-bit CAS that adds the amount and increments `applied_seq`.
//! * Before committing, everybody *helps*: if the operation in the word is not applied yet (its `seq` differs
//!   from `applied_seq mod 8` of its pair), apply it. So at any instant at most one committed operation is
//!   unapplied — the one in the word — and `total == Σ usage + (that one, if unapplied)`. A process killed
//!   between commit and apply leaves nothing ambiguous: the next operation or the reclaimer finishes it.
//!   A new operation on `(slot, kind)` takes `seq = applied_seq + 1 (mod 8)`, read after helping.
//!
//! Why a helper never applies an operation twice or applies a stale one: it loads the pair `p`, checks the
//! word still holds `c`, and only then decides. The pair's `applied_seq` is a full 64-bit counter that grows
//! with every application, so a pair CAS from `p` succeeds only if the pair did not change since it was
//! loaded — i.e. it still is the state it had while the word held `c`, where `applied_seq` is either
//! `seq − 1` (unapplied: apply it) or `seq` (applied). The "applied" verdict is confirmed the same way (the
//! pair is loaded again and must be unchanged). The remaining window, a commit CAS succeeding on a word that
//! went away and came back bit-identical, is closed by the 17-bit `gen` counter in the word: it needs an
//! exact multiple of 2^17 commits, returning to the same total, slot, kind, seq and amount, while one thread
//! sits between two adjacent instructions.
//!
//! Liveness is an OFD lock per slot (see `lock`), never a PID.

mod format;
mod lock;

pub use format::{FORMAT_VERSION, KINDS, MAX_TOTAL, SLOT_COUNT};

use format::{
    pack_pair, total_of_low_half, unpack_pair, Commit, CommitArea, Header, Pair, SlotRecord, COMMIT_OFFSET, FILE_SIZE,
    HEADER_SIZE, MAGIC, SEQ_MASK, SLOTS_OFFSET, SLOT_SIZE, UUID_CAPACITY,
};
use memmap2::{MmapOptions, MmapRaw};
use portable_atomic::{AtomicU128, AtomicU64};
use serde::Serialize;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use crate::quantity::format_bytes;

/// What an amount of device memory is for; usage is kept per slot and per kind.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Context = 0,
    Module = 1,
    Data = 2,
    Array = 3,
    AsyncPool = 4,
    Vmm = 5,
    Managed = 6,
    Graph = 7,
}

impl Kind {
    pub const ALL: [Kind; KINDS] = [
        Kind::Context,
        Kind::Module,
        Kind::Data,
        Kind::Array,
        Kind::AsyncPool,
        Kind::Vmm,
        Kind::Managed,
        Kind::Graph,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Context => "context",
            Kind::Module => "module",
            Kind::Data => "data",
            Kind::Array => "array",
            Kind::AsyncPool => "async_pool",
            Kind::Vmm => "vmm",
            Kind::Managed => "managed",
            Kind::Graph => "graph",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: usize) -> Option<Kind> {
        Kind::ALL.get(i).copied()
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A charge that would take the ledger past its limit. Nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub requested: u64,
    pub used: u64,
    pub limit: u64,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU memory quota exceeded: requested {}, {} of {} already in use",
            format_bytes(self.requested),
            format_bytes(self.used),
            format_bytes(self.limit)
        )
    }
}

impl std::error::Error for Refused {}

/// A ledger file that cannot be used, or a failed operation on one. `Display` names the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("vgpu ledger {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("vgpu ledger {}: not a vgpu ledger file (magic {found:02x?}, expected \"VGPULDGR\")", path.display())]
    BadMagic { path: PathBuf, found: Vec<u8> },
    #[error("vgpu ledger {}: format version {found}; this build supports version {supported}", path.display())]
    UnsupportedVersion { path: PathBuf, found: u32, supported: u32 },
    #[error("vgpu ledger {}: truncated: {size} bytes, expected {expected}", path.display())]
    Truncated { path: PathBuf, size: u64, expected: u64 },
    #[error("vgpu ledger {}: corrupt header: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error("vgpu ledger {}: belongs to GPU {found}, not {expected}", path.display())]
    UuidMismatch {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("vgpu ledger {}: all {SLOT_COUNT} process slots are held by live processes", path.display())]
    NoFreeSlot { path: PathBuf },
    #[error("vgpu ledger {}: opened read-only", path.display())]
    ReadOnly { path: PathBuf },
    #[error("vgpu ledger {}: {what}", path.display())]
    InvalidArgument { path: PathBuf, what: String },
}

/// A point-in-time view for the monitor. Exact when nobody is charging; under load each number is a value
/// it really had, taken a few instructions apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub uuid: String,
    /// The limit recorded at provisioning (informational).
    pub limit: u64,
    pub used: u64,
    /// Slots with a live owner or leftover usage, by index.
    pub slots: Vec<SlotSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotSnapshot {
    pub index: u16,
    /// PID in the owner's own PID namespace (0: none recorded).
    pub pid: u32,
    /// Inode of the owner's PID namespace.
    pub pid_ns: u64,
    /// Someone holds the slot's lock (its owner lives).
    pub alive: bool,
    /// Bytes per kind, indexed by `Kind::index()`.
    pub usage: [u64; KINDS],
}

impl SlotSnapshot {
    pub fn total(&self) -> u64 {
        self.usage.iter().fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// The mapping and the file behind it, shared by a `Ledger` and the `Slot`s it handed out.
struct Shared {
    map: MmapRaw,
    /// This handle's own open file description: reclaim takes slot locks through it, snapshot asks GETLK.
    file: File,
    path: PathBuf,
    writable: bool,
    uuid: String,
    provisioned_limit: u64,
}

enum Op {
    Charge { bytes: u64, limit: u64 },
    Refund { bytes: u64 },
}

impl Shared {
    fn at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.map.len());
        // SAFETY: the mapping is FILE_SIZE bytes (checked before mapping) and lives as long as `self`; every
        // offset used is inside it and aligned for T (compile-time checks in format.rs; mmap is page
        // aligned). T is only ever a struct of atomics, which other processes may change at any time.
        unsafe { &*(self.map.as_ptr().add(offset) as *const T) }
    }

    fn commit_area(&self) -> &CommitArea {
        self.at(COMMIT_OFFSET)
    }

    /// The commit word as one 128-bit atomic: read-write mappings only (a 128-bit load may be a CAS).
    fn word(&self) -> &AtomicU128 {
        debug_assert!(self.writable);
        &self.commit_area().word
    }

    /// The low 64 bits of the commit word (total, slot, kind, seq), loadable from a read-only mapping.
    fn word_low(&self) -> &AtomicU64 {
        self.at(COMMIT_OFFSET)
    }

    fn word_high(&self) -> &AtomicU64 {
        self.at(COMMIT_OFFSET + 8)
    }

    fn slot(&self, index: usize) -> &SlotRecord {
        assert!(index < SLOT_COUNT);
        self.at(SLOTS_OFFSET + index * SLOT_SIZE)
    }

    fn pair(&self, slot: usize, kind: usize) -> &Pair {
        &self.slot(slot).counters[kind]
    }

    fn used(&self) -> u64 {
        total_of_low_half(self.word_low().load(SeqCst))
    }

    /// Apply the operation of commit word `c` to its counter unless it already is. Returns false when the
    /// word no longer holds `c` (the caller reloads it and tries again).
    fn help(&self, c: u128) -> bool {
        let op = Commit::decode(c);
        let pair = self.pair(op.slot as usize, op.kind as usize).as_u128();
        loop {
            let p = pair.load(SeqCst);
            if self.word().load(SeqCst) != c {
                return false;
            }
            let (usage, applied) = unpack_pair(p);
            if applied & SEQ_MASK == op.seq as u64 {
                // Applied, provided `p` is still the pair's state, i.e. its state while the word held `c`.
                if pair.load(SeqCst) == p {
                    return true;
                }
                continue;
            }
            let next = pack_pair(usage.saturating_add_signed(op.delta()), applied.wrapping_add(1));
            if pair.compare_exchange(p, next, SeqCst, SeqCst).is_ok() {
                return true;
            }
        }
    }

    /// Apply whatever operation the commit word holds.
    fn help_pending(&self) {
        let word = self.word();
        let mut c = word.load(SeqCst);
        while !self.help(c) {
            c = word.load(SeqCst);
        }
    }

    /// Commit one operation on (slot, kind) and apply it. Returns the bytes actually moved: a refund is
    /// clamped to the counter's usage, so no counter and no total ever goes below zero.
    fn commit(&self, slot: usize, kind: usize, op: &Op, apply: bool) -> Result<u64, Refused> {
        let word = self.word();
        let pair = self.pair(slot, kind).as_u128();
        let mut c = word.load(SeqCst);
        loop {
            if !self.help(c) {
                c = word.load(SeqCst);
                continue;
            }
            let cur = Commit::decode(c);
            let (usage, applied) = unpack_pair(pair.load(SeqCst));
            let (amount, refund, total) = match *op {
                Op::Charge { bytes, limit } => {
                    let cap = limit.min(MAX_TOTAL);
                    if bytes > cap || cur.total > cap - bytes {
                        return Err(Refused {
                            requested: bytes,
                            used: cur.total,
                            limit,
                        });
                    }
                    (bytes, false, cur.total + bytes)
                }
                Op::Refund { bytes } => {
                    let amount = bytes.min(usage);
                    (amount, true, cur.total.saturating_sub(amount))
                }
            };
            if amount == 0 {
                return Ok(0);
            }
            let next = Commit {
                total,
                slot: slot as u16,
                kind: kind as u8,
                seq: (applied.wrapping_add(1) & SEQ_MASK) as u8,
                amount,
                refund,
                gen: cur.next_gen(),
            }
            .encode();
            match word.compare_exchange(c, next, SeqCst, SeqCst) {
                Ok(_) => {
                    if apply {
                        self.help(next);
                    }
                    return Ok(amount);
                }
                Err(actual) => c = actual,
            }
        }
    }

    /// Give back everything a slot holds (its owner is gone or detaching) and clear its owner fields.
    /// The caller holds the slot's lock. Returns whether there was anything to reclaim.
    fn empty_slot(&self, index: usize) -> bool {
        let rec = self.slot(index);
        let mut had = rec.pid.load(SeqCst) != 0;
        self.help_pending();
        for kind in 0..KINDS {
            if let Ok(n) = self.commit(index, kind, &Op::Refund { bytes: u64::MAX }, true) {
                had |= n > 0;
            }
        }
        rec.pid.store(0, SeqCst);
        rec.pid_ns.store(0, SeqCst);
        had
    }

    /// A new open file description of the same file (even if the path has been replaced meanwhile): locks
    /// taken through it belong to it alone, not to descriptors this process shares with a forked child.
    fn new_description(&self) -> Result<OwnedFd, LedgerError> {
        let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p);
        let fd = rw(Path::new(&format!("/proc/self/fd/{}", self.file.as_raw_fd())))
            .or_else(|_| rw(&self.path))
            .map_err(io_err(&self.path))?;
        Ok(fd.into())
    }

    fn slot_usage(&self, index: usize) -> [u64; KINDS] {
        let rec = self.slot(index);
        std::array::from_fn(|k| rec.counters[k].usage.load(SeqCst))
    }
}

/// An open ledger file. `Send + Sync`; share it between threads.
pub struct Ledger {
    shared: Arc<Shared>,
}

/// A process slot claimed by `Ledger::attach`. Dropping it detaches: everything still charged to it is
/// refunded, then the lock is released.
pub struct Slot {
    index: u16,
    /// The slot's own open file description, holding the slot's OFD lock. None once detached/forgotten.
    fd: Option<OwnedFd>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.shared.path)
            .field("uuid", &self.shared.uuid)
            .finish()
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("ledger", &self.shared.path)
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LedgerError + '_ {
    move |source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Check the header of an open ledger file before anything is mapped (a truncated file must give an error,
/// never a SIGBUS). Returns the GPU uuid and the provisioned limit.
fn validate(path: &Path, file: &File) -> Result<(String, u64), LedgerError> {
    let size = file.metadata().map_err(io_err(path))?.len();
    let mut bytes = [0u8; HEADER_SIZE];
    let have = size.min(HEADER_SIZE as u64) as usize;
    file.read_exact_at(&mut bytes[..have], 0).map_err(io_err(path))?;
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
            found: bytes[..8].to_vec(),
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

/// Inode of this process's PID namespace (what `ls -l /proc/self/ns/pid` shows in brackets); 0 if unknown.
fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map(|m| m.ino()).unwrap_or(0)
}

impl Ledger {
    /// Join the ledger at `path`, creating it first if it does not exist. Any number of processes may call
    /// this at once: the file is built under a temporary name in the same folder and hard-linked into place
    /// (which fails if the name exists), so joiners only ever see a complete file. Mode 0666: the hook
    /// creates it as root and the container's processes, maybe not root, charge it; it lives in a folder
    /// only that container mounts.
    pub fn open_or_create(path: &Path, uuid: &str, limit: u64) -> Result<Ledger, LedgerError> {
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
                Err(LedgerError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            Self::create(path, uuid, limit)?;
        }
        Err(LedgerError::Io {
            path: path.to_path_buf(),
            source: io::Error::other("the file keeps disappearing"),
        })
    }

    /// Build a fresh ledger under a temporary name and link it to `path` unless someone else was first.
    fn create(path: &Path, uuid: &str, limit: u64) -> Result<(), LedgerError> {
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
        file.set_len(FILE_SIZE as u64).map_err(io_err(path))?;
        file.write_all_at(&Header::new(uuid, limit).to_bytes(), 0)
            .map_err(io_err(path))?;
        // Explicit chmod: the umask must not take write access from the container's non-root processes.
        file.set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(io_err(path))?;
        match std::fs::hard_link(tmp.path(), path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()), // another process won; join its file
            Err(e) => Err(io_err(path)(e)),
        }
    }

    /// Join an existing, valid ledger for charging.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        Self::map(path, file, true)
    }

    /// The monitor's view: snapshots and `used()` only. Never writes to the file and never takes a lock
    /// (liveness is asked with F_OFD_GETLK), so it cannot disturb the container.
    pub fn open_readonly(path: &Path) -> Result<Ledger, LedgerError> {
        let file = File::open(path).map_err(io_err(path))?;
        Self::map(path, file, false)
    }

    fn map(path: &Path, file: File, writable: bool) -> Result<Ledger, LedgerError> {
        let (uuid, provisioned_limit) = validate(path, &file)?;
        let mut options = MmapOptions::new();
        options.len(FILE_SIZE);
        let map = if writable {
            options.map_raw(&file)
        } else {
            options.map_raw_read_only(&file)
        }
        .map_err(io_err(path))?;
        let shared = Shared {
            map,
            file,
            path: path.to_path_buf(),
            writable,
            uuid,
            provisioned_limit,
        };
        Ok(Ledger {
            shared: Arc::new(shared),
        })
    }

    fn require_writable(&self) -> Result<(), LedgerError> {
        if self.shared.writable {
            Ok(())
        } else {
            Err(LedgerError::ReadOnly {
                path: self.shared.path.clone(),
            })
        }
    }

    /// Claim a free slot for this process: an OFD write lock on the slot's byte range through a new open
    /// file description of its own. A slot whose lock can be taken has no live owner; whatever a dead owner
    /// left in it is refunded before it is handed out. A process killed while claiming just drops the lock.
    pub fn attach(&self) -> Result<Slot, LedgerError> {
        self.require_writable()?;
        let shared = &self.shared;
        let path = &shared.path;
        let fd = shared.new_description()?;
        let pid = std::process::id();
        let pid_ns = own_pid_namespace();
        // First pass: slots that look free (no recorded owner); second: every slot, dead owners included.
        for pass in 0..2 {
            for index in 0..SLOT_COUNT {
                let rec = shared.slot(index);
                if pass == 0 && rec.pid.load(SeqCst) != 0 {
                    continue;
                }
                if !lock::try_lock_slot(&fd, index).map_err(io_err(path))? {
                    continue;
                }
                shared.empty_slot(index);
                rec.pid_ns.store(pid_ns, SeqCst);
                rec.pid.store(pid, SeqCst);
                rec.claims.fetch_add(1, SeqCst);
                return Ok(Slot {
                    index: index as u16,
                    fd: Some(fd),
                    shared: Arc::clone(shared),
                });
            }
        }
        Err(LedgerError::NoFreeSlot { path: path.clone() })
    }

    /// Charge `bytes` of `kind` to `slot` unless the ledger's total would pass `limit`. Lock-free.
    pub fn charge(&self, slot: &Slot, kind: Kind, bytes: u64, limit: u64) -> Result<(), Refused> {
        debug_assert!(Arc::ptr_eq(&self.shared, &slot.shared) || self.shared.path == slot.shared.path);
        if bytes == 0 {
            return Ok(());
        }
        slot.shared
            .commit(slot.index as usize, kind.index(), &Op::Charge { bytes, limit }, true)
            .map(|_| ())
    }

    /// Give back `bytes` of `kind` charged to `slot`; never more than the slot holds of that kind.
    pub fn refund(&self, slot: &Slot, kind: Kind, bytes: u64) {
        debug_assert!(Arc::ptr_eq(&self.shared, &slot.shared) || self.shared.path == slot.shared.path);
        let _ = slot
            .shared
            .commit(slot.index as usize, kind.index(), &Op::Refund { bytes }, true);
    }

    /// Bytes charged in the whole ledger now (one atomic load).
    pub fn used(&self) -> u64 {
        self.shared.used()
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

    /// Refund the usage of every slot whose owner is dead and clear it. Returns how many slots had anything
    /// to reclaim. Safe to run at any time, by any number of processes at once.
    pub fn reclaim_dead(&self) -> Result<usize, LedgerError> {
        self.require_writable()?;
        let shared = &self.shared;
        // Locks through a description of our own: were this process killed while holding one, a forked
        // child sharing `shared.file` must not keep the slot looking alive.
        let fd = shared.new_description()?;
        shared.help_pending();
        let mut reclaimed = 0;
        for index in 0..SLOT_COUNT {
            let rec = shared.slot(index);
            if rec.pid.load(SeqCst) == 0 && shared.slot_usage(index).iter().all(|&u| u == 0) {
                continue;
            }
            if !lock::try_lock_slot(&fd, index).map_err(io_err(&shared.path))? {
                continue; // alive, or being claimed or reclaimed right now
            }
            if shared.empty_slot(index) {
                reclaimed += 1;
            }
            lock::unlock_slot(&fd, index).map_err(io_err(&shared.path))?;
        }
        Ok(reclaimed)
    }

    /// Usage per slot and kind, the total and the liveness of each slot in use. Reads only.
    pub fn snapshot(&self) -> Snapshot {
        let shared = &self.shared;
        // The commit word through two 64-bit loads (a 128-bit load could write); retry until consistent.
        let mut pending = None;
        let mut used = 0;
        for _ in 0..64 {
            let lo = shared.word_low().load(SeqCst);
            let hi = shared.word_high().load(SeqCst);
            if shared.word_low().load(SeqCst) == lo {
                let c = Commit::decode(lo as u128 | (hi as u128) << 64);
                used = c.total;
                pending = Some(c);
                break;
            }
            used = total_of_low_half(lo);
        }
        let mut slots = Vec::new();
        for index in 0..SLOT_COUNT {
            let rec = shared.slot(index);
            let pid = rec.pid.load(SeqCst);
            let mut usage = shared.slot_usage(index);
            // Count the operation in the word if it is not applied yet, so that Σ usage == used.
            if let Some(c) = pending.filter(|c| c.slot as usize == index) {
                let applied = rec.counters[c.kind as usize].applied.load(SeqCst);
                if applied & SEQ_MASK != c.seq as u64 {
                    let u = &mut usage[c.kind as usize];
                    *u = u.saturating_add_signed(c.delta());
                }
            }
            if pid == 0 && usage.iter().all(|&u| u == 0) {
                continue;
            }
            let alive = lock::slot_is_locked(&shared.file, index).unwrap_or(false);
            slots.push(SlotSnapshot {
                index: index as u16,
                pid,
                pid_ns: rec.pid_ns.load(SeqCst),
                alive,
                usage,
            });
        }
        Snapshot {
            uuid: shared.uuid.clone(),
            limit: shared.provisioned_limit,
            used,
            slots,
        }
    }

    #[cfg(test)]
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Slot {
    pub fn index(&self) -> u16 {
        self.index
    }

    /// In a forked child: close the inherited descriptor without refunding anything (the parent still owns
    /// the slot and its usage). Without this the child would keep the parent's lock alive after the parent
    /// died. The child attaches a slot of its own.
    pub fn forget_after_fork(mut self) {
        drop(self.fd.take());
    }

    /// Test hook: commit an operation but do not apply it, as a process killed between the two steps would.
    #[cfg(test)]
    fn commit_unapplied(&self, kind: Kind, bytes: u64, refund: bool) {
        let op = if refund {
            Op::Refund { bytes }
        } else {
            Op::Charge {
                bytes,
                limit: MAX_TOTAL,
            }
        };
        self.shared
            .commit(self.index as usize, kind.index(), &op, false)
            .unwrap();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            self.shared.empty_slot(self.index as usize);
            drop(fd); // releases the lock
        }
    }
}

// The library shares one Ledger and its Slot between all threads of a process.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Ledger>();
    send_sync::<Slot>();
};

#[cfg(test)]
mod tests;
