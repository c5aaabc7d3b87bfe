//! containerd's config versions: 2 (containerd 1.x, CRI plugin `io.containerd.grpc.v1.cri`) and 3
//! (containerd 2.x, `io.containerd.cri.v1.runtime`), read from a file's `version` key, or for a file
//! vgpuctl creates, from `containerd --version` (through the `Files` seam, like the toolkit's
//! `CommandLineSource` asks the installed containerd).
use crate::engines::error::{EngineError, Result};
use crate::engines::files::Files;
use std::path::Path;
use toml_edit::DocumentMut;

pub fn cri_plugin(version: i64) -> &'static str {
    if version >= 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    }
}

pub fn version_of(path: &Path, doc: &DocumentMut) -> Result<i64> {
    match doc.get("version") {
        Some(v) => match v.as_integer() {
            Some(n @ (2 | 3)) => Ok(n),
            _ => Err(EngineError::UnsupportedVersion {
                path: path.to_path_buf(),
                version: v.to_string().trim().to_string(),
            }),
        },
        None => Err(EngineError::NoVersion {
            path: path.to_path_buf(),
        }),
    }
}

/// containerd 2.x reads version 3; 1.x (or no containerd at all) reads version 2.
pub fn installed_version(files: &dyn Files) -> i64 {
    version_for(&files.version_output("containerd").unwrap_or_default())
}

/// The config version for containerd's `--version` line.
fn version_for(text: &str) -> i64 {
    // "containerd github.com/containerd/containerd 1.6.20~ds1 ..." or "... v2.0.0 ..."
    let major = text.split_whitespace().nth(2).and_then(|v| {
        v.trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<i64>()
            .ok()
    });
    if major.unwrap_or(1) >= 2 {
        3
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::files::MemFiles;

    /// The probe goes through the seam: Debian's 1.6, upstream's 2.x, no containerd at all.
    #[test]
    fn the_installed_version_picks_the_config_version() {
        let mut f = MemFiles::default();
        assert_eq!(installed_version(&f), 2, "no containerd: version 2");
        f.versions.insert(
            "containerd".into(),
            "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n".into(),
        );
        assert_eq!(installed_version(&f), 2);
        f.versions.insert(
            "containerd".into(),
            "containerd containerd.io v2.0.0 207ad711eabd375a01713109a8a197d197ff6542\n".into(),
        );
        assert_eq!(installed_version(&f), 3);
        assert_eq!(cri_plugin(3), "io.containerd.cri.v1.runtime");
        assert_eq!(cri_plugin(2), "io.containerd.grpc.v1.cri");
    }

    #[test]
    fn only_versions_2_and_3_are_edited() {
        let v = |t: &str| version_of(Path::new("/c.toml"), &t.parse().unwrap());
        assert_eq!(v("version = 3\n").unwrap(), 3);
        assert!(matches!(v("x = 1\n"), Err(EngineError::NoVersion { .. })));
        assert!(matches!(
            v("version = 4\n"),
            Err(EngineError::UnsupportedVersion { version, .. }) if version == "4"
        ));
    }
}
