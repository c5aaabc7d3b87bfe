//! The create pipeline the shim and the hook (hooks.d path) share: plan, checks, image preload, edits,
//! provisioning. Not here: how the edits reach the container (spec file: `crate::shim`; mounts: `crate::hook`).
//!
//! Errors: `anyhow` here (except [`CreateError`], which the hook matches) and in `hook` and `shim`, the
//! binaries' dispatch layers that join the modules; every module under them returns its own `thiserror`
//! enum (`PlanError`, `AdmissionError`, `ProvisionError`, `RootfsError`, `EditError`, `SpecError`, ...),
//! whose `Display` is the whole line, so it reads the same through `anyhow`.

use crate::edits::{self, ContainerEdits};
use crate::plan::{self, Plan};
use crate::provision::{self, Owner, Provisioned};
use crate::request::SpecFacts;
use crate::rootfs::Rootfs;
use crate::spec::Spec;
use anyhow::Result;
use std::path::{Path, PathBuf};
use vgpu_host::admission::{self, Policy};
use vgpu_host::config::Config;
use vgpu_host::state_root::StateRoot;
use vgpu_ledger::layout;

/// Plans the quota of a spec's facts; NVML (config key `nvml_library`) is loaded only when a quota is
/// asked for, so a node without a driver runs other containers unaffected. `None`: no quota.
pub fn plan(facts: &SpecFacts, cfg: &Config) -> Result<Option<Plan>> {
    Ok(plan::plan_with(facts, cfg.unquoted(), || {
        vgpu_host::nvml::open(&cfg.nvml_library).and_then(|n| n.devices())
    })?)
}

/// Why [`Create::provision`] made nothing: refused by admission, or the state could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Admission(#[from] admission::AdmissionError),
    #[error(transparent)]
    Provision(#[from] provision::ProvisionError),
}

/// What the pipeline reads from the container's image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Host path of the rootfs.
    pub rootfs: PathBuf,
    /// The image's own `/etc/ld.so.preload`, kept after the library's entry.
    pub preload: Option<String>,
}

/// A container with a planned quota, on its way to being provisioned.
pub struct Create<'a> {
    cfg: &'a Config,
    root: &'a StateRoot,
    id: &'a str,
    plan: Plan,
}

impl<'a> Create<'a> {
    /// Checks that `id` is one safe file name before any path is built from it.
    pub fn new(
        cfg: &'a Config,
        root: &'a StateRoot,
        id: &'a str,
        plan: Plan,
    ) -> Result<Create<'a>> {
        root.container_dir(id)?;
        Ok(Create {
            cfg,
            root,
            id,
            plan,
        })
    }

    /// Checks the library, and reads the image's `/etc/ld.so.preload` resolved inside the rootfs (an image
    /// whose `/etc` is a symlink to a host folder cannot make it read a host file).
    pub fn read_image(&self, spec: &Spec, bundle: &Path) -> Result<Image> {
        edits::check_library(self.cfg)?;
        let rootfs = spec.rootfs(bundle)?;
        let preload =
            Rootfs::open(&rootfs)?.read_small_file(Path::new(layout::CONTAINER_PRELOAD_PATH))?;
        Ok(Image { rootfs, preload })
    }

    /// The edits the container gets. The quota decision (its GPUs, quotas, mode, shares, and the mounts
    /// it gets) is logged at debug, one record per container, for the operator asking why.
    pub fn edits(&self) -> Result<ContainerEdits, edits::EditError> {
        let e = ContainerEdits::new(&self.plan, self.root, self.id, self.cfg)?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            let gpus: Vec<String> = self
                .plan
                .gpus
                .iter()
                .map(|g| {
                    format!(
                        "{} {} {}, {}",
                        g.index,
                        g.uuid,
                        g.settings
                            .memory_limit
                            .map_or("no memory quota".into(), |b| format!(
                                "memory {}",
                                vgpu_ledger::format_bytes(b)
                            )),
                        g.settings
                            .request_limit()
                            .map_or("no share".into(), |(r, l)| format!(
                                "share: request {r}%, limit {l}%"
                            ))
                    )
                })
                .collect();
            let mounts: Vec<&str> = e.mounts.iter().map(|m| m.destination.as_str()).collect();
            tracing::debug!(
                id = %self.id,
                gpus = %gpus.join("; "),
                memory_mode = %self.plan.memory_mode(),
                mounts = %mounts.join(" "),
                "quota decision"
            );
        }
        Ok(e)
    }

    /// Admits the quota (the node's GPUs are not overcommitted: `vgpu_host::admission`) and provisions
    /// `<root>/containers/<id>/`, never over a folder that is there ([`provision::AlreadyExists`]);
    /// returns the folder this call made.
    pub fn provision(&self, owner: Owner, image: &Image) -> Result<Provisioned, CreateError> {
        let _admitted = admission::admit(
            self.root,
            Policy::of(self.cfg),
            self.id,
            &self.plan.gpus,
            || vgpu_host::nvml::open(&self.cfg.nvml_library).and_then(|n| n.devices()),
        )?;
        Ok(provision::provision(
            self.root,
            self.id,
            &self.plan,
            owner,
            image.preload.as_deref(),
        )?)
    }
}
