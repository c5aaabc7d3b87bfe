//! `vgpu-hook <stage>`: the OCI hook's stages. Not here: the create steps shared with the shim
//! (`crate::create`), the edits (`crate::edits`), mounting into the container (`crate::mountns`).
//!
//! - `createRuntime` / `prestart` (OCI state on stdin): after the shim, record the container's owner in its
//!   limits file; on the hooks.d path (no shim ran), validate the quota, provision the state and bind-mount
//!   it into the container before `pivot_root`.
//! - `precreate` (Podman; the spec on stdin, the edited spec on stdout): validate and add the env.
//! - `poststop` (OCI state on stdin, no pid): remove the container's state.
//!
//! Every stage is idempotent, and every run also collects garbage left by containers that are gone.

use crate::claim_quota::{self, ClaimQuota};
use crate::create::{self, Create, CreateError};
use crate::edits::{self, ContainerEdits};
use crate::mountns;
use crate::provision::{self, Owner, ProvisionError};
use crate::request::SpecFacts;
use crate::spec::{annotations_of, Spec};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vgpu_host::config::Config;
use vgpu_host::gc;
use vgpu_host::state_root::StateRoot;

/// An OCI state on stdin that cannot be read. `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not JSON (`why`: the parser's words).
    #[error("malformed OCI state on stdin: {why}")]
    Malformed { why: String },
    #[error("OCI state on stdin has no id")]
    NoId,
    /// `pid` is no process id (`value`: as written).
    #[error("OCI state on stdin: pid {value} is not a pid")]
    BadPid { value: String },
}

/// The OCI state a runtime hands its hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub id: String,
    /// Host pid of the container's init; absent at poststop.
    pub pid: Option<u32>,
    pub bundle: PathBuf,
    pub annotations: Vec<(String, String)>,
}

impl State {
    /// Parses the state JSON.
    pub fn parse(text: &str) -> Result<State, StateError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| StateError::Malformed { why: e.to_string() })?;
        let id = v
            .get("id")
            .and_then(Value::as_str)
            .ok_or(StateError::NoId)?;
        let pid = match v.get("pid") {
            None | Some(Value::Null) => None,
            Some(p) => match p.as_u64() {
                Some(0) => None,
                Some(p) if p <= u32::MAX as u64 => Some(p as u32),
                _ => {
                    return Err(StateError::BadPid {
                        value: p.to_string(),
                    })
                }
            },
        };
        let bundle = v.get("bundle").and_then(Value::as_str).unwrap_or("").into();
        Ok(State {
            id: id.to_string(),
            pid,
            bundle,
            annotations: annotations_of(v.get("annotations")),
        })
    }
}

/// The stages [`run`] knows.
pub const STAGES: &[&str] = &["createRuntime", "prestart", "precreate", "poststop"];

/// Runs stage `stage` with the given stdin/stdout.
pub fn run(stage: &str, input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
    let cfg = Config::load()?;
    vgpu_host::logging::init(vgpu_host::keys::host::HOOK_BIN, &cfg);
    let root = StateRoot::new(cfg.state_root.clone());
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .context("cannot read stdin")?;
    let result = match stage {
        "createRuntime" | "prestart" => provision_stage(&cfg, &root, &State::parse(&text)?),
        "poststop" => vgpu_host::removal::remove(&root, &State::parse(&text)?.id)
            .map(|_| ())
            .map_err(Into::into),
        "precreate" => precreate(&cfg, &text, output),
        other => bail!(
            "unknown hook stage {other:?} (expected {})",
            STAGES.join(", ")
        ),
    };
    // Garbage collection never fails a container.
    match gc::collect_with(&root, Duration::from_secs(cfg.gc_pending_grace_seconds)) {
        Ok(r) => {
            if !r.removed.is_empty() {
                tracing::info!(removed = %r.removed.join(", "), "gc: collected state of gone containers");
            }
            for e in r.errors {
                tracing::warn!("gc: {e}");
            }
        }
        Err(e) => tracing::warn!("gc: {e:#}"),
    }
    result
}

