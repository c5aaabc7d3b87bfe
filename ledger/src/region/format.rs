//! The bytes of a ledger file, format version 1. Identical on x86-64 and aarch64: `#[repr(C)]`, explicit
//! padding, little-endian integers (both targets are little-endian; big-endian targets do not compile), and
//! compile-time checks of every size and offset below.
//!
//! ```text
//! offset  size    what
//! 0       256     Header (magic "VGPULDGR", version, sizes, GPU uuid, provisioned limit)
//! 256     64      CommitArea: the 16-byte commit word, alone on its cache line
//! 320     64      TurnArea: the time-quanta turn of an oversubscribed GPU (`turn`)
//! 384     256×N   SlotRecord × SLOT_COUNT (1024): owner pid / pid-namespace, 8 counter pairs
//! ```
//!
//! Byte ranges locked with `fcntl` OFD locks (`lock`); they never overlap, and nothing else is locked:
//!
//! ```text
//! range                        lock                 held by
//! [0, 256)    (the header)     measurement lock     a process measuring a context creation (`measure`)
//! [256, 384)  (commit area)    none
//! [384 + 256·i, +256)          slot i's liveness    the slot's owner, for its life (`slot`)
//! [2^56, 2^56 + 2^40)          export marks         the library: a read lock of one byte per legacy CUDA
//!                              (past the file's end) IPC handle a live process of the container exported
//! ```

use portable_atomic::{AtomicU128, AtomicU32, AtomicU64};
use std::mem::{align_of, offset_of, size_of};

#[cfg(not(target_endian = "little"))]
compile_error!("the ledger format is little-endian; this target is not");

// The commit word and the counters are shared between processes through the file: a lock-based fallback
// would be process-local and silently wrong. portable-atomic only offers AtomicU128 natively where the
// instruction exists (x86-64 needs the cmpxchg16b target feature, see .cargo/config.toml).
const _: () = assert!(
    AtomicU128::is_always_lock_free(),
    "128-bit atomics must be lock-free (enable cmpxchg16b)"
);
const _: () = assert!(AtomicU64::is_always_lock_free());

pub const MAGIC: [u8; 8] = *b"VGPULDGR";
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 256;
pub const COMMIT_OFFSET: usize = 256;
pub const SLOTS_OFFSET: usize = 384;
pub const SLOT_COUNT: usize = 1024;
pub const SLOT_SIZE: usize = 256;
pub const FILE_SIZE: usize = SLOTS_OFFSET + SLOT_COUNT * SLOT_SIZE;
pub const UUID_CAPACITY: usize = 96;
/// The measurement lock's byte range: the header, which no slot lock covers (see the module's table).
/// Where the library's export marks lie (read locks of one byte each, never written, far past the file's
/// end): a legacy CUDA IPC handle exported by a live process of the container holds the byte its hash
/// names, so an import of it in the same container is known to be charged to the exporter already
/// (`libvgpu` hooks/ipc). Nothing else locks there.
pub const IPC_MARK_OFFSET: u64 = 1 << 56;
/// How many bytes the export marks span (a mark is the handle's hash modulo this).
pub const IPC_MARK_SPAN: u64 = 1 << 40;
const _: () = assert!(
    IPC_MARK_OFFSET > FILE_SIZE as u64 && IPC_MARK_OFFSET + IPC_MARK_SPAN < i64::MAX as u64
);
pub const MEASURE_LOCK_OFFSET: usize = 0;
pub const MEASURE_LOCK_LEN: usize = HEADER_SIZE;
const _: () = assert!(
    MEASURE_LOCK_OFFSET + MEASURE_LOCK_LEN <= COMMIT_OFFSET && COMMIT_OFFSET < SLOTS_OFFSET
);
/// Number of usage kinds (see `Kind`).
pub const KINDS: usize = 8;

/// Largest total (and largest single charge) a ledger can hold: 2^46 − 1 bytes (64 TiB).
pub const MAX_TOTAL: u64 = (1 << TOTAL_BITS) - 1;

