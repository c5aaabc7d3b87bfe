//! The collector: a `Monitor` and its readings. Each collection reads everything once (the state root
//! through `vgpu_host::usage`, NVML, the attribution of NVML's processes to containers), runs the watchdog
//! pass and the share wall's on it (`kill`) and keeps it for the scrapes, which encode the last one
//! (`scrape`). Not here: HAMi's containers in a reading (`hami`), what is wrong and what is killed
//! (`watchdog`, `kill`), the loop and the server (`serve`, `http`), the text (`metrics`).

mod hami;

use crate::metrics::{self, WatchdogView};
use crate::stderr::log;
use crate::{docker, share_run, share_wall, turns, unattributed, watchdog};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vgpu_host::attribution::{self, Truth};
use vgpu_host::config::HamiContainers;
use vgpu_host::nvml::{GpuReading, Nvml};
use vgpu_host::procs;
use vgpu_host::state_root::StateRoot;
use vgpu_host::usage;
use watchdog::Policy;

/// A running monitor: what it reads and what its watchdog has seen.
pub struct Monitor {
    root: StateRoot,
    nvml: Option<Box<dyn Nvml>>,
    pub(crate) policy: Policy,
    /// When memory no process's figure shows is logged, and whose it likely is.
    unattributed: unattributed::Settings,
    pub(crate) watch: Mutex<Watch>,
    /// The compute share's wall (off until `with_share_wall`).
    pub(crate) share: share_run::ShareRun,
    /// The last collection, which scrapes serve.
    last: Mutex<Option<Arc<Collected>>>,
    build: metrics::BuildInfo,
    /// HAMi's `node` label.
    node: String,
    /// Docker's names for the `container` label (asking nothing until `set_docker_socket`).
    docker: Mutex<docker::Cache>,
    /// The time-quanta arbiter of oversubscribed GPUs (none until `with_turns`).
    pub(crate) turns: Option<Arc<turns::run::Arbiter>>,
    /// HAMi's per-container folders (not looked at until `with_hami`).
    hami: HamiWatch,
}

/// Where HAMi's per-container folders are looked for, and the lines the last collection had to say about
/// them: a line is logged when it first appears, so a bad file is one line however long it stays.
#[derive(Default)]
struct HamiWatch {
    setting: Option<HamiContainers>,
    /// Where their bundles are (`vgpu_host::hami::bundle`; `Auto`: containerd's default).
    tasks: HamiContainers,
    said: Mutex<BTreeSet<String>>,
}

/// One collection: a reading, when it was finished and how long it took.
pub struct Collected {
    pub reading: Reading,
    pub at: Instant,
    pub took: Duration,
}

/// The watchdog's memory between passes.
#[derive(Default)]
pub(crate) struct Watch {
    /// Findings open after the last pass: (container id, GPU uuid, kind) → the container's labels.
    pub(crate) open: BTreeMap<(String, String, &'static str), metrics::Labels>,
    pub(crate) events: BTreeMap<&'static str, u64>,
    pub(crate) kills: u64,
    pub(crate) kill_failures: u64,
    pub(crate) passes: u64,
    /// What each pending shrink still allows, as the truth went down (`watchdog::Shrinks`).
    pub(crate) shrinks: watchdog::Shrinks,
    /// Each GPU's unattributed memory, collection after collection (`unattributed::Episodes`).
    pub(crate) unattributed: unattributed::Episodes,
}

/// One reading of everything: the state root, NVML and the attribution of NVML's processes.
pub struct Reading {
    pub containers: Vec<usage::ContainerState>,
    pub gpus: Option<Vec<GpuReading>>,
    pub truth: Truth,
    /// Per GPU, its used memory that no process's figure shows (`unattributed`).
    pub unattributed: Vec<unattributed::Remainder>,
    pub state_error: Option<String>,
    /// The files of HAMi's per-container folders skipped (`vgpu_host::hami::Skipped`); None when no folder
    /// of HAMi's was read.
    pub hami_skipped: Option<usize>,
}

impl Monitor {
    /// A monitor of `root`; NVML that cannot be loaded is reported once and the ledgers are still served.
    pub fn new(root: StateRoot, nvml_library: &str, policy: Policy) -> Monitor {
        let nvml = vgpu_host::nvml::open(nvml_library)
            .map_err(|e| {
                log(&format!(
                    "{e}; serving the ledgers' figures only, no watchdog"
                ))
            })
            .ok();
        Monitor::with_nvml(root, nvml, policy)
    }

