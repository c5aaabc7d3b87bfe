//! File operations inside a container's root filesystem that can never leave it.
//! Not here: mounting (`crate::mountns`) or which paths (`vgpu_ledger::layout`).
//!
//! An image controls its own symlinks: `/etc` may point at `/host/etc`, `/usr/local` at `/`. Every path is
//! resolved with `openat2(RESOLVE_IN_ROOT)`, so symlinks (absolute or `..`) are followed as if the rootfs
//! were `/`, and new entries are created one name at a time relative to an already-resolved directory.

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, readlinkat, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, Mode, SFlag};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// What could not be done inside the rootfs. `Display` is one line naming the path as the container sees
/// it (the rootfs itself by its host path).
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot open rootfs {}: {err}", path.display())]
    OpenRootfs { path: PathBuf, err: Errno },
    #[error("cannot open {} in the container's rootfs: {err}", path.display())]
    Open { path: PathBuf, err: Errno },
    #[error("cannot read {} in the container's rootfs: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("cannot create {} in the container's rootfs: {err}", path.display())]
    Create { path: PathBuf, err: Errno },
    /// A FIFO, device, folder or link where a small file was to be read.
    #[error("{} in the container's rootfs is not a regular file", path.display())]
    NotRegular { path: PathBuf },
    #[error("{} in the container's rootfs is larger than {SMALL_FILE_MAX} bytes", path.display())]
    TooLarge { path: PathBuf },
    /// The file checked is not the file opened (replaced in between).
    #[error("{} in the container's rootfs changed while it was read", path.display())]
    Changed { path: PathBuf },
    #[error("cannot create {} in the container's rootfs: it is a symlink to the missing {}", path.display(), target.display())]
    DanglingRelative { path: PathBuf, target: PathBuf },
    #[error("too many levels of symbolic links creating {} in the container's rootfs", path.display())]
    SymlinkLoop { path: PathBuf },
    /// A target path without a parent or a file name (`what`).
    #[error("{} has no {what}", path.display())]
    Incomplete { path: PathBuf, what: &'static str },
    #[error("path {} must not contain '..'", path.display())]
    DotDot { path: PathBuf },
    /// A system call failed, with the system's reason alone.
    #[error(transparent)]
    Sys(#[from] Errno),
}

type Result<T, E = RootfsError> = std::result::Result<T, E>;

/// A container's root filesystem, held open.
pub struct Rootfs {
    fd: OwnedFd,
    path: PathBuf,
}

/// Largest file [`Rootfs::read_small_file`] reads.
const SMALL_FILE_MAX: u64 = 64 * 1024;

impl Rootfs {
    /// Opens the rootfs directory (a trusted host path).
    pub fn open(path: &Path) -> Result<Rootfs> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|err| RootfsError::OpenRootfs {
            path: path.to_path_buf(),
            err,
        })?;
        Ok(Rootfs {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The host path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `p` (absolute, as the container sees it) inside the rootfs.
    pub fn open_in(&self, p: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(self.fd.as_fd(), &relative(p), how)
    }

    /// Reads a small regular file; `None` when it does not exist. FIFOs, devices and large files are refused
    /// (an image must not be able to hang or flood the shim) before anything is opened for reading: the
    /// path is opened `O_PATH` (which opens no FIFO or device), checked with `fstat`, and only a regular
    /// file is then reopened for reading through that descriptor, so the file checked is the file read.
    pub fn read_small_file(&self, p: &Path) -> Result<Option<String>> {
        let fd = match self.open_in(p, OFlag::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => return Ok(None),
            Err(err) => return Err(open_error(p, err)),
        };
        let st = fstat(&fd)?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(RootfsError::NotRegular { path: p.into() });
        }
        if st.st_size as u64 > SMALL_FILE_MAX {
            return Err(RootfsError::TooLarge { path: p.into() });
        }
        // Reopening /proc/self/fd/N opens the inode that descriptor holds, not a path looked up again.
        let file = nix::fcntl::open(
            &PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|err| open_error(p, err))?;
        let reopened = fstat(&file)?;
        if (reopened.st_dev, reopened.st_ino) != (st.st_dev, st.st_ino) {
            return Err(RootfsError::Changed { path: p.into() });
        }
        let mut s = String::new();
        std::fs::File::from(file)
            .take(SMALL_FILE_MAX)
            .read_to_string(&mut s)
            .map_err(|err| RootfsError::Read {
                path: p.into(),
                err,
            })?;
        Ok(Some(s))
    }

    /// Creates directory `p` and its parents inside the rootfs (existing ones, symlinked or not, are
    /// followed inside the rootfs). Returns an `O_PATH` descriptor of it.
    pub fn mkdir_all(&self, p: &Path, mode: u32) -> Result<OwnedFd> {
        self.mkdir_all_depth(p, mode, 0)
    }

    fn mkdir_all_depth(&self, p: &Path, mode: u32, depth: u32) -> Result<OwnedFd> {
        if depth > 40 {
            return Err(RootfsError::SymlinkLoop { path: p.into() });
        }
        let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let mut cur = self.open_in(Path::new("/"), dir_flags)?;
        let mut prefix = PathBuf::from("/");
        let comps = names(p)?;
        for (i, name) in comps.iter().enumerate() {
            prefix.push(name);
            cur = match self.open_in(&prefix, dir_flags) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    match mkdirat(cur.as_fd(), *name, Mode::from_bits_truncate(mode)) {
                        Ok(()) => {}
                        Err(Errno::EEXIST) => {
                            // A dangling symlink: follow an absolute one from the rootfs' top.
                            let target = readlinkat(cur.as_fd(), *name)
                                .map_err(|err| create_error(&prefix, err))?;
                            let target = PathBuf::from(target);
                            if !target.is_absolute() {
                                return Err(RootfsError::DanglingRelative {
                                    path: prefix,
                                    target,
                                });
                            }
                            let rest: PathBuf = comps[i + 1..].iter().collect();
                            return self.mkdir_all_depth(
                                &clean(&target).join(rest),
                                mode,
                                depth + 1,
                            );
                        }
                        Err(err) => return Err(create_error(&prefix, err)),
                    }
                    self.open_in(&prefix, dir_flags)
                        .map_err(|err| open_error(&prefix, err))?
                }
                Err(err) => return Err(open_error(&prefix, err)),
            };
        }
        Ok(cur)
    }

    /// Makes sure a regular file exists at `p` (creating parents), for use as a bind-mount target.
    /// Returns an `O_PATH` descriptor of it.
    pub fn ensure_file(&self, p: &Path, mode: u32) -> Result<OwnedFd> {
        let incomplete = |what| RootfsError::Incomplete {
            path: p.into(),
            what,
        };
        let parent = p.parent().ok_or_else(|| incomplete("parent"))?;
        let name = p.file_name().ok_or_else(|| incomplete("file name"))?;
        // An O_PATH directory descriptor is a valid dirfd for openat(2).
        let dir = self.mkdir_all(parent, 0o755)?;
        match openat(
            dir.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        ) {
            Ok(_) | Err(Errno::EEXIST) => {}
            Err(err) => return Err(create_error(p, err)),
        }
        self.open_in(p, OFlag::O_PATH)
            .map_err(|err| open_error(p, err))
    }
}