/// The file header, written once at creation (in a temporary file, before the file gets its name).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    /// Bytes before the commit area.
    pub header_size: u32,
    pub file_size: u64,
    /// The limit the provisioner gave; informational (enforcement uses limits.json or the environment).
    pub provisioned_limit: u64,
    pub slot_count: u32,
    pub slot_size: u32,
    pub commit_offset: u32,
    pub slots_offset: u32,
    pub uuid_len: u32,
    pub _pad0: u32,
    pub uuid: [u8; UUID_CAPACITY],
    /// Bytes [152, 256): counters that change while the ledger lives, one area per feature, reached as
    /// atomics through the mapping (never through this struct, which is written once). Zero in a new file,
    /// so a reader that predates a field reads 0. Owners: [`MONITOR_AREA`], [`GENERATION_AREA`], [`SPILL_AREA`],
    /// [`COMPUTE_AREA`].
    pub _live: [u8; 104],
}

/// Header bytes of the monitor's counters (slot high-water mark, refusals): `(offset, len)`.
pub const MONITOR_AREA: (usize, usize) = (152, 16);
/// Header bytes of the limits generation (`crate::live`): a u64 the host's `vgpuctl update` sets to
/// `2 × updates − 1` while it rewrites the container's mounted limits file and to `2 × updates` once the
/// file is whole; the library compares it with the value it last applied (one load per allocation) and
/// re-reads the file when it moved. Zero in a file never updated (these bytes were the spill area's
/// reserved, always-zero first 8 bytes before).
pub const GENERATION_AREA: (usize, usize) = (168, 8);
/// Header bytes of the unified-memory (spill) counters.
pub const SPILL_AREA: (usize, usize) = (176, 16);
/// The spill book's commit word (`commit::Book::Spill`): the container's spilled bytes and the last
/// operation on them, encoded as the device commit word (`Commit`), 16-aligned: the whole `SPILL_AREA`.
pub const SPILL_WORD_OFFSET: usize = SPILL_AREA.0;
/// Offset inside a slot of its spill counter pair `(spilled, applied_seq)`, inside `SlotRecord::spill`.
pub const SPILL_PAIR_OFFSET: usize = offset_of!(SlotRecord, spill) + 8;
const _: () = assert!(
    SPILL_WORD_OFFSET.is_multiple_of(16)
        && SPILL_WORD_OFFSET + 16 <= SPILL_AREA.0 + SPILL_AREA.1
        && SPILL_PAIR_OFFSET.is_multiple_of(16)
        && SPILL_PAIR_OFFSET + 16 <= offset_of!(SlotRecord, spill) + 40
);
/// Header bytes of the compute share's shared state.
pub const COMPUTE_AREA: (usize, usize) = (192, 64);
const _: () = assert!(
    MONITOR_AREA.0 + MONITOR_AREA.1 == GENERATION_AREA.0
        && GENERATION_AREA.0 + GENERATION_AREA.1 == SPILL_AREA.0
        && GENERATION_AREA.0.is_multiple_of(8)
        && SPILL_AREA.0 + SPILL_AREA.1 == COMPUTE_AREA.0
        && COMPUTE_AREA.0 + COMPUTE_AREA.1 == HEADER_SIZE
        && MONITOR_AREA.0.is_multiple_of(8)
        && SPILL_AREA.0.is_multiple_of(8)
        && COMPUTE_AREA.0.is_multiple_of(64)
);

const _: () = {
    assert!(size_of::<Header>() == HEADER_SIZE);
    assert!(offset_of!(Header, magic) == 0);
    assert!(offset_of!(Header, version) == 8);
    assert!(offset_of!(Header, header_size) == 12);
    assert!(offset_of!(Header, file_size) == 16);
    assert!(offset_of!(Header, provisioned_limit) == 24);
    assert!(offset_of!(Header, slot_count) == 32);
    assert!(offset_of!(Header, slot_size) == 36);
    assert!(offset_of!(Header, commit_offset) == 40);
    assert!(offset_of!(Header, slots_offset) == 44);
    assert!(offset_of!(Header, uuid_len) == 48);
    assert!(offset_of!(Header, uuid) == 56);
    assert!(offset_of!(Header, _live) == MONITOR_AREA.0);
};

