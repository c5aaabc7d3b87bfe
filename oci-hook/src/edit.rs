//! The edits the shim makes to a spec with a quota: env for the interposer, bind mounts of the state, and
//! the hooks that record the owner and clean up.

use crate::config::Config;
use crate::plan::Plan;
use crate::spec::Spec;
use crate::{HOOK_PATH_ENV, MARKER_ANNOTATION};
use anyhow::Result;
use std::path::Path;
use vgpu_ledger::layout::{self, StateRoot};

/// Env the interposer reads: the limits file, and HAMi-compatible per-GPU limits (for images that carry
/// another HAMi-style library, and for people reading `env` in the container).
pub fn add_env(spec: &mut Spec, plan: &Plan) -> Result<()> {
    for g in &plan.gpus {
        spec.set_env(&format!("CUDA_DEVICE_MEMORY_LIMIT_{}", g.index), &g.memory_limit.to_string())?;
    }
    spec.set_env("VGPU_LIMITS_FILE", layout::CONTAINER_LIMITS_PATH)
}

/// The explicit env of every hook we install: nothing from the container.
pub fn hook_env() -> Vec<String> {
    let mut env = vec![HOOK_PATH_ENV.to_string()];
    env.extend(Config::env_for_hooks());
    env
}

/// Everything the shim adds for container `id` whose state is (about to be) provisioned under `root`.
pub fn shim_edit(spec: &mut Spec, plan: &Plan, root: &StateRoot, id: &str, cfg: &Config) -> Result<()> {
    add_env(spec, plan)?;
    let ro = ["rbind", "ro", "nosuid", "nodev", "noexec"];
    spec.add_mount(layout::CONTAINER_LIMITS_PATH, &root.limits_path(id)?, &ro)?;
    spec.add_mount(layout::CONTAINER_LEDGERS_DIR, &root.ledgers_dir(id)?, &["rbind", "rw", "nosuid", "nodev", "noexec"])?;
    // The library is mmap'ed executable: no noexec here.
    spec.add_mount(layout::CONTAINER_LIBRARY_PATH, &cfg.library, &["rbind", "ro", "nosuid", "nodev"])?;
    if let Some(core) = core_library(cfg) {
        spec.add_mount(layout::CONTAINER_CORE_PATH, &core, &["rbind", "ro", "nosuid", "nodev"])?;
    }
    spec.add_mount(layout::CONTAINER_PRELOAD_PATH, &root.preload_path(id)?, &ro)?;
    let env = hook_env();
    let stage = cfg.hook_stage.as_str();
    spec.add_hook(stage, &cfg.hook_path, &["vgpu-hook", stage], &env)?;
    spec.add_hook("poststop", &cfg.hook_path, &["vgpu-hook", "poststop"], &env)?;
    spec.set_annotation(MARKER_ANNOTATION, "vgpu-container-runtime")
}

/// Removes what [`shim_edit`] added (mounts at our destinations, hooks running `vgpu-hook`); env entries
/// are replaced by the next edit anyway.
pub fn strip_shim_edit(spec: &mut Spec) {
    const OURS: [&str; 5] = [
        layout::CONTAINER_LIMITS_PATH,
        layout::CONTAINER_LEDGERS_DIR,
        layout::CONTAINER_LIBRARY_PATH,
        layout::CONTAINER_CORE_PATH,
        layout::CONTAINER_PRELOAD_PATH,
    ];
    if let Some(m) = spec.0.get_mut("mounts").and_then(|m| m.as_array_mut()) {
        m.retain(|m| !m.get("destination").and_then(|d| d.as_str()).is_some_and(|d| OURS.contains(&d)));
    }
    if let Some(h) = spec.0.get_mut("hooks").and_then(|h| h.as_object_mut()) {
        for list in h.values_mut().filter_map(|l| l.as_array_mut()) {
            list.retain(|e| e.pointer("/args/0").and_then(|a| a.as_str()) != Some("vgpu-hook"));
        }
    }
}

/// True when the spec (or the state's annotations) say the shim already provisioned and mounted.
pub fn shim_ran(annotations: &[(String, String)]) -> bool {
    annotations.iter().any(|(k, _)| k == MARKER_ANNOTATION)
}

/// The interposer's engine (`libvgpu_core.so`) beside the configured library, when the build has one: the
/// library loads it from its own folder, so it is mounted beside it.
pub fn core_library(cfg: &Config) -> Option<std::path::PathBuf> {
    let p = cfg.library.parent()?.join(layout::CORE_FILE_NAME);
    p.is_file().then_some(p)
}