    /// A monitor of `root` reading `nvml` (none: the ledgers' figures only, no watchdog).
    pub fn with_nvml(root: StateRoot, nvml: Option<Box<dyn Nvml>>, policy: Policy) -> Monitor {
        let share = share_run::ShareRun::new(
            vgpu_host::config::ShareWall::Off,
            share_wall::Settings {
                window: Duration::from_secs(10),
                tolerance: 0.05,
            },
            policy.kill,
        )
        .with_record(&root);
        Monitor {
            root,
            nvml,
            policy,
            unattributed: unattributed::Settings {
                tolerance: policy.tolerance,
                ..Default::default()
            },
            watch: Mutex::new(Watch::default()),
            share,
            last: Mutex::new(None),
            build: metrics::BuildInfo::default(),
            node: String::new(),
            docker: Mutex::new(docker::Cache::new(None, docker::DEADLINE)),
            turns: None,
            hami: HamiWatch::default(),
        }
    }

    /// This monitor with the time-quanta arbiter (`turns`), which `run` starts in a thread of its own.
    /// Under the kill policy it also kills what runs on while it holds it frozen.
    pub fn with_turns(mut self, arbiter: turns::run::Arbiter) -> Monitor {
        self.turns = Some(Arc::new(arbiter.with_kill(self.policy.kill)));
        self
    }

    /// One pass of the arbiter over the last collection (none yet: nothing).
    pub fn turns_tick(&self) {
        let Some(a) = &self.turns else { return };
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let victims = a.tick(last.as_ref().map(|c| turns::run::Collection {
            containers: &c.reading.containers,
            gpus: c.reading.gpus.as_deref(),
            truth: &c.reading.truth,
            at: c.at,
        }));
        if let Some(c) = &last {
            self.kill_runaways(&c.reading, &victims, "the time-quanta arbiter");
        }
    }

    /// This monitor with the compute share's wall set to `mode` (under the kill policy it also kills
    /// what runs on while frozen).
    pub fn with_share_wall(
        mut self,
        mode: vgpu_host::config::ShareWall,
        settings: share_wall::Settings,
    ) -> Monitor {
        self.share =
            share_run::ShareRun::new(mode, settings, self.policy.kill).with_record(&self.root);
        self
    }

    /// This monitor logging a GPU's unattributed memory past `threshold` once it lasted `scans`
    /// collections (the holder is named past the watchdog's tolerance, which stays the policy's).
    pub fn with_unattributed(mut self, threshold: u64, scans: u32) -> Monitor {
        self.unattributed.threshold = threshold;
        self.unattributed.scans = scans;
        self
    }

    /// Names the node on the host GPUs' series (HAMi's `node` label).
    pub fn set_node(&mut self, node: String) {
        self.node = node;
    }

    /// Asks dockerd at `socket` for the names of containers Kubernetes did not name (`docker::socket`).
    pub fn set_docker_socket(&mut self, socket: Option<std::path::PathBuf>) {
        self.docker = Mutex::new(docker::Cache::new(socket, docker::DEADLINE));
    }

    /// Says what the binary was built from (`vgpu_build_info`).
    pub fn set_build(&mut self, build: metrics::BuildInfo) {
        self.build = build;
    }

    /// Reads the state root and NVML now.
    pub fn read(&self) -> Reading {
        let (mut containers, state_error) = match usage::read(&self.root) {
            Ok(c) => (c, None),
            Err(e) => (vec![], Some(e.to_string())),
        };
        usage::mark_live(&mut containers, procs::init_alive);
        for line in
            crate::older::record_missing(&self.root, &mut containers, &crate::older::Host::real())
        {
            log(&line);
        }
        let unnamed: Vec<String> = containers
            .iter()
            .filter(|c| c.names.is_none())
            .map(|c| c.id.clone())
            .collect();
        if !unnamed.is_empty() {
            let mut docker = self.docker.lock().unwrap_or_else(|e| e.into_inner());
            let found = docker.names(&unnamed);
            for (c, n) in containers
                .iter_mut()
                .filter(|c| c.names.is_none())
                .zip(found)
            {
                c.docker_name = n;
            }
        }
        // NVML read right before the attribution (a process it lists may be gone a moment later).
        let gpus = self.nvml.as_ref().and_then(|n| n.readings().ok());
        let (mut hami, hami_skipped) = self.read_hami(gpus.as_deref().unwrap_or_default());
        usage::mark_live(&mut hami, procs::init_alive);
        containers.extend(hami);
        let truth = attribution::attribute(
            &containers,
            gpus.as_deref().unwrap_or_default(),
            procs::inspect,
            procs::own_ns(),
        );
        let unattributed = unattributed::remainders(
            &containers,
            gpus.as_deref().unwrap_or_default(),
            &truth,
            self.unattributed,
        );
        Reading {
            containers,
            gpus,
            truth,
            unattributed,
            state_error,
            hami_skipped,
        }
    }