impl Header {
    pub fn new(uuid: &str, provisioned_limit: u64) -> Header {
        let mut h = Header {
            magic: MAGIC,
            version: FORMAT_VERSION,
            header_size: HEADER_SIZE as u32,
            file_size: FILE_SIZE as u64,
            provisioned_limit,
            slot_count: SLOT_COUNT as u32,
            slot_size: SLOT_SIZE as u32,
            commit_offset: COMMIT_OFFSET as u32,
            slots_offset: SLOTS_OFFSET as u32,
            uuid_len: uuid.len() as u32,
            _pad0: 0,
            uuid: [0; UUID_CAPACITY],
            _live: [0; 104],
        };
        h.uuid[..uuid.len()].copy_from_slice(uuid.as_bytes());
        h
    }

    pub fn to_bytes(self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        let mut put = |off: usize, b: &[u8]| out[off..off + b.len()].copy_from_slice(b);
        put(offset_of!(Header, magic), &self.magic);
        put(offset_of!(Header, version), &self.version.to_le_bytes());
        put(
            offset_of!(Header, header_size),
            &self.header_size.to_le_bytes(),
        );
        put(offset_of!(Header, file_size), &self.file_size.to_le_bytes());
        put(
            offset_of!(Header, provisioned_limit),
            &self.provisioned_limit.to_le_bytes(),
        );
        put(
            offset_of!(Header, slot_count),
            &self.slot_count.to_le_bytes(),
        );
        put(offset_of!(Header, slot_size), &self.slot_size.to_le_bytes());
        put(
            offset_of!(Header, commit_offset),
            &self.commit_offset.to_le_bytes(),
        );
        put(
            offset_of!(Header, slots_offset),
            &self.slots_offset.to_le_bytes(),
        );
        put(offset_of!(Header, uuid_len), &self.uuid_len.to_le_bytes());
        put(offset_of!(Header, uuid), &self.uuid);
        out
    }

    pub fn from_bytes(b: &[u8; HEADER_SIZE]) -> Header {
        let u32_at = |off: usize| u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        let u64_at = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
        Header {
            magic: b[0..8].try_into().unwrap(),
            version: u32_at(offset_of!(Header, version)),
            header_size: u32_at(offset_of!(Header, header_size)),
            file_size: u64_at(offset_of!(Header, file_size)),
            provisioned_limit: u64_at(offset_of!(Header, provisioned_limit)),
            slot_count: u32_at(offset_of!(Header, slot_count)),
            slot_size: u32_at(offset_of!(Header, slot_size)),
            commit_offset: u32_at(offset_of!(Header, commit_offset)),
            slots_offset: u32_at(offset_of!(Header, slots_offset)),
            uuid_len: u32_at(offset_of!(Header, uuid_len)),
            _pad0: 0,
            uuid: b[56..56 + UUID_CAPACITY].try_into().unwrap(),
            _live: [0; 104],
        }
    }
}

/// The commit word, alone on its cache line; the next line is the time-quanta turn (`TURN_AREA`), written
/// only while an oversubscribed GPU is contended, so slot 0 never shares a line pair with the word.
#[repr(C, align(128))]
pub struct CommitArea {
    pub word: AtomicU128,
    pub _pad: [u8; 48],
    /// Zero in a file made before the turn existed (these bytes were padding): "no arbiter".
    pub _turn: [u8; 64],
}

/// Bytes of the time-quanta turn (`turn::TurnArea`): the commit area's second cache line.
pub const TURN_AREA: (usize, usize) = (COMMIT_OFFSET + 64, 64);

