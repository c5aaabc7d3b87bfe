//! `vgpuctl status`'s memory no process's figure shows, per GPU: the monitor's remainders
//! (`vgpu_monitor::unattributed`, the processes attributed as the monitor attributes them) with their
//! likely holders named by container id. Not here: its table (`render`).

use super::{LikelyHolder, Status, Unattributed};
use vgpu_host::procs;
use vgpu_host::state_root::StateRoot;

impl Status {
    /// Notes each GPU's unattributed memory from NVML's reading `gpus` and the state root's containers
    /// (`vgpu_monitor::unattributed`: the processes attributed as the monitor attributes them).
    pub fn note_unattributed(
        &mut self,
        root: &StateRoot,
        gpus: &[vgpu_host::nvml::GpuReading],
        settings: vgpu_monitor::unattributed::Settings,
    ) {
        let mut cs = vgpu_host::usage::read(root).unwrap_or_default();
        let mut order: Vec<&vgpu_host::nvml::GpuReading> = gpus.iter().collect();
        order.sort_by_key(|r| r.index);
        let order: Vec<String> = order.into_iter().map(|r| r.uuid.clone()).collect();
        cs.extend(
            self.hami_folders
                .iter()
                .map(|f| vgpu_host::usage::hami::from_hami(f, &order)),
        );
        vgpu_host::usage::mark_live(&mut cs, procs::init_alive);
        let truth = vgpu_host::attribution::attribute(&cs, gpus, procs::inspect, procs::own_ns());
        self.unattributed = unattributed(
            &cs,
            &vgpu_monitor::unattributed::remainders(&cs, gpus, &truth, settings),
            settings.threshold,
        );
    }
}

/// The monitor's remainders as status shows them: holders by container id.
fn unattributed(
    cs: &[vgpu_host::usage::ContainerState],
    rs: &[vgpu_monitor::unattributed::Remainder],
    threshold: u64,
) -> Vec<Unattributed> {
    rs.iter()
        .map(|r| Unattributed {
            index: r.index,
            uuid: r.uuid.clone(),
            used: r.used,
            reserved: r.reserved,
            processes: r.processes,
            unattributed: r.unattributed,
            past_threshold: r.unattributed > threshold,
            likely_holders: r
                .holders
                .iter()
                .filter_map(|h| {
                    Some(LikelyHolder {
                        container_id: cs.get(h.c)?.id.clone(),
                        charged: h.charged,
                        nvml: h.nvml,
                        likely: h.likely,
                    })
                })
                .collect(),
        })
        .collect()
}