/// A short check that the library exists before a container is set up to preload it.
pub fn check_library(cfg: &Config) -> Result<()> {
    let p: &Path = &cfg.library;
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => anyhow::bail!("vgpu library {} is not a file (config key library)", p.display()),
        Err(e) => anyhow::bail!("vgpu library {}: {e} (config key library)", p.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedGpu;

    #[test]
    fn editing_twice_gives_one_set_for_the_last_id() {
        let mut spec = Spec::parse(
            r#"{"process":{"env":["A=1"]},"mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
                "hooks":{"prestart":[{"path":"/usr/bin/other-hook"}]}}"#,
            Path::new("config.json"),
        )
        .unwrap();
        let plan = Plan { gpus: vec![PlannedGpu { index: 0, uuid: "GPU-1".into(), memory_limit: 1 << 30 }] };
        let cfg = Config::default();
        let root = StateRoot::new("/run/vgpu".into());
        shim_edit(&mut spec, &plan, &root, "first", &cfg).unwrap();
        assert!(shim_ran(&spec.annotations()));
        strip_shim_edit(&mut spec);
        shim_edit(&mut spec, &plan, &root, "second", &cfg).unwrap();
        let text = spec.to_text();
        assert!(!text.contains("containers/first"), "{text}");
        let v = &spec.0;
        assert_eq!(v["mounts"].as_array().unwrap().len(), 1 + 4 + usize::from(core_library(&cfg).is_some()));
        assert_eq!(v["hooks"]["createRuntime"].as_array().unwrap().len(), 1);
        assert_eq!(v["hooks"]["poststop"].as_array().unwrap().len(), 1);
        assert_eq!(v["hooks"]["prestart"][0]["path"], "/usr/bin/other-hook");
        assert_eq!(spec.env_var("CUDA_DEVICE_MEMORY_LIMIT_0").as_deref(), Some("1073741824"));
        assert_eq!(spec.env().iter().filter(|(k, _)| k == "VGPU_LIMITS_FILE").count(), 1);
    }

    /// The shim's edit, byte for byte (a guard for refactoring: the spec a runtime sees must not change).
    #[test]
    fn the_shim_edit_byte_for_byte() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("libvgpu.so"), "").unwrap();
        std::fs::write(d.path().join("libvgpu_core.so"), "").unwrap();
        let cfg = Config { library: d.path().join("libvgpu.so"), hook_path: "/usr/bin/vgpu-hook".into(), ..Config::default() };
        let plan = Plan {
            gpus: vec![
                PlannedGpu { index: 0, uuid: "GPU-0".into(), memory_limit: 1 << 30 },
                PlannedGpu { index: 2, uuid: "GPU-2".into(), memory_limit: 512 << 20 },
            ],
        };
        let mut spec = Spec::parse(r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"annotations":{"a":"b"}}"#, Path::new("c")).unwrap();
        shim_edit(&mut spec, &plan, &StateRoot::new("/s".into()), "c1", &cfg).unwrap();
        let lib = d.path().display();
        let hook_env: Vec<String> = hook_env().iter().map(|e| format!("{e:?}")).collect();
        let hook_env = hook_env.join(",");
        let want = format!(
            r#"{{"ociVersion":"1.0.2","process":{{"env":["PATH=/bin","CUDA_DEVICE_MEMORY_LIMIT_0=1073741824","CUDA_DEVICE_MEMORY_LIMIT_2=536870912","VGPU_LIMITS_FILE=/run/vgpu/limits.json"]}},"annotations":{{"a":"b","vgpu.io/provisioned-by":"vgpu-container-runtime"}},"mounts":[{{"destination":"/run/vgpu/limits.json","type":"bind","source":"/s/containers/c1/limits.json","options":["rbind","ro","nosuid","nodev","noexec"]}},{{"destination":"/run/vgpu/ledgers","type":"bind","source":"/s/containers/c1/ledgers","options":["rbind","rw","nosuid","nodev","noexec"]}},{{"destination":"/usr/local/vgpu/libvgpu.so","type":"bind","source":"{lib}/libvgpu.so","options":["rbind","ro","nosuid","nodev"]}},{{"destination":"/usr/local/vgpu/libvgpu_core.so","type":"bind","source":"{lib}/libvgpu_core.so","options":["rbind","ro","nosuid","nodev"]}},{{"destination":"/etc/ld.so.preload","type":"bind","source":"/s/containers/c1/ld.so.preload","options":["rbind","ro","nosuid","nodev","noexec"]}}],"hooks":{{"createRuntime":[{{"path":"/usr/bin/vgpu-hook","args":["vgpu-hook","createRuntime"],"env":[{hook_env}]}}],"poststop":[{{"path":"/usr/bin/vgpu-hook","args":["vgpu-hook","poststop"],"env":[{hook_env}]}}]}}}}"#
        );
        assert_eq!(serde_json::to_string(&spec.0).unwrap(), want);
        // The precreate stage adds the env alone.
        let mut spec = Spec::parse(r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT_0=1"]}}"#, Path::new("c")).unwrap();
        add_env(&mut spec, &plan).unwrap();
        assert_eq!(
            serde_json::to_string(&spec.0).unwrap(),
            r#"{"process":{"env":["CUDA_DEVICE_MEMORY_LIMIT_0=1073741824","CUDA_DEVICE_MEMORY_LIMIT_2=536870912","VGPU_LIMITS_FILE=/run/vgpu/limits.json"]}}"#
        );
    }
}