const _: () = {
    assert!(size_of::<CommitArea>() == 128);
    assert!(offset_of!(CommitArea, word) == 0);
    assert!(offset_of!(CommitArea, _turn) == TURN_AREA.0 - COMMIT_OFFSET);
    assert!(TURN_AREA.0.is_multiple_of(64) && TURN_AREA.0 + TURN_AREA.1 == SLOTS_OFFSET);
    assert!(COMMIT_OFFSET.is_multiple_of(align_of::<CommitArea>()));
    assert!(COMMIT_OFFSET + size_of::<CommitArea>() == SLOTS_OFFSET);
};

/// One counter: `(usage, applied_seq)` updated together by a 128-bit CAS. `usage` is the low half (offset
/// 0), so a read-only observer can load it alone; `applied_seq` counts the operations applied to it.
#[repr(C, align(16))]
pub struct Pair {
    pub usage: AtomicU64,
    pub applied: AtomicU64,
}

impl Pair {
    /// The pair as one 128-bit atomic (usage in bits 0..64, applied_seq in bits 64..128).
    pub fn as_u128(&self) -> &AtomicU128 {
        // SAFETY: Pair is 16 bytes, 16-aligned, made only of atomics, and on a little-endian target its two
        // halves are exactly the low and high 64 bits of a u128; AtomicU128 has the same size and alignment.
        unsafe { &*(self as *const Pair as *const AtomicU128) }
    }
}

pub fn pack_pair(usage: u64, applied: u64) -> u128 {
    usage as u128 | (applied as u128) << 64
}

pub fn unpack_pair(v: u128) -> (u64, u64) {
    (v as u64, (v >> 64) as u64)
}

/// One process slot. The owner holds an OFD write lock on the slot's byte range; pid/pid_ns are what it
/// recorded when it claimed the slot (informational: liveness is the lock, never the pid).
#[repr(C, align(128))]
pub struct SlotRecord {
    /// PID of the owner in its own PID namespace; 0 when free.
    pub pid: AtomicU32,
    pub _pad0: u32,
    /// Inode of the owner's PID namespace (/proc/self/ns/pid).
    pub pid_ns: AtomicU64,
    /// How many times the slot was claimed (informational).
    pub claims: AtomicU64,
    /// Per-slot unified-memory (spill) counters; zero until that feature writes them.
    pub spill: [u8; 40],
    pub counters: [Pair; KINDS],
    /// Per-slot compute-share state; zero until that feature writes it.
    pub compute: [u8; 64],
}

const _: () = {
    assert!(size_of::<SlotRecord>() == SLOT_SIZE);
    assert!(offset_of!(SlotRecord, pid) == 0);
    assert!(offset_of!(SlotRecord, pid_ns) == 8);
    assert!(offset_of!(SlotRecord, claims) == 16);
    assert!(offset_of!(SlotRecord, counters) == 64);
    assert!(offset_of!(SlotRecord, spill) == 24);
    assert!(offset_of!(SlotRecord, compute) == 192);
    assert!(size_of::<Pair>() == 16);
    assert!(SLOTS_OFFSET.is_multiple_of(align_of::<SlotRecord>()));
};

// ---- the commit word ----------------------------------------------------------------------------------
//
// bits   0..46  total     bytes charged in the whole ledger
// bits  46..56  slot      slot of the last committed operation
// bits  56..59  kind      its kind
// bits  59..62  seq       its sequence number on (slot, kind), mod 8
// bits  62..64  zero
// bits  64..110 amount    its size in bytes
// bit   110     refund    1 = refund, 0 = charge
// bits 111..128 gen       commits mod 2^17 (ABA guard: the word never repeats within 2^17 commits)
//
// `total` lives entirely in the low 64 bits, so a read-only observer reads it with one 64-bit load.
// In memory (little-endian) the low half is the word's first 8 bytes.

pub const TOTAL_BITS: u32 = 46;
pub const SEQ_MASK: u64 = 7;
const GEN_BITS: u32 = 17;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// A decoded commit word: the total plus the last committed operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Commit {
    pub total: u64,
    pub slot: u16,
    pub kind: u8,
    pub seq: u8,
    pub amount: u64,
    pub refund: bool,
    pub gen: u32,
}