fn open_error(p: &Path, err: Errno) -> RootfsError {
    RootfsError::Open {
        path: p.into(),
        err,
    }
}

fn create_error(p: &Path, err: Errno) -> RootfsError {
    RootfsError::Create {
        path: p.into(),
        err,
    }
}

/// `p` as a path relative to the rootfs.
fn relative(p: &Path) -> PathBuf {
    let r = p.strip_prefix("/").unwrap_or(p);
    if r.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        r.to_path_buf()
    }
}

/// `p` with `.` and `..` removed lexically, never above `/` (as the kernel does at the root).
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The plain names of `p`; `..` is refused (our own target paths never have it).
fn names(p: &Path) -> Result<Vec<&std::ffi::OsStr>> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::RootDir | Component::CurDir => None,
            _ => Some(Err(RootfsError::DotDot { path: p.into() })),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, OpenOptionsExt};

    #[test]
    fn symlinks_stay_inside_the_rootfs() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().join("outside");
        let root = host.path().join("root");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(outside.join("ld.so.preload"), "/evil.so\n").unwrap();
        // /etc -> <absolute host path>, /usr -> ../../.. : both must resolve inside the rootfs.
        symlink(&outside, root.join("etc")).unwrap();
        symlink("../../..", root.join("usr")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        assert_eq!(
            r.read_small_file(Path::new("/etc/ld.so.preload")).unwrap(),
            None
        );
        r.ensure_file(Path::new("/etc/ld.so.preload"), 0o644)
            .unwrap();
        r.ensure_file(Path::new("/usr/local/vgpu/libvgpu.so"), 0o644)
            .unwrap();
        // Created inside the rootfs, at the symlinks' in-root meaning; nothing appeared outside.
        assert!(root
            .join(outside.strip_prefix("/").unwrap())
            .join("ld.so.preload")
            .is_file());
        assert!(root.join("local/vgpu/libvgpu.so").is_file());
        assert_eq!(
            std::fs::read_to_string(outside.join("ld.so.preload")).unwrap(),
            "/evil.so\n"
        );
        assert!(!host.path().join("local").exists());
    }

    #[test]
    fn reads_regular_files_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/ld.so.preload"), "/a.so\n").unwrap();
        nix::unistd::mkfifo(&d.path().join("etc/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        let r = Rootfs::open(d.path()).unwrap();
        assert_eq!(
            r.read_small_file(Path::new("/etc/ld.so.preload"))
                .unwrap()
                .as_deref(),
            Some("/a.so\n")
        );
        assert!(matches!(
            r.read_small_file(Path::new("/etc/fifo")),
            Err(RootfsError::NotRegular { .. })
        ));
        assert_eq!(r.read_small_file(Path::new("/nope/x")).unwrap(), None);
    }

    /// Refusing a FIFO after opening it is too late: the open itself releases a writer waiting on it (and
    /// opening a device node can act on the device). Only a regular file is ever opened for reading.
    #[test]
    fn a_fifo_or_device_is_refused_without_being_opened() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        let fifo = d.path().join("etc/ld.so.preload");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        // A writer blocks in open() until somebody opens the FIFO for reading.
        let (tx, rx) = std::sync::mpsc::channel();
        let writer_path = fifo.clone();
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&writer_path);
            let _ = tx.send(f.is_ok());
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        let r = Rootfs::open(d.path()).unwrap();
        let err = r
            .read_small_file(Path::new("/etc/ld.so.preload"))
            .unwrap_err();
        assert!(matches!(err, RootfsError::NotRegular { .. }), "{err}");
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(500))
                .is_err(),
            "the FIFO was opened for reading: its waiting writer was released"
        );
        // Release the writer thread.
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&fifo)
            .unwrap();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)), Ok(true));

        // A character device (1:3, /dev/null's numbers) is refused the same way.
        let dev = d.path().join("etc/dev");
        nix::sys::stat::mknod(
            &dev,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o644),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        let err = r.read_small_file(Path::new("/etc/dev")).unwrap_err();
        assert!(matches!(err, RootfsError::NotRegular { .. }), "{err}");
    }
}
