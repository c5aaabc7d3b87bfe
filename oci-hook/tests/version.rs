//! `--version` of the hook and the shim, as run from the command line.
use std::process::Command;

const LONG: &str = vgpu_host::version::LONG;

#[test]
fn the_hook_prints_its_version_and_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-hook"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("vgpu-hook {LONG}\n")
    );
}

/// The shim passes `--version` to the lower runtime (its lines first, unchanged, and its exit status), then
/// adds one line of its own without the word Docker's parser keys on.
#[test]
fn the_shim_keeps_the_lower_runtimes_version_lines_first() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let lower = dir.path().join("fakert");
    std::fs::write(
        &lower,
        "#!/bin/sh\necho \"fakert version 9.9 $*\"\necho 'commit: abc'\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&lower, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, format!("lower_runtime = \"{}\"\n", lower.display())).unwrap();
    for flag in ["--version", "-v"] {
        let out = Command::new(env!("CARGO_BIN_EXE_vgpu-container-runtime"))
            .arg(flag)
            .env("VGPU_CONFIG", &cfg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{flag}");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[..2],
            [format!("fakert version 9.9 {flag}").as_str(), "commit: abc"]
        );
        assert_eq!(
            lines[2],
            format!("vgpu-container-runtime {LONG} over {}", lower.display())
        );
        assert!(!lines[2].contains("version"));
        assert_eq!(lines.len(), 3);
    }
}
