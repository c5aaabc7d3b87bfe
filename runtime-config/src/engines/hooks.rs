//! OCI hooks.d files (the hooks 1.0.0 format read by Podman and CRI-O): they make the engine run
//! `vgpu-hook` for every container carrying a `vgpu.io/` annotation, with no shim in between.
//! One file per stage, because the hook learns its stage from its arguments.
use super::error::{EngineError, Result};
use serde_json::json;
use vgpu_host::keys::host::HOOK_BIN;
use vgpu_ledger::keys::ANNOTATION_PREFIX;

/// Podman's and CRI-O's default (vendor) hooks directory; `/etc/containers/oci/hooks.d` takes precedence
/// over it for files of the same name.
pub const DEFAULT_DIR: &str = "/usr/share/containers/oci/hooks.d";

/// The stages installed. `createRuntime` runs in the runtime namespace before `pivot_root`: the hook
/// validates the quota, provisions the container's state and bind-mounts it in; a bad quota fails the
/// container with the hook's one-line reason in runc's/crun's error. `poststop` removes the state again.
///
/// Podman's own `precreate` stage is left out on purpose: Podman 4 reports a failing precreate hook as
/// only "exit status 1", dropping the reason, and everything precreate would add (the limits in the
/// environment) the library already reads from the mounted limits file.
pub const STAGES: &[&str] = &["createRuntime", "poststop"];

/// The only environment the hook gets (never the container's: an image's `LD_PRELOAD` must not reach a
/// process running with host privileges).
pub const BASE_ENV: &str = vgpu_host::keys::host::HOOK_PATH_ENV;

fn file_name(stage: &str) -> String {
    format!("vgpu-{}.json", stage.to_ascii_lowercase())
}

/// Why a hooks.d file at one of our names is not vgpu's (None: it is): vgpu's runs a program named
/// `vgpu-hook`.
pub fn foreign_why(text: &str) -> Option<String> {
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return Some("not a JSON hook".into()),
    };
    match v["hook"]["path"].as_str() {
        Some(p) if std::path::Path::new(p).file_name() == Some(HOOK_BIN.as_ref()) => None,
        Some(p) => Some(format!("it runs {p}")),
        None => Some("it names no hook path".into()),
    }
}

/// The names of every file `files` writes (what unconfigure removes).
pub fn file_names() -> Vec<String> {
    STAGES.iter().map(|s| file_name(s)).collect()
}

/// `(file name, contents)` for each stage.
pub fn files(hook_path: &str, extra_env: &[String]) -> Result<Vec<(String, String)>> {
    if !hook_path.starts_with('/') {
        return Err(EngineError::HookPathNotAbsolute(hook_path.to_string()));
    }
    let mut env = vec![BASE_ENV.to_string()];
    for e in extra_env {
        match e.split_once('=') {
            Some((k, _))
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                if k == "PATH" {
                    env[0] = e.clone();
                } else {
                    env.push(e.clone());
                }
            }
            _ => return Err(EngineError::HookEnv(e.clone())),
        }
    }
    STAGES
        .iter()
        .map(|stage| {
            let doc = json!({
                "version": "1.0.0",
                "hook": { "path": hook_path, "args": [HOOK_BIN, stage], "env": env },
                "when": { "annotations": { annotation_pattern(): ".*" } },
                "stages": [stage],
            });
            Ok((
                file_name(stage),
                serde_json::to_string_pretty(&doc)
                    .expect("a JSON value with string keys always serialises")
                    + "\n",
            ))
        })
        .collect()
}

/// The `when.annotations` key of the hooks.d file: a regex matching every vgpu annotation
/// (`^vgpu\.io/`), made from the registry's prefix.
fn annotation_pattern() -> String {
    format!("^{}", ANNOTATION_PREFIX.replace('.', "\\."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_per_stage_with_explicit_env() {
        let f = files(
            "/usr/bin/vgpu-hook",
            &["VGPU_CONFIG=/etc/vgpu/test.toml".into()],
        )
        .unwrap();
        assert_eq!(f.len(), STAGES.len());
        for ((name, text), stage) in f.iter().zip(STAGES) {
            assert_eq!(name, &file_name(stage));
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v["version"], "1.0.0");
            assert_eq!(v["stages"], json!([stage]));
            assert_eq!(v["hook"]["args"], json!(["vgpu-hook", stage]));
            assert_eq!(
                v["hook"]["env"],
                json!([BASE_ENV, "VGPU_CONFIG=/etc/vgpu/test.toml"])
            );
            assert_eq!(v["when"]["annotations"]["^vgpu\\.io/"], ".*");
        }
        assert!(text_of(&f).contains(r#""^vgpu\\.io/": ".*""#));
    }

    fn text_of(f: &[(String, String)]) -> String {
        f.iter().map(|(_, t)| t.as_str()).collect()
    }

    /// packaging/hooks.d holds what the package installs; it must be what vgpuctl writes.
    #[test]
    fn packaged_hooks_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/hooks.d");
        for (name, text) in files("/usr/bin/vgpu-hook", &[]).unwrap() {
            let packaged = std::fs::read_to_string(dir.join(&name)).unwrap_or_default();
            assert_eq!(packaged, text, "packaging/hooks.d/{name} is stale: regenerate with `vgpuctl runtime configure --runtime=podman --hooks-dir packaging/hooks.d`");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), STAGES.len());
    }

    #[test]
    fn ours_is_the_one_running_vgpu_hook() {
        for (_, text) in files("/opt/vgpu/bin/vgpu-hook", &[]).unwrap() {
            assert_eq!(foreign_why(&text), None);
        }
        let other = r#"{"version":"1.0.0","hook":{"path":"/usr/bin/other-hook"},"when":{"always":true},"stages":["poststop"]}"#;
        assert_eq!(
            foreign_why(other).as_deref(),
            Some("it runs /usr/bin/other-hook")
        );
        assert!(foreign_why("not json").is_some());
    }

    #[test]
    fn bad_arguments() {
        assert!(files("vgpu-hook", &[]).is_err());
        assert!(files("/usr/bin/vgpu-hook", &["NOEQUALS".into()]).is_err());
        assert!(files("/usr/bin/vgpu-hook", &["=x".into()]).is_err());
        let f = files("/x", &["PATH=/opt/bin".into()]).unwrap();
        assert!(f[0].1.contains("\"PATH=/opt/bin\""));
        assert!(!f[0].1.contains(BASE_ENV));
    }
}
