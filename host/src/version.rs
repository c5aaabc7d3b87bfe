//! The version every vgpu binary prints: the package version and the git commit it was built from
//! (`build.rs`).

/// The git commit (12 hex digits), or "unknown".
pub const COMMIT: &str = env!("VGPU_COMMIT");

/// `0.1.0 (commit 0123456789ab)`: what clap prints after the program's name for `--version`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VGPU_COMMIT"),
    ")"
);

#[cfg(test)]
mod tests {
    #[test]
    fn names_version_and_commit() {
        assert!(super::LONG.starts_with(env!("CARGO_PKG_VERSION")));
        let commit = super::LONG
            .split("(commit ")
            .nth(1)
            .unwrap()
            .trim_end_matches(')');
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{commit}"
        );
    }
}
