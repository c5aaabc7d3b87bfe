//! Reading and editing an OCI runtime spec (`config.json`) as generic JSON.
//! Not here: what vgpu adds to a spec (`crate::edits`) or what it reads from one (`crate::request::SpecFacts`).
//!
//! The spec is never deserialised into typed structs and written back: fields this crate does not model
//! (seccomp, vendor extensions, future spec versions) must survive untouched.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A spec that cannot be read or edited. `Display` is one line naming the file or the field.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    /// Not JSON (`why`: the parser's words).
    #[error("malformed {}: {why}", .origin.display())]
    NotJson { origin: PathBuf, why: String },
    #[error("malformed {}: not a JSON object", .origin.display())]
    NotAnObject { origin: PathBuf },
    #[error("config.json has no root.path")]
    NoRootPath,
    /// A field vgpu edits has another type than the spec's.
    #[error("malformed config.json: {key} is not an {expected}")]
    WrongType { key: String, expected: &'static str },
}

type Result<T, E = SpecError> = std::result::Result<T, E>;

/// A spec being read or edited.
#[derive(Debug, Clone)]
pub struct Spec(pub Value);

impl Spec {
    /// Parses `config.json` text; the error names the file.
    pub fn parse(text: &str, origin: &Path) -> Result<Spec> {
        let v: Value = serde_json::from_str(text).map_err(|e| SpecError::NotJson {
            origin: origin.to_path_buf(),
            why: e.to_string(),
        })?;
        if !v.is_object() {
            return Err(SpecError::NotAnObject {
                origin: origin.to_path_buf(),
            });
        }
        Ok(Spec(v))
    }

    /// Reads `<bundle>/config.json`.
    pub fn read_bundle(bundle: &Path) -> Result<(Spec, String)> {
        let path = bundle.join("config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(err) => return Err(SpecError::Read { path, err }),
        };
        Ok((Spec::parse(&text, &path)?, text))
    }

    /// `process.env` as (name, value) pairs, in order.
    pub fn env(&self) -> Vec<(String, String)> {
        self.0
            .pointer("/process/env")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(|kv| match kv.split_once('=') {
                        Some((k, v)) => (k.to_string(), v.to_string()),
                        None => (kv.to_string(), String::new()),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Last value of env `name` (the one a process would see).
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.env()
            .into_iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    /// The spec's annotations (string values only).
    pub fn annotations(&self) -> Vec<(String, String)> {
        annotations_of(self.0.get("annotations"))
    }

    /// Device node paths listed in `linux.devices`.
    pub fn device_paths(&self) -> Vec<String> {
        self.0
            .pointer("/linux/devices")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.get("path")?.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Destinations of the spec's `mounts`.
    pub fn mount_destinations(&self) -> Vec<String> {
        self.0
            .get("mounts")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.get("destination")?.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Host path of the container's root filesystem (`root.path`, relative to the bundle).
    pub fn rootfs(&self, bundle: &Path) -> Result<PathBuf> {
        let p = self
            .0
            .pointer("/root/path")
            .and_then(Value::as_str)
            .ok_or(SpecError::NoRootPath)?;
        Ok(if Path::new(p).is_absolute() {
            PathBuf::from(p)
        } else {
            bundle.join(p)
        })
    }

    /// Sets env `name=value` in `process.env`, replacing every earlier entry of that name.
    pub fn set_env(&mut self, name: &str, value: &str) -> Result<()> {
        let process = object_at(&mut self.0, "process")?;
        let env = array_at(process, "env")?;
        env.retain(|e| {
            e.as_str()
                .is_none_or(|s| s.split_once('=').map_or(s, |(k, _)| k) != name)
        });
        env.push(Value::String(format!("{name}={value}")));
        Ok(())
    }

    /// Appends a mount.
    pub fn add_mount(&mut self, destination: &str, source: &Path, options: &[&str]) -> Result<()> {
        let root = self.0.as_object_mut().expect("spec is an object");
        let mounts = array_at(root, "mounts")?;
        mounts.push(serde_json::json!({
            "destination": destination,
            "type": "bind",
            "source": source.to_string_lossy(),
            "options": options,
        }));
        Ok(())
    }

    /// Appends a hook to `hooks.<stage>`.
    pub fn add_hook(
        &mut self,
        stage: &str,
        path: &Path,
        args: &[&str],
        env: &[String],
    ) -> Result<()> {
        let root = self.0.as_object_mut().expect("spec is an object");
        let hooks = object_at_map(root, "hooks")?;
        let list = array_at(hooks, stage)?;
        list.push(serde_json::json!({
            "path": path.to_string_lossy(),
            "args": args,
            "env": env,
        }));
        Ok(())
    }

    /// Sets an annotation.
    pub fn set_annotation(&mut self, key: &str, value: &str) -> Result<()> {
        let root = self.0.as_object_mut().expect("spec is an object");
        object_at_map(root, "annotations")?.insert(key.into(), Value::String(value.into()));
        Ok(())
    }

    /// The spec as pretty JSON with a trailing newline.
    pub fn to_text(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.0).expect("a Value always serialises");
        s.push('\n');
        s
    }
}

/// String-valued entries of an `annotations` object.
pub fn annotations_of(v: Option<&Value>) -> Vec<(String, String)> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn object_at<'a>(v: &'a mut Value, key: &str) -> Result<&'a mut Map<String, Value>> {
    let root = v.as_object_mut().expect("spec is an object");
    object_at_map(root, key)
}

fn object_at_map<'a>(
    m: &'a mut Map<String, Value>,
    key: &str,
) -> Result<&'a mut Map<String, Value>> {
    let e = m
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if e.is_null() {
        *e = Value::Object(Map::new());
    }
    e.as_object_mut().ok_or_else(|| SpecError::WrongType {
        key: key.to_string(),
        expected: "object",
    })
}

