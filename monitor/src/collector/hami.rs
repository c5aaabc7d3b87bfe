//! HAMi's containers in the monitor's reading: where HAMi's per-container folders are looked for
//! (`with_hami`) and the bundles that hold their quotas (`with_hami_tasks`), the containers read from them
//! with the quotas joined, and the lines about what was skipped, each logged once (`HamiWatch`). Not here:
//! reading a folder or a bundle (`vgpu_host::hami`, `vgpu_host::usage::hami`), what is done with the
//! containers (the rest of the collection).

use super::Monitor;
use crate::stderr::log;
use std::collections::BTreeSet;
use vgpu_host::config::HamiContainers;
use vgpu_host::nvml::GpuReading;
use vgpu_host::usage;

impl Monitor {
    /// This monitor also reporting the containers of HAMi's per-container folders where `setting` says
    /// (`vgpu_host::hami`): their figures and findings, report only unless their bundle's spec is found
    /// (`with_hami_tasks`); never a freeze.
    pub fn with_hami(mut self, setting: HamiContainers) -> Monitor {
        self.hami.setting = Some(setting);
        self
    }

    /// Where this monitor looks for the bundles of HAMi's containers (`[monitor] hami_task_dir`): a
    /// container whose bundle's spec is found there is enforced on by the quota it holds.
    pub fn with_hami_tasks(mut self, setting: HamiContainers) -> Monitor {
        self.hami.tasks = setting;
        self
    }

    /// The containers of HAMi's per-container folders (`vgpu_host::hami`, `usage::hami::from_hami`: each GPU's
    /// index by NVML's order in `gpus`) and how many files were skipped (None: no folder read); each line
    /// about a skipped file, or about the folder itself, logged once.
    pub(super) fn read_hami(
        &self,
        gpus: &[GpuReading],
    ) -> (Vec<usage::ContainerState>, Option<usize>) {
        let Some(setting) = &self.hami.setting else {
            return (vec![], None);
        };
        let Some(dir) = setting.dir() else {
            return (vec![], None);
        };
        let mut order: Vec<&GpuReading> = gpus.iter().collect();
        order.sort_by_key(|r| r.index);
        let order: Vec<String> = order.into_iter().map(|r| r.uuid.clone()).collect();
        let mut lines = BTreeSet::new();
        let out = match vgpu_host::hami::scan(dir) {
            Ok(scan) => {
                lines.extend(
                    scan.skipped
                        .iter()
                        .map(|k| format!("skipped in HAMi's folders: {}", k.why)),
                );
                let mut cs = scan
                    .folders
                    .iter()
                    .map(|f| usage::hami::from_hami(f, &order))
                    .collect();
                self.host_quotas(&mut cs, dir, &order, &mut lines);
                (cs, Some(scan.skipped.len()))
            }
            // HAMi's default folder, looked for on every node: a node without HAMi has none.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !setting.is_set() => {
                (vec![], None)
            }
            Err(e) => {
                lines.insert(format!(
                    "HAMi's containers folder {}: {e}; no container of HAMi's is reported",
                    dir.display()
                ));
                (vec![], None)
            }
        };
        let mut said = self.hami.said.lock().unwrap_or_else(|e| e.into_inner());
        for l in lines.difference(&said) {
            log(l);
        }
        *said = lines;
        out
    }

    /// The quotas the bundles of HAMi's containers hold (`hami::bundle`), given to `cs`; without any
    /// (`hami_task_dir` off or missing) one line says they are reported only, and so does one for each
    /// container holding a slot whose bundle is not found.
    fn host_quotas(
        &self,
        cs: &mut Vec<usage::ContainerState>,
        dir: &std::path::Path,
        order: &[String],
        lines: &mut BTreeSet<String>,
    ) {
        let only = "their quotas are reported, never enforced on";
        let auto = std::path::Path::new(vgpu_host::hami::bundle::DEFAULT_TASK_DIR);
        let Some(tasks) = self.hami.tasks.dir_or(auto) else {
            lines.insert(format!(
                "HAMi's containers: [monitor] hami_task_dir = false: {only}"
            ));
            return;
        };
        match vgpu_host::hami::bundle::read_host(tasks, dir) {
            Ok(found) => {
                lines.extend(found.problems.iter().cloned());
                usage::hami::join_host_quotas(cs, &found.quotas, dir, order);
            }
            Err(e) => {
                lines.insert(format!(
                    "HAMi's containers: no bundle of the host's to read their quotas from ({}: {e}): {only}",
                    tasks.display()
                ));
                return;
            }
        }
        for c in cs.iter() {
            let held = c.gpus.iter().any(|g| !g.owners.is_empty());
            if held && matches!(c.origin, usage::Origin::Hami { bundle: None, .. }) {
                lines.insert(format!(
                    "HAMi's container {}: no bundle under {} mounts its folder: its quota is reported, never enforced on",
                    c.id,
                    tasks.display()
                ));
            }
        }
    }
}
