//! Puts the git commit the binaries are built from in `VGPU_COMMIT` (for `--version`); "unknown" outside
//! a git checkout (a source tarball, a package build from one).
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=VGPU_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself, the branch it points to, and packed-refs (works in worktrees).
    // Only the files that exist: cargo counts a missing one as changed at every build, which rebuilt this
    // crate and everything above it each time in a repository with no packed-refs. A branch packed later
    // loses its loose file, which is a change cargo sees.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