    /// Reads everything now, runs the watchdog pass on it and keeps it for the scrapes: what the collector
    /// thread does every interval.
    pub fn collect(&self) -> Arc<Collected> {
        let t = Instant::now();
        let reading = self.read();
        let c = Arc::new(Collected {
            reading,
            at: Instant::now(),
            took: t.elapsed(),
        });
        // Served before the pass logs anything: a finding in the log is never newer than the scrape.
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        self.pass_on(&c.reading);
        self.unattributed_pass(&c.reading);
        let r = &c.reading;
        let victims = self.share.pass(&r.containers, &r.truth, r.gpus.as_deref());
        self.kill_runaways(r, &victims, "the share wall");
        c
    }

    /// The last collection; one made now if there is none yet (the first scrape after the start).
    pub fn latest(&self) -> Arc<Collected> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        last.unwrap_or_else(|| self.collect())
    }

    /// The text of one scrape: the last collection, encoded.
    pub fn scrape(&self) -> String {
        let c = self.latest();
        let r = &c.reading;
        let mut view = self.watchdog_view();
        let share = self.share.view(&r.containers, |c, g| {
            metrics::container_labels(&r.containers[c], g)
        });
        // The share wall's findings are the watchdog's `over_share`, `busy_while_frozen` and
        // `over_entitlement`.
        if share.events > 0 {
            view.events.push(("over_share", share.events));
        }
        if share.runaway_events > 0 {
            view.events
                .push(("busy_while_frozen", share.runaway_events));
        }
        if share.floor_events > 0 {
            view.events.push(("over_entitlement", share.floor_events));
        }
        view.open
            .extend(share.open.iter().map(|l| (l.clone(), "over_share")));
        view.open.extend(
            share
                .floor_open
                .iter()
                .map(|l| (l.clone(), "over_entitlement")),
        );
        view.open.extend(
            share
                .runaway_open
                .iter()
                .map(|l| (l.clone(), "busy_while_frozen")),
        );
        let turns = self.turns.as_ref().map(|a| {
            a.view(|id, uuid| {
                let c = r.containers.iter().position(|c| c.id == id)?;
                let g = r.containers[c].gpus.iter().position(|g| g.uuid == uuid)?;
                Some((c, g))
            })
        });
        let scrape = metrics::Scrape {
            share: &share,
            build: self.build,
            node: &self.node,
            containers: &r.containers,
            gpus: r.gpus.as_deref(),
            truth: &r.truth,
            watchdog: &view,
            state_error: r.state_error.as_deref(),
            collection: Some(metrics::Collection {
                age: c.at.elapsed(),
                took: c.took,
            }),
        };
        metrics::render_with(&scrape, |reg| {
            if let Some(n) = r.hami_skipped {
                metrics::hami_skipped(reg, n);
            }
            metrics::unattributed::register(
                &self.node,
                r.gpus.as_deref().unwrap_or_default(),
                &r.containers,
                &r.unattributed,
                reg,
            );
            if let Some(t) = &turns {
                metrics::turns::register(
                    t,
                    reg,
                    |uuid| {
                        vec![
                            ("node", self.node.clone().into()),
                            ("device_uuid", uuid.to_string().into()),
                        ]
                    },
                    |c, g| metrics::container_labels(&r.containers[c], g),
                );
            }
        })
    }

    /// Logs each GPU's unattributed memory that stayed past the threshold (`unattributed::Episodes`), counted
    /// as the watchdog's `unattributed_memory` events. Nothing without NVML.
    fn unattributed_pass(&self, r: &Reading) {
        if r.gpus.is_none() {
            return;
        }
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        for ev in w.unattributed.scan(&r.unattributed, self.unattributed) {
            if let unattributed::Event::Began(_) = ev {
                *w.events.entry("unattributed_memory").or_default() += 1;
            }
            log(&unattributed::describe(
                &ev,
                &r.unattributed,
                &r.containers,
                self.unattributed,
            ));
        }
    }

