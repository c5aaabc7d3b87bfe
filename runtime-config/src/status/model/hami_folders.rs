//! `vgpuctl status`'s containers of HAMi's per-container folders (`vgpu_host::hami`), listed after the
//! state root's: each GPU with the quota its library wrote in the ledger, marked `hami`. Not here: the
//! quota their containerd bundle holds (`hami_quota`), reading a folder (`vgpu_host::hami::scan`).

use super::{from_snapshot, host_pids, name_host_pids, Container, Gpu, Hami, Status};

impl Status {
    /// Lists the containers of HAMi's per-container folder `dir` (`vgpu_host::hami::scan`; each GPU's
    /// index by NVML's order, `order`) after the state root's, and what was skipped there. A missing
    /// folder is nothing to say unless `said` (the config named it).
    pub fn note_hami(&mut self, dir: &std::path::Path, said: bool, order: &[String]) {
        match vgpu_host::hami::scan(dir) {
            Ok(scan) => {
                self.hami_skipped = scan.skipped.iter().map(|k| k.why.clone()).collect();
                let mut cs: Vec<Container> = scan
                    .folders
                    .iter()
                    .map(|f| hami_container(f, order))
                    .collect();
                name_host_pids(&mut cs, host_pids);
                self.containers.extend(cs);
                self.hami_folders = scan.folders;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !said => {}
            Err(e) => {
                self.hami_skipped = vec![format!(
                    "HAMi's containers folder {}: {e}; no container of HAMi's is listed",
                    dir.display()
                )]
            }
        }
    }
}

/// A container of HAMi's folders: its GPUs in the order of `usage::hami::from_hami` (NVML's, `order`), each
/// with the quota its library wrote in the ledger.
fn hami_container(f: &vgpu_host::hami::Folder, order: &[String]) -> Container {
    let state = vgpu_host::usage::hami::from_hami(f, order);
    Container {
        id: state.id,
        init_pid: None,
        kubernetes: None,
        docker_name: None,
        podman_name: None,
        hami: Some(Hami {
            pod_uid: f.pod_uid.clone(),
            container: f.container.clone(),
            folder: f.dir.display().to_string(),
            spec: None,
        }),
        updates: 0,
        updated_at: None,
        error: None,
        gpus: state
            .gpus
            .iter()
            .filter_map(|gs| {
                let l = f.ledgers.iter().find(|l| l.uuid == gs.uuid)?;
                let mut g = Gpu {
                    index: gs.index,
                    uuid: gs.uuid.clone(),
                    quota: gs.limit,
                    used: 0,
                    over_quota: None,
                    pending_shrink: false,
                    by_kind: Default::default(),
                    memory_mode: "unknown",
                    spill_limit: None,
                    spilled: 0,
                    compute: None,
                    processes: vec![],
                    error: None,
                };
                from_snapshot(&mut g, &l.snapshot);
                Some(g)
            })
            .collect(),
    }
}
