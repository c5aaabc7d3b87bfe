//! `vgpuctl status`'s HAMi containers with the quota their containerd bundle's OCI spec holds, as the
//! monitor enforces it (`vgpu_host::hami::bundle`), in place of the one their ledger claims.

use super::Status;

impl Status {
    /// The quotas the containerd bundles under `tasks` hold for the HAMi containers listed
    /// (`vgpu_host::hami::bundle`, `usage::hami::with_host_quota`, as the monitor enforces them): each GPU's quota
    /// is its spec's, not its ledger's. Bundles that cannot be read change nothing.
    pub fn note_hami_quotas(&mut self, tasks: &std::path::Path, order: &[String]) {
        let Some(dir) = self.hami_folders.first().and_then(|f| f.dir.parent()) else {
            return;
        };
        let Ok(found) = vgpu_host::hami::bundle::read_host(tasks, dir) else {
            return;
        };
        for q in &found.quotas {
            let id = format!("hami/{}", q.folder);
            let Some(c) = self.containers.iter_mut().find(|c| c.id == id) else {
                continue;
            };
            let mut state = vgpu_host::usage::ContainerState {
                origin: vgpu_host::usage::Origin::Hami {
                    pod_uid: String::new(),
                    container: String::new(),
                    dir: dir.to_path_buf(),
                    bundle: None,
                },
                gpus: (c.gpus.iter())
                    .map(|g| vgpu_host::usage::GpuState {
                        uuid: g.uuid.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            vgpu_host::usage::hami::with_host_quota(&mut state, q, order);
            for g in &mut c.gpus {
                if let Some(s) = state.gpus.iter().find(|s| s.uuid == g.uuid) {
                    (g.index, g.quota) = (s.index, s.limit);
                }
            }
            c.gpus.sort_by_key(|g| g.index);
            if let Some(h) = &mut c.hami {
                h.spec = Some(q.bundle.join("config.json").display().to_string());
            }
        }
    }
}