    fn watchdog_view(&self) -> WatchdogView {
        let w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        WatchdogView {
            events: w.events.iter().map(|(k, v)| (*k, *v)).collect(),
            kills: w.kills,
            kill_failures: w.kill_failures,
            open: w
                .open
                .iter()
                .map(|((_, _, k), l)| (l.clone(), *k))
                .collect(),
            passes: w.passes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_host::nvml::{Fake, Nvml};

    const POLICY: Policy = Policy {
        tolerance: 64 << 20,
        kill: false,
    };

    /// The monitor reads NVML through the host tools' one binding: a fake stands in for it here, and a
    /// driver that fails is reported as down while the ledgers are still served.
    #[test]
    fn nvml_through_the_seam_up_with_its_gpus_or_down() {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().to_path_buf());
        let mut fake = Fake::gpus(2, 16 << 30);
        fake.gpus[1].used = 1 << 30;
        let m = Monitor::with_nvml(root.clone(), Some(Box::new(fake)), POLICY);
        let text = m.scrape();
        assert!(text.lines().any(|l| l == "vgpu_nvml_up 1"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("hami_host_gpu_memory_used_bytes{")
                    && l.contains("GPU-fa4ec0de-0000-4000-8000-000000000001")
                    && l.ends_with(" 1073741824")),
            "{text}"
        );
        let broken = Fake {
            fail: Some("Unknown Error (error 999)".into()),
            ..Fake::gpus(1, 16 << 30)
        };
        let m = Monitor::with_nvml(root.clone(), Some(Box::new(broken)), POLICY);
        let text = m.scrape();
        assert!(text.lines().any(|l| l == "vgpu_nvml_up 0"), "{text}");
        let m = Monitor::with_nvml(root, None, POLICY);
        assert!(m.scrape().lines().any(|l| l == "vgpu_nvml_up 0"));
    }

    /// A container of HAMi's folders in the scrape: its pod UID and container name as labels, the usage
    /// and quota its ledger holds, GPU 1 its index 0 (the only GPU of the container); a link and an
    /// oversized file beside its ledger counted as skipped; nothing of HAMi's served while off.
    #[test]
    fn hamis_folders_are_containers_of_the_scrape() {
        use vgpu_ledger::{Kind, Ledger};
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::new(d.path().join("state"));
        let hami = d.path().join("containers");
        let pod = "7c0e3d1a-0000-4000-8000-000000000002";
        let dir = hami.join(format!("{pod}_main"));
        std::fs::create_dir_all(&dir).unwrap();
        let u1 = "GPU-fa4ec0de-0000-4000-8000-000000000001";
        let l =
            Ledger::open_or_create(&dir.join(format!("{pod}.cache.{u1}")), u1, 1 << 30).unwrap();
        let slot = l.attach().unwrap();
        l.charge(&slot, Kind::Data, 300 << 20, 1 << 30).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(format!("evil.cache.{u1}"))).unwrap();
        let big = std::fs::File::create(dir.join(format!("big.cache.{u1}"))).unwrap();
        big.set_len(64 << 20).unwrap();
        let nvml = || Some(Box::new(Fake::gpus(2, 16 << 30)) as Box<dyn Nvml>);
        let m = Monitor::with_nvml(root.clone(), nvml(), POLICY)
            .with_hami(HamiContainers::Dir(hami.clone()));
        let text = m.scrape();
        let labels = format!(
            "namespace=\"\",pod=\"{pod}\",container=\"main\",container_id=\"hami/{pod}_main\",vdevice_index=\"0\",device_uuid=\"{u1}\""
        );
        for want in [
            format!("vgpu_memory_used_bytes{{{labels}}} 314572800"),
            format!("vgpu_memory_limit_bytes{{{labels}}} 1073741824"),
            format!("vgpu_ledger_processes{{{labels}}} 1"),
            format!("vgpu_memory_used_by_kind_bytes{{{labels},kind=\"data\"}} 314572800"),
            format!("hami_vgpu_memory_used_bytes{{zone=\"vGPU\",namespace=\"\",pod=\"{pod}\",container=\"main\",vdevice_index=\"0\",device_uuid=\"{u1}\"}} 314572800"),
            "vgpu_hami_skipped_files 2".to_string(),
        ] {
            assert!(text.lines().any(|l| l == want), "{want}\n{text}");
        }
        // HAMi's scheduler commits its containers: vgpu's allocation series count none of them.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("hami_gpu_memory_allocated_bytes{")
                    && l.contains(u1)
                    && !l.ends_with(" 0")),
            "{text}"
        );
        let m = Monitor::with_nvml(root.clone(), nvml(), POLICY).with_hami(HamiContainers::Off);
        let text = m.scrape();
        assert!(
            !text.contains("hami/") && !text.contains("vgpu_hami_skipped_files"),
            "{text}"
        );
        // A folder set but missing: nothing reported (the line is logged once).
        let m = Monitor::with_nvml(root, nvml(), POLICY)
            .with_hami(HamiContainers::Dir(d.path().join("none")));
        assert!(!m.scrape().contains("hami/"));
        drop((slot, l));
    }
}
