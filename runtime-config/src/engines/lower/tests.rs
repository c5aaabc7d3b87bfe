//! NVIDIA's runtime found by its absolute path and written as vgpu's lower runtime, the rest of the file
//! kept; an operator's own lower runtime left.
#![cfg(test)]

use super::*;
use crate::engines::files::MemFiles;

const TOOLKIT: &str = "/usr/local/nvidia/toolkit/nvidia-container-runtime";

#[test]
fn the_gpu_operators_runtime_is_found_by_its_path_and_written_as_the_lower_runtime() {
    let files = MemFiles::with(&[
        (TOOLKIT, "#!/bin/sh\n"),
        (
            "/etc/vgpu/config.toml",
            "# the node's policy\ndefault_memory_limit = \"4Gi\"\n\n[monitor]\nkill = false # no kills\n",
        ),
    ]);
    let dirs = search_dirs(Some("/usr/bin:relative:/opt/bin"));
    assert_eq!(dirs.last(), Some(&PathBuf::from("/opt/bin")), "{dirs:?}");
    let (c, line) = change(&files, Path::new("/etc/vgpu/config.toml"), &dirs).unwrap();
    assert_eq!(
        c.record.as_deref(),
        Some(format!("lower_runtime = \"{TOOLKIT}\"").as_str()),
        "--dry-run notes it on stderr: not an engine's file"
    );
    let text = c.contents.unwrap();
    assert_eq!(
        text,
        format!("# the node's policy\ndefault_memory_limit = \"4Gi\"\nlower_runtime = \"{TOOLKIT}\" # vgpuctl runtime configure: NVIDIA's runtime, so its GPU injection still happens under vgpu\n\n[monitor]\nkill = false # no kills\n")
    );
    assert!(
        line.starts_with(&format!(
            "lower_runtime = \"{TOOLKIT}\" in /etc/vgpu/config.toml"
        )),
        "{line}"
    );
    // Again: nothing to change.
    let files = MemFiles::with(&[(TOOLKIT, ""), ("/etc/vgpu/config.toml", &text)]);
    assert!(change(&files, Path::new("/etc/vgpu/config.toml"), &dirs).is_none());
}

#[test]
fn runc_or_nvidias_bare_name_is_replaced_and_an_operators_choice_kept() {
    let p = Path::new("/usr/bin/nvidia-container-runtime");
    assert_eq!(
        with_lower_runtime(Some("lower_runtime = \"runc\" # default\n"), p).unwrap(),
        "lower_runtime = \"/usr/bin/nvidia-container-runtime\" # default\n"
    );
    assert!(
        with_lower_runtime(Some("lower_runtime = \"nvidia-container-runtime\"\n"), p).is_some()
    );
    assert_eq!(
        with_lower_runtime(None, p)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .split(" #")
            .next(),
        Some("lower_runtime = \"/usr/bin/nvidia-container-runtime\""),
        "no config yet: one is written"
    );
    assert!(with_lower_runtime(Some("lower_runtime = \"/usr/bin/crun\"\n"), p).is_none());
    let custom = "lower_runtime = \"/opt/nvidia/nvidia-container-runtime\"\n";
    assert!(
        with_lower_runtime(Some(custom), p).is_none(),
        "a path is the operator's"
    );
    assert!(
        with_lower_runtime(Some("lower_runtime = [\n"), p).is_none(),
        "a broken file is left"
    );
    // No NVIDIA runtime on the node: nothing.
    let files = MemFiles::with(&[("/etc/vgpu/config.toml", "")]);
    assert!(change(
        &files,
        Path::new("/etc/vgpu/config.toml"),
        &search_dirs(None)
    )
    .is_none());
}
