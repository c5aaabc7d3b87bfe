//! What a container with a quota gets (env, bind mounts, hooks, marker annotation), as one value. Not here:
//! provisioning the state the mounts point at (`crate::provision`), or mounting (`crate::mountns`).
//!
//! [`ContainerEdits`] is computed once and applied three ways: as a spec edit (the shim; its env alone for
//! `precreate`), as bind mounts made in the container's namespace (the hook on the hooks.d path, through
//! `crate::mountns`), or stripped from a spec edited before ([`ContainerEdits::strip_from_spec`]).

use crate::plan::Plan;
use crate::spec::{Spec, SpecError};
use std::path::{Path, PathBuf};
use vgpu_host::config::Config;
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::envlimits;
use vgpu_ledger::keys;
use vgpu_ledger::layout::{self, LayoutError};

/// Why the edits cannot be made. `Display` is one line naming the path or the field.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// An id or GPU uuid that is no safe file name.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("vgpu library {} is not a file (config key library)", .path.display())]
    LibraryNotAFile { path: PathBuf },
    /// The library cannot be looked at (`err` is part of the line).
    #[error("vgpu library {}: {err} (config key library)", .path.display())]
    Library { path: PathBuf, err: std::io::Error },
}

type Result<T, E = EditError> = std::result::Result<T, E>;

/// Annotation the shim adds so the later hook knows the spec was already edited and the state is mounted
/// by the runtime, not by the hook.
pub const MARKER_ANNOTATION: &str = keys::annotation::PROVISIONED_BY;

/// `args[0]` of every hook we install: how a re-edit finds them again.
pub const HOOK_ARG0: &str = vgpu_host::keys::host::HOOK_BIN;

/// Every fixed destination vgpu ever mounts at (the engine's only when the build has one), and the ledger
/// folder earlier versions mounted whole: with each GPU's ledger file (see [`is_our_destination`]), what a
/// re-edit takes out.
pub const DESTINATIONS: [&str; 5] = [
    layout::CONTAINER_LIMITS_PATH,
    layout::CONTAINER_LEDGERS_DIR,
    layout::CONTAINER_LIBRARY_PATH,
    layout::CONTAINER_CORE_PATH,
    layout::CONTAINER_PRELOAD_PATH,
];

/// Whether vgpu mounts at `destination`: one of [`DESTINATIONS`], or a ledger file in the ledger folder
/// (one per GPU, named by its uuid, so not a fixed list).
pub fn is_our_destination(destination: &str) -> bool {
    DESTINATIONS.contains(&destination)
        || destination
            .strip_prefix(layout::CONTAINER_LEDGERS_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| !name.is_empty() && !name.contains('/'))
}

/// One bind mount into the container; always `nosuid` and `nodev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path inside the container (see [`is_our_destination`]).
    pub destination: String,
    /// Host path (visible in the container's mount namespace, which started as a copy of the host's).
    pub source: PathBuf,
    pub read_only: bool,
    /// `noexec` too: everything but the library and its engine, which are mapped executable.
    pub noexec: bool,
}

impl Mount {
    /// The mount's options in an OCI spec.
    pub fn options(&self) -> Vec<&'static str> {
        let mut o = vec![
            "rbind",
            if self.read_only { "ro" } else { "rw" },
            "nosuid",
            "nodev",
        ];
        if self.noexec {
            o.push("noexec");
        }
        o
    }
}

/// One hook added to the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// `createRuntime`, `prestart`, `poststop`.
    pub stage: &'static str,
    pub path: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<String>,
}

/// Everything vgpu adds to a container with a quota.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// `process.env` entries, set in this order (an earlier entry of the same name is replaced).
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub hooks: Vec<Hook>,
    pub annotations: Vec<(String, String)>,
}

