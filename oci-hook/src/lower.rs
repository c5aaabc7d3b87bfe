//! The lower runtime (runc, crun, nvidia-container-runtime): finding it, and running it as a child that gets
//! the engine's signals. Not here: deciding whether to exec it or run it (`crate::shim`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why the lower runtime cannot be found or run. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("lower runtime {name:?} not found or not executable (config key lower_runtime)")]
    NotFound { name: String },
    /// The name resolves to the shim itself, which would exec itself forever.
    #[error("lower runtime {name:?} is vgpu-container-runtime itself (config key lower_runtime)")]
    Itself { name: String },
    #[error(transparent)]
    Spawn(#[from] std::io::Error),
    #[error(transparent)]
    Signals(#[from] nix::errno::Errno),
}

/// Finds the lower runtime: an absolute path, or a name looked up in `PATH`. Refuses to find the shim
/// itself (which would exec itself forever).
pub fn resolve_lower(name: &str) -> Result<PathBuf, LowerError> {
    let found = if name.contains('/') {
        let p = PathBuf::from(name);
        is_executable(&p).then_some(p)
    } else {
        std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(name))
                    .find(|p| is_executable(p))
            })
            .unwrap_or(None)
    };
    let Some(p) = found else {
        return Err(LowerError::NotFound { name: name.into() });
    };
    if let (Ok(me), Ok(it)) = (
        std::fs::canonicalize("/proc/self/exe"),
        std::fs::canonicalize(&p),
    ) {
        if me == it {
            return Err(LowerError::Itself { name: name.into() });
        }
    }
    Ok(p)
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs the lower runtime as a child, passing on the signals an engine sends to its runtime, and returns
/// its exit status the way a shell reports it (128 + signal when killed).
pub fn run_child(mut cmd: std::process::Command) -> Result<i32, LowerError> {
    use nix::sys::signal::{SigSet, Signal};
    use std::os::unix::process::ExitStatusExt;
    const FORWARDED: [Signal; 7] = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
    ];
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().chain([Signal::SIGCHLD].iter()) {
        set.add(*s);
    }
    // Blocked here and taken with sigwait; the child starts with an empty mask (std resets it).
    set.thread_block()?;
    let mut child = cmd.spawn()?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        match set.wait()? {
            Signal::SIGCHLD => {
                if let Some(st) = child.try_wait()? {
                    return Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
                }
            }
            sig => {
                let _ = nix::sys::signal::kill(pid, sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_runtime_lookup() {
        assert!(resolve_lower("/bin/sh").is_ok());
        let e = resolve_lower("no-such-runtime-xyz").unwrap_err();
        assert!(
            matches!(&e, LowerError::NotFound { name } if name == "no-such-runtime-xyz"),
            "{e}"
        );
        // The line names the config key to fix.
        assert!(e.to_string().contains("lower_runtime"), "{e}");
    }
}