fn array_at<'a>(m: &'a mut Map<String, Value>, key: &str) -> Result<&'a mut Vec<Value>> {
    let e = m
        .entry(key.to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    if e.is_null() {
        *e = Value::Array(Vec::new());
    }
    e.as_array_mut().ok_or_else(|| SpecError::WrongType {
        key: key.to_string(),
        expected: "array",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        Spec::parse(text, Path::new("config.json")).unwrap()
    }

    #[test]
    fn malformed_spec_is_one_line_naming_the_file() {
        let e = Spec::parse("{\"a\":", Path::new("/b/config.json")).unwrap_err();
        assert!(
            matches!(&e, SpecError::NotJson { origin, .. } if origin == Path::new("/b/config.json"))
        );
        let e = e.to_string();
        assert!(e.starts_with("malformed /b/config.json: "), "{e}");
        assert!(!e.contains('\n'));
        assert!(matches!(
            Spec::parse("[1]", Path::new("c")),
            Err(SpecError::NotAnObject { .. })
        ));
        let e = Spec::read_bundle(Path::new("/nonexistent-bundle")).unwrap_err();
        assert!(matches!(e, SpecError::Read { .. }));
        // Through anyhow (the binaries' edge) the line is the file and the system's reason.
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "cannot read /nonexistent-bundle/config.json: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn env_last_wins_and_set_env_replaces() {
        let mut s = spec(r#"{"process":{"env":["A=1","B=2","A=3","NOVALUE"]}}"#);
        assert_eq!(s.env_var("A").as_deref(), Some("3"));
        assert_eq!(s.env_var("NOVALUE").as_deref(), Some(""));
        s.set_env("A", "9").unwrap();
        assert_eq!(
            s.0["process"]["env"],
            serde_json::json!(["B=2", "NOVALUE", "A=9"])
        );
    }

    #[test]
    fn edits_keep_unknown_fields_and_order() {
        let text = r#"{"ociVersion":"1.0.2","zeta":{"x":[1,2]},"process":{"env":[],"vendor.x":true},
            "linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW"}]}},"alpha":1}"#;
        let mut s = spec(text);
        s.add_mount("/run/x", Path::new("/h/x"), &["rbind", "ro"])
            .unwrap();
        s.add_hook(
            "poststop",
            Path::new("/bin/h"),
            &["h", "poststop"],
            &["PATH=/bin".into()],
        )
        .unwrap();
        s.set_annotation("k", "v").unwrap();
        let out: Value = serde_json::from_str(&s.to_text()).unwrap();
        let orig: Value = serde_json::from_str(text).unwrap();
        assert_eq!(out["zeta"], orig["zeta"]);
        assert_eq!(out["linux"], orig["linux"]);
        assert_eq!(out["process"]["vendor.x"], true);
        let keys: Vec<_> = out.as_object().unwrap().keys().cloned().collect();
        assert_eq!(
            &keys[..5],
            &["ociVersion", "zeta", "process", "linux", "alpha"]
        );
        assert_eq!(
            out["hooks"]["poststop"][0]["env"],
            serde_json::json!(["PATH=/bin"])
        );
    }

    #[test]
    fn wrong_types_are_errors_not_panics() {
        let mut s = spec(r#"{"process":{"env":"A=1"},"mounts":{},"hooks":[]}"#);
        let wrong =
            |r: Result<()>, k: &str| matches!(r, Err(SpecError::WrongType { key, .. }) if key == k);
        assert!(wrong(s.set_env("A", "1"), "env"));
        assert!(wrong(s.add_mount("/a", Path::new("/b"), &[]), "mounts"));
        assert!(wrong(
            s.add_hook("poststop", Path::new("/h"), &[], &[]),
            "hooks"
        ));
        assert!(s.env().is_empty());
    }

    #[test]
    fn rootfs_relative_to_bundle() {
        let s = spec(r#"{"root":{"path":"rootfs"}}"#);
        assert_eq!(
            s.rootfs(Path::new("/b")).unwrap(),
            PathBuf::from("/b/rootfs")
        );
        let s = spec(r#"{"root":{"path":"/abs"}}"#);
        assert_eq!(s.rootfs(Path::new("/b")).unwrap(), PathBuf::from("/abs"));
    }

    proptest::proptest! {
        /// Whatever else a spec holds, the shim's edits leave it as it was.
        #[test]
        fn edits_never_lose_fields(
            extra in proptest::collection::btree_map("[a-zA-Z.]{1,12}", proptest::prelude::any::<i64>(), 0..8),
            env in proptest::collection::vec("[A-Z]{1,6}=[a-z0-9]{0,6}", 0..6),
        ) {
            let mut v = serde_json::json!({"process": {"env": env.clone()}});
            for (k, x) in &extra {
                if k != "process" && k != "mounts" && k != "hooks" && k != "annotations" {
                    v[k] = serde_json::json!({"n": x, "list": [x, "s"]});
                }
            }
            let before = v.clone();
            let mut s = Spec(v);
            s.set_env("VGPU_LIMITS_FILE", "/run/vgpu/limits.json").unwrap();
            s.add_mount("/run/vgpu/limits.json", Path::new("/h/l"), &["rbind", "ro"]).unwrap();
            s.add_hook("poststop", Path::new("/h/hook"), &["vgpu-hook", "poststop"], &[]).unwrap();
            s.set_annotation("vgpu.io/provisioned-by", "x").unwrap();
            let after: Value = serde_json::from_str(&s.to_text()).unwrap();
            for (k, x) in before.as_object().unwrap() {
                if k != "process" {
                    proptest::prop_assert_eq!(&after[k], x);
                }
            }
            let kept: Vec<String> = env.iter().filter(|e| !e.starts_with("VGPU_LIMITS_FILE=")).cloned().collect();
            let new_env: Vec<String> = serde_json::from_value(after["process"]["env"].clone()).unwrap();
            proptest::prop_assert_eq!(&new_env[..new_env.len() - 1], &kept[..]);
        }
    }
}
