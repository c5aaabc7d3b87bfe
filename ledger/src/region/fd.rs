//! The ledger's own descriptors: opened by path, moved to a high number, tagged, and closed only when proven
//! ours. Not here: the slot's lock lifetime (`pin`: a mapping, not a descriptor), the lock calls (`lock`).
//!
//! The library lives inside applications that may close descriptors they do not know (`close_range(3, ~0U)`)
//! and reuse the numbers for their own files. So no descriptor of ours outlives the call that opened it, and
//! before a descriptor is trusted (a lock taken through it counted, the descriptor closed) it must still be
//! *ours*: the ledger file (`st_dev`/`st_ino` as recorded when the ledger was mapped) and its file position
//! our per-descriptor cookie (we never read or write through these descriptors; reads use `pread`). A
//! description, once closed, never comes back under any number, so "ours after the fact" means "ours
//! throughout". Nothing is ever reopened through `/proc/self/fd`.

use nix::libc;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Which file a descriptor refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl Identity {
    pub(super) fn of(file: &File) -> io::Result<Identity> {
        let m = file.metadata()?;
        Ok(Identity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Lowest number our descriptors are moved to: 1024, or 64 below the soft RLIMIT_NOFILE when that is lower,
/// so that cleanup loops over "the first few hundred" descriptors rarely meet one (they are short-lived
/// anyway; correctness never depends on the number).
fn high_base() -> libc::c_int {
    // SAFETY: an all-zero rlimit is a valid value and getrlimit only writes it.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit with a valid out-pointer.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    };
    soft.saturating_sub(64).clamp(3, 1024) as libc::c_int
}

/// File positions used as cookies: far past the end of any ledger (4 to 6 GiB: below every file system's
/// largest offset), unique per descriptor in this process.
const COOKIE_BASE: i64 = 1 << 32;
static NEXT_COOKIE: AtomicU64 = AtomicU64::new(0);

fn next_cookie() -> i64 {
    COOKIE_BASE + (NEXT_COOKIE.fetch_add(1, Relaxed) & ((1 << 31) - 1)) as i64
}

/// Is `fd` our description of `identity`, tagged with `cookie`?
fn is_ours(fd: RawFd, identity: Identity, cookie: i64) -> bool {
    // SAFETY: an all-zero stat is a valid value; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat and lseek(SEEK_CUR) only read the descriptor's state, whatever it is now.
    unsafe {
        libc::fstat(fd, &mut st) == 0
            && st.st_dev == identity.dev
            && st.st_ino == identity.ino
            && libc::lseek(fd, 0, libc::SEEK_CUR) == cookie
    }
}

/// A descriptor of the ledger file opened by this module. Closed on drop only if it is still ours; a number
/// the application took over is left alone.
pub(super) struct LedgerFd {
    file: ManuallyDrop<File>,
    identity: Identity,
    cookie: i64,
}

impl LedgerFd {
    /// Opens `path` (close-on-exec), tags the description, moves it to a high number. With `expect`, the file
    /// must be that one (the path may have been replaced since the ledger was mapped).
    pub(super) fn open(
        path: &Path,
        writable: bool,
        expect: Option<Identity>,
    ) -> io::Result<LedgerFd> {
        let low = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let identity = Identity::of(&low)?;
        if expect.is_some_and(|e| e != identity) {
            return Err(io::Error::other(format!(
                "{} no longer names this ledger file",
                path.display()
            )));
        }
        let cookie = next_cookie();
        // SAFETY: lseek on the descriptor we just opened; the position is never used for I/O.
        if unsafe { libc::lseek(low.as_raw_fd(), cookie, libc::SEEK_SET) } != cookie {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: F_DUPFD_CLOEXEC on our descriptor; the copy shares its description (and the cookie).
        let high = unsafe { libc::fcntl(low.as_raw_fd(), libc::F_DUPFD_CLOEXEC, high_base()) };
        let file = if high < 0 {
            low // no room up there: keep the number we got
        } else {
            let low_fd = low.into_raw_fd();
            if is_ours(low_fd, identity, cookie) {
                // SAFETY: proven ours just now; closing our own copy.
                unsafe { libc::close(low_fd) };
            }
            // SAFETY: `high` is a descriptor fcntl just made for us; nothing else owns it.
            unsafe { File::from_raw_fd(high) }
        };
        Ok(LedgerFd {
            file: ManuallyDrop::new(file),
            identity,
            cookie,
        })
    }

    /// Still our description of the ledger (not closed, or replaced, under us)?
    pub(super) fn is_ours(&self) -> bool {
        is_ours(self.file.as_raw_fd(), self.identity, self.cookie)
    }

    /// `Err` unless the descriptor is still ours: what was done through it cannot be trusted.
    pub(super) fn check(&self) -> io::Result<()> {
        if self.is_ours() {
            Ok(())
        } else {
            Err(io::Error::other(
                "the ledger's descriptor was closed or replaced by the application during the operation",
            ))
        }
    }

    pub(super) fn identity(&self) -> Identity {
        self.identity
    }
}

impl Deref for LedgerFd {
    type Target = File;
    fn deref(&self) -> &File {
        &self.file
    }
}

impl Drop for LedgerFd {
    fn drop(&mut self) {
        if self.is_ours() {
            // SAFETY: taken once, here; the File closes our own descriptor.
            drop(unsafe { ManuallyDrop::take(&mut self.file) });
        }
        // else: the number now belongs to someone else; leave it (the File is never dropped).
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn ledger_file() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [0u8; 64]).unwrap();
        (dir, path)
    }

    #[test]
    fn descriptors_are_high_tagged_and_close_on_exec() {
        let (_dir, path) = ledger_file();
        let fd = LedgerFd::open(&path, true, None).unwrap();
        assert!(fd.is_ours());
        assert!(fd.as_raw_fd() >= high_base(), "moved up to {}", high_base());
        // SAFETY: F_GETFD on our descriptor.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let again = LedgerFd::open(&path, false, Some(fd.identity())).unwrap();
        assert_ne!(again.cookie, fd.cookie);
        assert!(LedgerFd::open(&path, false, Some(Identity { dev: 0, ino: 0 })).is_err());
    }

    #[test]
    fn a_number_the_application_took_over_is_neither_trusted_nor_closed() {
        let (_dir, path) = ledger_file();
        let fd = LedgerFd::open(&path, true, None).unwrap();
        let n = fd.as_raw_fd();
        // the application closes our number and opens a pipe onto it
        let (mut r, w) = std::io::pipe().unwrap();
        // SAFETY: dup2 replaces our own descriptor `n` with the pipe's write end, as an application would.
        assert_eq!(unsafe { libc::dup2(w.as_raw_fd(), n) }, n);
        drop(w);
        assert!(!fd.is_ours());
        assert!(fd.check().is_err());
        drop(fd);
        // SAFETY: `n` is the pipe's write end now, owned here.
        let mut w = unsafe { File::from_raw_fd(n) };
        w.write_all(b"x")
            .expect("the application's descriptor must stay open");
        let mut b = [0u8];
        r.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
    }
}
