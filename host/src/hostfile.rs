//! Host-side reads of the state files a tenant can reach: never following a symbolic link, never blocking,
//! never opening anything but a regular file of a plausible size, and reading into memory (no mapping).
//! Not here: what the bytes mean ([`read_ledger`] and [`load_limits`] only open the file this way and hand
//! it to the ledger crate: `Snapshot::from_file`, `Limits::from_slice`).
//!
//! A container's ledger folder is writable from inside the container, so where a ledger was a tenant can
//! leave a FIFO (opening it blocks until a writer comes), a device node (opening some devices does
//! something: a watchdog's arms it), or a symlink to a host file (which a root tool would read). So a name
//! is first opened with `O_PATH | O_NOFOLLOW`, which opens nothing (no FIFO wait, no device open; a symlink
//! is opened as itself); that descriptor is `fstat`ed, and only a regular file of at most `max_len` bytes is
//! then opened for reading, through the descriptor itself (`/proc/self/fd/N`, the very inode just checked,
//! whatever the name says by then), with `O_NONBLOCK | O_NOCTTY`. Its bytes are read with `pread`: a tenant
//! truncating the file under the reader gives a short read, never a SIGBUS as a mapping would.

use nix::libc;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use vgpu_ledger::limits::{Limits, LimitsError, LimitsErrorKind};
use vgpu_ledger::{LedgerError, Snapshot};

/// Largest limits file a host tool reads (`limits::MAX_LIMITS_FILE`: no larger one is written).
pub use vgpu_ledger::limits::MAX_LIMITS_FILE;

/// A regular file opened for reading by [`open_regular`].
#[derive(Debug)]
pub struct StateFile {
    file: File,
    /// The size `fstat` gave when it was opened (it may change afterwards).
    len: u64,
}

fn refused(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// What a file of mode `mode` is, when it is not a regular file.
fn not_regular(mode: u32) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFLNK => Some("is a symbolic link, which vgpu never follows here"),
        libc::S_IFIFO => Some("is a FIFO, not a regular file"),
        libc::S_IFDIR => Some("is a directory, not a regular file"),
        libc::S_IFSOCK => Some("is a socket, not a regular file"),
        libc::S_IFCHR | libc::S_IFBLK => Some("is a device node, not a regular file"),
        _ => Some("is not a regular file"),
    }
}

/// Opens `path` for reading if it is a regular file of at most `max_len` bytes, without following a link
/// and without blocking (see the module's header). Errors are one line without the path (callers name it).
pub fn open_regular(path: &Path, max_len: u64) -> io::Result<StateFile> {
    let file = open_checked(path, OpenOptions::new().read(true), |meta| {
        (meta.len() > max_len).then(|| {
            format!(
                "is {} bytes, more than such a file can be ({max_len})",
                meta.len()
            )
        })
    })?;
    let len = file.metadata()?.len();
    Ok(StateFile { file, len })
}

/// The shared part of [`open_regular`] and [`open_regular_for_update`]: `path`'s inode by name without
/// following a link (O_PATH), refused unless it is a regular file and `refuse` finds nothing wrong with
/// it, then opened with `how` through `/proc/self/fd` (without blocking) and checked to be the same inode.
fn open_checked(
    path: &Path,
    how: &mut OpenOptions,
    refuse: impl FnOnce(&std::fs::Metadata) -> Option<String>,
) -> io::Result<File> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| refused("contains a NUL byte"))?;
    // SAFETY: open with a valid C string; O_PATH opens nothing but the name itself.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just opened here and nothing else owns it.
    let handle = unsafe { OwnedFd::from_raw_fd(raw) };
    let meta = File::from(handle.try_clone()?).metadata()?;
    if let Some(what) = not_regular(meta.mode()) {
        return Err(refused(what));
    }
    if let Some(what) = refuse(&meta) {
        return Err(refused(&what));
    }
    // The inode checked above, opened (an O_PATH descriptor can neither read nor write).
    let file = how
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))?;
    let again = file.metadata()?;
    if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) || not_regular(again.mode()).is_some()
    {
        return Err(refused("changed while being opened"));
    }
    Ok(file)
}

impl StateFile {
    /// The open file (read-only; for `pread` and lock queries).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the file from the start with `pread` until end of file, at most `max_len` bytes; a file that
    /// has grown past `max_len` since it was opened is an error.
    pub fn read_to_vec(&self, max_len: u64) -> io::Result<Vec<u8>> {
        let buf = self.read_prefix(max_len.saturating_add(1))?;
        if buf.len() as u64 > max_len {
            return Err(refused(&format!(
                "grew past {max_len} bytes while being read"
            )));
        }
        Ok(buf)
    }

    /// The file's first `n` bytes (fewer if it is shorter), read with `pread`.
    pub fn read_prefix(&self, n: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n.min(self.len.saturating_add(1).max(4096)) as usize];
        let mut have = 0;
        while have < buf.len() {
            match self.file.read_at(&mut buf[have..], have as u64) {
                Ok(0) => break,
                Ok(k) => have += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // The file may have grown since fstat: read on, up to `n`.
            if have == buf.len() && (buf.len() as u64) < n {
                buf.resize((buf.len() * 2).min(n as usize), 0);
            }
        }
        buf.truncate(have);
        Ok(buf)
    }
}