impl ContainerEdits {
    /// The edits of container `id` whose state is (about to be) provisioned under `root` with quota `plan`.
    pub fn new(plan: &Plan, root: &StateRoot, id: &str, cfg: &Config) -> Result<ContainerEdits> {
        let mount = |destination: &str, source, read_only, noexec| Mount {
            destination: destination.to_string(),
            source,
            read_only,
            noexec,
        };
        let mut mounts = vec![mount(
            layout::CONTAINER_LIMITS_PATH,
            root.limits_path(id)?,
            true,
            true,
        )];
        // Each ledger file, never the folder: a tenant must not be able to delete or replace its ledger, nor
        // put files, FIFOs or links in the host's state folder (or fill its file system with them).
        for g in &plan.gpus {
            let inside = layout::container_ledger_path(&g.uuid)?;
            mounts.push(Mount {
                destination: inside.to_string_lossy().into_owned(),
                source: root.ledger_path(id, &g.uuid)?,
                read_only: false,
                noexec: true,
            });
        }
        // The library is mmap'ed executable: no noexec here.
        mounts.push(mount(
            layout::CONTAINER_LIBRARY_PATH,
            cfg.library.clone(),
            true,
            false,
        ));
        if let Some(core) = core_library(cfg) {
            mounts.push(mount(layout::CONTAINER_CORE_PATH, core, true, false));
        }
        mounts.push(mount(
            layout::CONTAINER_PRELOAD_PATH,
            root.preload_path(id)?,
            true,
            true,
        ));
        let env = Config::hook_env();
        let hook = |stage: &'static str| Hook {
            stage,
            path: cfg.hook_path.clone(),
            args: vec![HOOK_ARG0.to_string(), stage.to_string()],
            env: env.clone(),
        };
        Ok(ContainerEdits {
            env: Self::env_only(plan).env,
            mounts,
            hooks: vec![hook(cfg.hook_stage.as_str()), hook("poststop")],
            annotations: vec![(
                MARKER_ANNOTATION.to_string(),
                vgpu_host::keys::host::RUNTIME_BIN.to_string(),
            )],
        })
    }

    /// The env alone — what `precreate` adds (the mounts come later, from the hook): the limits file, and
    /// HAMi-compatible per-GPU limits (for images that carry another HAMi-style library, and for people
    /// reading `env` in the container).
    pub fn env_only(plan: &Plan) -> ContainerEdits {
        // Memory only: a HAMi-style library in the image reading a compute share would throttle the
        // container a second time.
        let mut env: Vec<(String, String)> = plan
            .gpus
            .iter()
            .filter_map(|g| {
                Some((
                    envlimits::per_index_var(g.index as u32),
                    g.settings.memory_limit?.to_string(),
                ))
            })
            .collect();
        env.push((
            envlimits::LIMITS_FILE_VAR.to_string(),
            layout::CONTAINER_LIMITS_PATH.to_string(),
        ));
        ContainerEdits {
            env,
            ..Default::default()
        }
    }

    /// Applies the edits to a spec: env, then mounts, hooks and annotations, each appended in order.
    pub fn apply_to_spec(&self, spec: &mut Spec) -> Result<()> {
        for (k, v) in &self.env {
            spec.set_env(k, v)?;
        }
        for m in &self.mounts {
            spec.add_mount(&m.destination, &m.source, &m.options())?;
        }
        for h in &self.hooks {
            let args: Vec<&str> = h.args.iter().map(String::as_str).collect();
            spec.add_hook(h.stage, &h.path, &args, &h.env)?;
        }
        for (k, v) in &self.annotations {
            spec.set_annotation(k, v)?;
        }
        Ok(())
    }

    /// Takes out what an earlier [`apply_to_spec`](Self::apply_to_spec) added, whatever its container id
    /// and GPUs: mounts at our destinations (every ledger file included) and hooks running `vgpu-hook`. Env
    /// entries and the annotation are replaced by the next edit anyway.
    pub fn strip_from_spec(spec: &mut Spec) {
        if let Some(m) = spec.0.get_mut("mounts").and_then(|m| m.as_array_mut()) {
            m.retain(|m| {
                !m.get("destination")
                    .and_then(|d| d.as_str())
                    .is_some_and(is_our_destination)
            });
        }
        if let Some(h) = spec.0.get_mut("hooks").and_then(|h| h.as_object_mut()) {
            for list in h.values_mut().filter_map(|l| l.as_array_mut()) {
                list.retain(|e| e.pointer("/args/0").and_then(|a| a.as_str()) != Some(HOOK_ARG0));
            }
        }
    }
}

/// True when the spec (or the state's annotations) say the shim already provisioned and mounted.
pub fn shim_ran(annotations: &[(String, String)]) -> bool {
    annotations.iter().any(|(k, _)| k == MARKER_ANNOTATION)
}

/// The interposer's engine (`libvgpu_core.so`) beside the configured library, when the build has one: the
/// library loads it from its own folder, so it is mounted beside it.
pub fn core_library(cfg: &Config) -> Option<PathBuf> {
    let p = cfg.library.parent()?.join(layout::CORE_FILE_NAME);
    p.is_file().then_some(p)
}

/// A short check that the library exists before a container is set up to preload it.
pub fn check_library(cfg: &Config) -> Result<()> {
    let p: &Path = &cfg.library;
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(EditError::LibraryNotAFile {
            path: p.to_path_buf(),
        }),
        Err(err) => Err(EditError::Library {
            path: p.to_path_buf(),
            err,
        }),
    }
}

#[cfg(test)]
mod tests;
