//! What the arbiter does when a board finds a container's work running on while it is frozen
//! (`Action::BusyWhileFrozen`): one log line when the finding begins (counted by the board,
//! `vgpu_turn_busy_while_frozen_total`), and under the monitor's kill policy the container's processes
//! NVML shows busy on that GPU are named for the monitor to kill (`Victim`: the watchdog's pidfd-checked
//! kill, `Monitor::kill`). Without the kill policy the freeze goes on, as before.

use super::{log, Arbiter, Collection, Inner};
use crate::share_run::Victim;
use std::time::Duration;

impl Arbiter {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ran_on(
        &self,
        w: &mut Inner,
        c: Collection,
        uuid: &str,
        list: &[(usize, usize)],
        id: &str,
        after: Duration,
        begins: bool,
    ) {
        // Only while this arbiter holds it frozen (a freeze it could not make is no freeze).
        let kill = self.kill && w.frozen.contains_key(id);
        if begins {
            let action = match kill {
                true => "killing its busy processes under the kill policy",
                false => "reporting only (no kill policy), the freeze goes on",
            };
            log(&format!(
                "GPU {uuid}: container {id} busy while frozen: NVML shows its processes using the GPU in a reading from {:.1} s after it was frozen (grace {:.1} s); work it queued before the freeze runs on beside the holder: {action}",
                after.as_secs_f64(),
                self.settings.grace.as_secs_f64(),
            ));
        }
        if !kill {
            return;
        }
        let Some(&(ci, gi)) = list.iter().find(|&&(ci, _)| c.containers[ci].id == id) else {
            return;
        };
        let Some(r) = c.gpus.and_then(|g| g.iter().find(|r| r.uuid == uuid)) else {
            return;
        };
        let samples = r.process_utilization.as_deref().unwrap_or(&[]);
        let procs = c
            .truth
            .by_gpu
            .get(&(ci, gi))
            .map_or(&[][..], |v| v.as_slice());
        w.victims.extend(
            procs
                .iter()
                .filter(|p| samples.iter().any(|s| s.0 == p.pid && s.1 > 0.0))
                .map(|p| Victim {
                    c: ci,
                    g: gi,
                    proc_: *p,
                }),
        );
    }
}