/// Opens `path` for writing in place (`pwrite`) if it is a regular file of exactly `len` bytes with a
/// single link, without following a link and without blocking, as [`open_regular`] opens for reading:
/// the time-quanta arbiter's turn words in a container's ledger (`crate::turn_write`). A hard link the
/// tenant made in its folder to another file is refused by its link count. Errors are one line
/// without the path (callers name it).
pub fn open_regular_for_update(path: &Path, len: u64) -> io::Result<File> {
    open_checked(path, OpenOptions::new().write(true), |meta| {
        (meta.len() != len || meta.nlink() != 1).then(|| {
            format!(
                "is {} bytes with {} links, not a file of {len} bytes with one",
                meta.len(),
                meta.nlink()
            )
        })
    })
}

/// The whole of the regular file at `path`, at most `max_len` bytes (see [`open_regular`]).
pub fn read_regular(path: &Path, max_len: u64) -> io::Result<Vec<u8>> {
    open_regular(path, max_len)?.read_to_vec(max_len)
}

/// Reads and validates a limits file from the host (the garbage collector, vgpuctl, provisioning): as
/// [`Limits::load`], but opened as every host-side read of state is (see the module's header).
pub fn load_limits(path: &Path) -> Result<Limits, LimitsError> {
    let err = |kind| LimitsError {
        path: path.to_path_buf(),
        kind,
    };
    let bytes = read_regular(path, MAX_LIMITS_FILE).map_err(|e| err(LimitsErrorKind::Io(e)))?;
    Limits::from_slice(&bytes).map_err(err)
}

/// Reads the ledger at `path` as a host tool must (`vgpuctl status`, the garbage collector, the monitor):
/// opened as every host-side read of state is (see the module's header: never a link followed, never
/// blocking, any size opens and the header check names a wrong one), then read with `pread`, never mapped
/// (`Snapshot::from_file`). A FIFO, a link, a device or a file of the wrong size is an error naming the
/// file and what it is; no error shows the file's bytes.
pub fn read_ledger(path: &Path) -> Result<Snapshot, LedgerError> {
    let file = open_regular(path, u64::MAX).map_err(|source| LedgerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Snapshot::from_file(path, file.file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn reads_a_regular_file_and_refuses_everything_else_at_once() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("file"), b"hello").unwrap();
        assert_eq!(read_regular(&p("file"), 5).unwrap(), b"hello");
        let err = |n: &str| read_regular(&p(n), 1 << 20).unwrap_err().to_string();
        // A FIFO nobody writes to: a blocking open would never return.
        nix::unistd::mkfifo(&p("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        assert_eq!(err("fifo"), "is a FIFO, not a regular file");
        // A symlink to a FIFO: not followed either (following it would block).
        symlink(p("fifo"), p("to-fifo")).unwrap();
        assert!(
            err("to-fifo").contains("symbolic link"),
            "{}",
            err("to-fifo")
        );
        // A symlink to a readable file: refused, its content never read.
        symlink(p("file"), p("to-file")).unwrap();
        assert!(err("to-file").contains("symbolic link"));
        std::fs::create_dir(p("dir")).unwrap();
        assert_eq!(err("dir"), "is a directory, not a regular file");
        assert_eq!(
            read_regular(&p("file"), 4).unwrap_err().to_string(),
            "is 5 bytes, more than such a file can be (4)"
        );
        assert_eq!(
            read_regular(&p("none"), 4).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_device_node_is_never_opened() {
        let d = tempfile::tempdir().unwrap();
        let node = d.path().join("null");
        // mknod needs CAP_MKNOD (the suite runs as root); without it there is nothing to test.
        let made = nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        );
        if made.is_err() {
            eprintln!("skipped: cannot mknod here");
            return;
        }
        assert_eq!(
            read_regular(&node, 1 << 20).unwrap_err().to_string(),
            "is a device node, not a regular file"
        );
    }

    #[test]
    fn limits_files_are_read_the_same_way() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("limits.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = load_limits(&fifo).unwrap_err().to_string();
        assert!(e.contains("limits.json") && e.contains("FIFO"), "{e}");
    }

    #[test]
    fn opens_for_update_only_a_single_link_regular_file_of_the_size() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("ledger"), [0u8; 64]).unwrap();
        let f = open_regular_for_update(&p("ledger"), 64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"x", 3).unwrap();
        assert_eq!(std::fs::read(p("ledger")).unwrap()[3], b'x');
        let err = |n: &str, len| open_regular_for_update(&p(n), len).unwrap_err();
        assert_eq!(err("ledger", 65).kind(), io::ErrorKind::InvalidData);
        nix::unistd::mkfifo(&p("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        assert_eq!(err("fifo", 0).to_string(), "is a FIFO, not a regular file");
        symlink(p("ledger"), p("link")).unwrap();
        assert!(err("link", 64).to_string().contains("symbolic link"));
        // A hard link (to a host file, say) has two links: refused, nothing written.
        std::fs::hard_link(p("ledger"), p("hard")).unwrap();
        assert!(err("hard", 64).to_string().contains("2 links"));
        assert!(err("ledger", 64).to_string().contains("2 links"));
        assert_eq!(err("none", 64).kind(), io::ErrorKind::NotFound);
    }
}