impl Commit {
    pub fn encode(&self) -> u128 {
        let lo = (self.total & MAX_TOTAL)
            | (self.slot as u64 & 0x3ff) << 46
            | (self.kind as u64 & 7) << 56
            | (self.seq as u64 & SEQ_MASK) << 59;
        let hi = (self.amount & MAX_TOTAL)
            | (self.refund as u64) << 46
            | ((self.gen & GEN_MASK) as u64) << 47;
        lo as u128 | (hi as u128) << 64
    }

    pub fn decode(v: u128) -> Commit {
        let lo = v as u64;
        let hi = (v >> 64) as u64;
        Commit {
            total: total_of_low_half(lo),
            slot: ((lo >> 46) & 0x3ff) as u16,
            kind: ((lo >> 56) & 7) as u8,
            seq: ((lo >> 59) & SEQ_MASK) as u8,
            amount: hi & MAX_TOTAL,
            refund: (hi >> 46) & 1 == 1,
            gen: ((hi >> 47) as u32) & GEN_MASK,
        }
    }

    /// The signed change this operation makes to its counter and to the total.
    pub fn delta(&self) -> i64 {
        if self.refund {
            -(self.amount as i64)
        } else {
            self.amount as i64
        }
    }

    pub fn next_gen(&self) -> u32 {
        (self.gen + 1) & GEN_MASK
    }
}

/// The total from the commit word's low 64 bits (what `used()` and read-only observers load).
pub fn total_of_low_half(lo: u64) -> u64 {
    lo & MAX_TOTAL
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn file_geometry() {
        assert_eq!(FILE_SIZE, 262_528);
        assert_eq!(SLOT_COUNT, 1 << 10); // the commit word's slot field is 10 bits
        assert_eq!(KINDS, 1 << 3);
    }

    #[test]
    fn header_bytes_are_fixed() {
        let h = Header::new("GPU-1", 0x0102030405060708);
        let b = h.to_bytes();
        assert_eq!(&b[0..8], b"VGPULDGR");
        assert_eq!(&b[8..12], &[1, 0, 0, 0]);
        assert_eq!(&b[12..16], &256u32.to_le_bytes());
        assert_eq!(&b[16..24], &(FILE_SIZE as u64).to_le_bytes());
        assert_eq!(&b[24..32], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[32..36], &1024u32.to_le_bytes());
        assert_eq!(&b[48..52], &5u32.to_le_bytes());
        assert_eq!(&b[56..61], b"GPU-1");
        assert!(b[61..].iter().all(|&x| x == 0));
        let back = Header::from_bytes(&b);
        assert_eq!(back.to_bytes(), b);
    }

    #[test]
    fn commit_word_bits() {
        let c = Commit {
            total: 5,
            slot: 1,
            kind: 2,
            seq: 3,
            amount: 9,
            refund: true,
            gen: 4,
        };
        let v = c.encode();
        assert_eq!(v as u64, 5 | 1 << 46 | 2 << 56 | 3 << 59);
        assert_eq!((v >> 64) as u64, 9 | 1 << 46 | 4 << 47);
        assert_eq!(Commit::decode(0), Commit::default());
        assert_eq!(Commit::decode(u128::MAX).total, MAX_TOTAL);
    }

    proptest! {
        #[test]
        fn commit_round_trips(total in 0..=MAX_TOTAL, slot in 0u16..1024, kind in 0u8..8, seq in 0u8..8,
                              amount in 0..=MAX_TOTAL, refund: bool, gen in 0u32..(1 << 17)) {
            let c = Commit { total, slot, kind, seq, amount, refund, gen };
            prop_assert_eq!(Commit::decode(c.encode()), c);
            prop_assert_eq!(total_of_low_half(c.encode() as u64), total);
        }

        #[test]
        fn any_word_decodes_in_range(v: u128) {
            let c = Commit::decode(v);
            prop_assert!((c.slot as usize) < SLOT_COUNT && (c.kind as usize) < KINDS && c.seq < 8);
        }
    }
}