fn provision_stage(cfg: &Config, root: &StateRoot, st: &State) -> Result<()> {
    let pid = st
        .pid
        .ok_or_else(|| anyhow!("OCI state for container {} has no pid", st.id))?;
    let owner = Owner::of_pid(pid)?;
    // A DRA claim's CDI spec fixes the quota in this hook's own environment.
    let claim = ClaimQuota::from_env()?;
    claim_quota::check_not_under_shim(claim.as_ref(), edits::shim_ran(&st.annotations), &st.id)?;
    if edits::shim_ran(&st.annotations) {
        // The shim provisioned and the runtime mounted; only the owner was unknown until now.
        if !root.container_dir(&st.id)?.is_dir() {
            bail!(
                "state of container {} is missing under {}",
                st.id,
                root.root().display()
            );
        }
        provision::record_owner(root, &st.id, owner)?;
        return driver_limit(cfg, root, &st.id, pid);
    }
    // hooks.d path: the spec is the bundle's config.json; the state's annotations win over its own.
    let (spec, _) = Spec::read_bundle(&st.bundle)?;
    let mut facts = SpecFacts::of(&spec).with_state_annotations(&st.annotations);
    if let Some(claim) = &claim {
        claim.check_consumer(&facts.annotations, &st.id)?;
        facts = facts.with_claim(claim);
    }
    let Some(plan) = create::plan(&facts, cfg)? else {
        return Ok(());
    };
    let create = Create::new(cfg, root, &st.id, plan)?;
    let image = create.read_image(&spec, &st.bundle)?;
    let edits = create.edits()?;
    let made = match create.provision(owner.clone(), &image) {
        Ok(p) => Some(p),
        // This stage already ran for this very container (same init process): mount again, harmlessly.
        // Any other owner's state (another container with this id) is refused and left alone.
        Err(e)
            if matches!(e, CreateError::Provision(ProvisionError::AlreadyExists(_)))
                && provision::owned_by(root, &st.id, &owner) =>
        {
            None
        }
        Err(e) => return Err(e.into()),
    };
    // The same mounts the shim writes into a spec, made here in the container's mount namespace.
    if let Err(e) = mountns::bind_into(pid, &image.rootfs, &edits.mounts)
        .map_err(anyhow::Error::from)
        .and_then(|()| driver_limit(cfg, root, &st.id, pid))
    {
        if let Some(p) = made {
            let _ = p.remove();
        }
        return Err(e);
    }
    Ok(())
}

/// The quotas as the container cgroup's limits in the driver too, when asked for (`vgpu_host::driverlimit`).
fn driver_limit(cfg: &Config, root: &StateRoot, id: &str, pid: u32) -> Result<()> {
    if !cfg.driver_memory_limit {
        return Ok(());
    }
    let limits = vgpu_host::hostfile::load_limits(&root.limits_path(id)?)
        .map_err(|e| anyhow!("container {id}: {e}"))?;
    Ok(vgpu_host::driverlimit::apply(cfg, pid, &limits)?)
}

fn precreate(cfg: &Config, text: &str, output: &mut dyn Write) -> Result<()> {
    let mut spec = Spec::parse(text, Path::new("<precreate spec on stdin>"))?;
    match create::plan(&SpecFacts::of(&spec), cfg)? {
        None => output.write_all(text.as_bytes())?,
        Some(plan) => {
            // The env alone: the mounts come from this hook's createRuntime stage.
            ContainerEdits::env_only(&plan).apply_to_spec(&mut spec)?;
            output.write_all(spec.to_text().as_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_parsing() {
        let s = State::parse(r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/b","annotations":{"a":"b"}}"#).unwrap();
        assert_eq!(s.pid, Some(42));
        assert_eq!(s.annotations, vec![("a".to_string(), "b".to_string())]);
        let s = State::parse(r#"{"id":"c1","status":"stopped","bundle":"/b"}"#).unwrap();
        assert_eq!(s.pid, None);
        assert!(matches!(
            State::parse("{"),
            Err(StateError::Malformed { .. })
        ));
        assert_eq!(State::parse(r#"{"pid":1}"#), Err(StateError::NoId));
        let e = State::parse(r#"{"id":"c","pid":-1}"#).unwrap_err();
        assert_eq!(e, StateError::BadPid { value: "-1".into() });
        // The line users read.
        assert_eq!(e.to_string(), "OCI state on stdin: pid -1 is not a pid");
    }
}
