//! Unit-test fixtures for the policies: a fake driver with one device under a quota kept in a real
//! ledger file in a temporary folder, and the process's record tables of its own.

use vgpu_ledger::Kind;

use super::common::Interposer;
use crate::driver::fake::FakeDriver;
use crate::quota::DeviceQuota;
use crate::records::Records;

pub struct World {
    pub fake: FakeDriver,
    pub rec: Records,
    pub q: &'static DeviceQuota,
    _dir: tempfile::TempDir,
}

impl World {
    /// Device 0 with a quota of `limit` bytes on a 64 GiB device.
    pub(crate) fn new(limit: u64) -> World {
        Self::with_memory(limit, vgpu_ledger::MemoryMode::Plain)
    }

    /// As `new`, the quota in memory mode `memory` (spill, oversubscribe).
    pub(crate) fn with_memory(limit: u64, memory: vgpu_ledger::MemoryMode) -> World {
        let dir = tempfile::tempdir().expect("temporary folder");
        let uuid = "GPU-00000000-0000-0000-0000-000000000001";
        let mut q =
            DeviceQuota::open(0, uuid, limit, &dir.path().join("gpu0.ledger")).expect("ledger");
        q.memory = memory;
        // Leaked like the library's own quotas, which live as long as the process.
        let q: &'static DeviceQuota = Box::leak(Box::new(q));
        let fake = FakeDriver::new(64 << 30);
        fake.quotas.borrow_mut().insert(0, Ok(q));
        World {
            fake,
            rec: Records::new(),
            q,
            _dir: dir,
        }
    }

    /// A second device `ordinal` under a quota of `limit` bytes, with a context of its own (returned
    /// with its quota; device 0's stays current).
    pub(crate) fn add_device(&self, ordinal: i32, limit: u64) -> (&'static DeviceQuota, usize) {
        let uuid = format!("GPU-00000000-0000-0000-0000-00000000000{}", ordinal + 1);
        let path = self._dir.path().join(format!("gpu{ordinal}.ledger"));
        let q = DeviceQuota::open(ordinal, &uuid, limit, &path).expect("ledger");
        let q: &'static DeviceQuota = Box::leak(Box::new(q));
        self.fake.quotas.borrow_mut().insert(ordinal, Ok(q));
        let ctx = crate::driver::fake::handle();
        self.fake.ctx_devices.borrow_mut().insert(ctx, ordinal);
        (q, ctx)
    }

    pub(crate) fn interposer(&self) -> Interposer<'_, FakeDriver> {
        Interposer {
            drv: &self.fake,
            rec: &self.rec,
        }
    }

    /// The container's usage of the device (all kinds).
    pub(crate) fn used(&self) -> u64 {
        self.q.used()
    }

    pub(crate) fn usage(&self, kind: Kind) -> u64 {
        self.q.usage_of(kind)
    }
}
