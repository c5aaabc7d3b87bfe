//! One GPU's quota in this process: the container's ledger, this process's slot in it, and the limit.
//! Charging, refunding and the measurement lock live here; which quota governs which device does not
//! (`devices`).

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use vgpu_ledger::{Kind, Ledger, Slot};

use crate::error::Error;
use crate::log;

pub struct DeviceQuota {
    pub ordinal: i32,
    pub uuid: String,
    pub limit: u64,
    ledger_path: PathBuf,
    ledger: Ledger,
    // ManuallyDrop: after fork the child takes the slot out with ptr::read and forgets it (`devices`).
    pub(crate) slot: ManuallyDrop<Slot>,
}

impl DeviceQuota {
    /// Opens (or creates, in the environment mode) the ledger at `path` and attaches a slot for this process.
    pub fn open(ordinal: i32, uuid: &str, limit: u64, path: &Path) -> Result<DeviceQuota, Error> {
        let ledger =
            Ledger::open_or_create(path, uuid, limit).map_err(|e| Error::Ledger(e.to_string()))?;
        let slot = ledger.attach().map_err(|e| Error::Ledger(e.to_string()))?;
        // Usage left by processes killed earlier goes back to the quota now.
        let _ = ledger.reclaim_dead();
        Ok(DeviceQuota {
            ordinal,
            uuid: uuid.to_string(),
            limit,
            ledger_path: path.to_path_buf(),
            ledger,
            slot: ManuallyDrop::new(slot),
        })
    }

    /// Charges before the driver call; false = the quota would be exceeded.
    pub fn charge(&self, kind: Kind, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut r = self.ledger.charge(&self.slot, kind, bytes, self.limit);
        // Refused: a killed process may still hold usage; reclaim dead slots and try once more.
        if r.is_err() && matches!(self.ledger.reclaim_dead(), Ok(n) if n > 0) {
            r = self.ledger.charge(&self.slot, kind, bytes, self.limit);
        }
        match r {
            Ok(()) => true,
            Err(_) => {
                log::warn(format_args!(
                    "quota: refused {bytes} bytes ({kind:?}) on device {} ({}): {} of {} bytes in use",
                    self.ordinal,
                    self.uuid,
                    self.ledger.used(),
                    self.limit
                ));
                false
            }
        }
    }

    /// Records memory the driver already handed out (pool or graph reservation growth found afterwards).
    pub fn charge_forced(&self, kind: Kind, bytes: u64) {
        if bytes > 0
            && self
                .ledger
                .charge(&self.slot, kind, bytes, u64::MAX)
                .is_err()
        {
            log::error(format_args!(
                "ledger full: cannot record {bytes} bytes on {}",
                self.uuid
            ));
        }
    }

    pub fn refund(&self, kind: Kind, bytes: u64) {
        if bytes > 0 {
            self.ledger.refund(&self.slot, kind, bytes);
        }
    }

    /// Serialises memory measurements (context creation) among the processes sharing this quota, so that
    /// one process's measurement does not count another's new context. A POSIX record lock on
    /// `<ledger>.measure`: released by the kernel if the holder dies, and not inherited by a fork child
    /// (an flock or OFD lock would stay held by the child's copy of the descriptor). None (measure
    /// unlocked) if the file cannot be opened.
    pub fn measure_lock(&self) -> Option<std::fs::File> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut path = self.ledger_path.clone().into_os_string();
        path.push(".measure");
        // Created 0666 whatever the umask (the container's processes may run as different users).
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
            .ok()?;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o666));
        // SAFETY: an all-zero flock is a valid value; the fields are set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_whence = libc::SEEK_SET as _;
        loop {
            // SAFETY: fcntl F_SETLKW on a descriptor we own with a valid flock; the lock goes when the File
            // is dropped (closed).
            if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLKW, &fl) } == 0 {
                return Some(f);
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
        }
    }

    /// The container's usage of this GPU (all processes).
    pub fn used(&self) -> u64 {
        self.ledger.used()
    }

    /// This process's own usage of this GPU (its slot, all kinds), from a ledger snapshot: for
    /// measurements only (it reads every slot).
    pub fn own_used(&self) -> u64 {
        let index = self.slot.index();
        self.ledger
            .snapshot()
            .slots
            .iter()
            .find(|s| s.index == index)
            .map_or(0, |s| s.total())
    }
}

#[cfg(test)]
impl DeviceQuota {
    /// The container's usage of `kind` (all slots), from a ledger snapshot.
    pub fn usage_of(&self, kind: Kind) -> u64 {
        self.ledger
            .snapshot()
            .slots
            .iter()
            .map(|s| s.usage[kind.index()])
            .sum()
    }
}
