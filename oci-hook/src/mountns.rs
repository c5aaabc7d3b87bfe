//! Bind mounts made in a container's mount namespace before `pivot_root` (the hooks.d path: no shim ran).
//! Not here: which mounts (`crate::edits::ContainerEdits::mounts`, the same the shim writes into a spec).
//!
//! Podman, CRI-O or any runtime without the shim gets the container's state, the interposer and its
//! `ld.so.preload` this way.
//! At `createRuntime`/`prestart` the container's mount namespace exists, its rootfs is mounted at the same
//! path as on the host, and the container's process waits for the hooks. A forked child joins that
//! namespace (`setns` needs a single-threaded caller) and mounts onto targets resolved inside the rootfs
//! ([`crate::rootfs`]), so an image's symlinks cannot aim a mount at a host path.

use crate::edits::Mount;
use crate::rootfs::Rootfs;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{mount, MsFlags};
use nix::sched::{setns, CloneFlags};
use nix::sys::stat::fstat;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, pipe, ForkResult};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::rootfs::RootfsError;

/// Why the mounts could not be made. `Display` is one line; the child's error comes back as its line.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot open {path}: {err}")]
    OpenNamespace { path: String, err: std::io::Error },
    #[error("cannot join the container's mount namespace: {0}")]
    Join(Errno),
    /// One bind mount (`from` at `at`) failed.
    #[error("cannot mount {} at {at}: {err}", from.display())]
    Bind {
        from: PathBuf,
        at: String,
        err: Box<MountError>,
    },
    #[error("the mount did not land at the target (path changed while mounting?)")]
    Moved,
    #[error("cannot make the mount read-only/nosuid: {0}")]
    Remount(Errno),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// The child's line, read back from it.
    #[error("{0}")]
    Child(String),
    /// The child ended without a line (`status`: how it ended).
    #[error("mounting into container (pid {pid}) failed: {status}")]
    Failed { pid: u32, status: String },
    /// A system call failed, with the system's reason alone.
    #[error(transparent)]
    Sys(#[from] Errno),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

type Result<T, E = MountError> = std::result::Result<T, E>;

/// Makes `binds` in the mount namespace of host pid `pid`, whose rootfs is at `rootfs` (host path).
pub fn bind_into(pid: u32, rootfs: &Path, binds: &[Mount]) -> Result<()> {
    let ns_path = format!("/proc/{pid}/ns/mnt");
    let ns = std::fs::File::open(&ns_path).map_err(|err| MountError::OpenNamespace {
        path: ns_path.clone(),
        err,
    })?;
    let (rd, wr) = pipe()?;
    // SAFETY: the hook is single-threaded (no thread is ever started in it), so the child may run
    // arbitrary code; it only makes syscalls and exits.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(rd);
            let code = match child(OwnedFd::from(ns), rootfs, binds) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = std::fs::File::from(wr).write_all(e.to_string().as_bytes());
                    1
                }
            };
            // SAFETY: leave without running the parent's atexit handlers or destructors twice (nix has no
            // `_exit`; its re-export of libc does).
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            drop(wr);
            let mut msg = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut msg);
            match waitpid(child, None)? {
                WaitStatus::Exited(_, 0) => Ok(()),
                WaitStatus::Exited(_, _) if !msg.is_empty() => Err(MountError::Child(msg)),
                st => Err(MountError::Failed {
                    pid,
                    status: format!("{st:?}"),
                }),
            }
        }
    }
}

fn child(ns: OwnedFd, rootfs: &Path, binds: &[Mount]) -> Result<()> {
    setns(&ns, CloneFlags::CLONE_NEWNS).map_err(MountError::Join)?;
    std::env::set_current_dir("/")?;
    let root = Rootfs::open(rootfs)?;
    for b in binds {
        bind_one(&root, b).map_err(|err| MountError::Bind {
            from: b.source.clone(),
            at: b.destination.clone(),
            err: Box::new(err),
        })?;
    }
    Ok(())
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn bind_one(root: &Rootfs, b: &Mount) -> Result<()> {
    let src_md = std::fs::metadata(&b.source)?;
    let target = if src_md.is_dir() {
        root.mkdir_all(Path::new(&b.destination), 0o755)?
    } else {
        root.ensure_file(Path::new(&b.destination), 0o644)?
    };
    mount(
        Some(&b.source),
        fd_path(&target).as_str(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    // The old descriptor still names the covered file; reopen to reach the new mount on top of it.
    let mounted = root.open_in(Path::new(&b.destination), OFlag::O_PATH)?;
    let st = fstat(&mounted)?;
    if (st.st_dev, st.st_ino)
        != (
            std::os::unix::fs::MetadataExt::dev(&src_md),
            std::os::unix::fs::MetadataExt::ino(&src_md),
        )
    {
        return Err(MountError::Moved);
    }
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if b.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if b.noexec {
        flags |= MsFlags::MS_NOEXEC;
    }
    mount(
        None::<&str>,
        fd_path(&mounted).as_str(),
        None::<&str>,
        flags,
        None::<&str>,
    )
    .map_err(MountError::Remount)?;
    Ok(())
}
