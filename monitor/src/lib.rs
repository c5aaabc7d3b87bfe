//! `vgpuctl monitor`: a Prometheus exporter of the state root's quotas and usage and of NVML's truth, with
//! the NVML-truth watchdog. A collector thread reads everything once per interval (the state root, NVML,
//! the attribution of NVML's processes to containers) and runs the watchdog pass on that reading: it logs
//! each finding once when it begins (stderr) and, under the kill policy, SIGKILLs the processes that put a
//! container over its quota, and those the share wall or the time-quanta arbiter found running GPU work on
//! while their container is frozen, each through a pidfd and only while it is still the process attributed
//! (`vgpu_host::procs::kill_checked`). Containers whose recorded init is gone name no process
//! (`vgpu_host::usage::mark_live`). The HTTP server (`http`) answers `GET /metrics` from the last reading, so a
//! scrape costs the encoding alone and any number of scrapers add no reads
//! (`vgpu_monitor_reading_age_seconds` says how old it is). Takes no lock on a ledger, and writes to the
//! state root only as the time-quanta arbiter (`turns`: the turn words of oversubscribed ledgers, its
//! host-only files under `<root>/turns/`). /proc is read through `vgpu_host::procs`. The state root's figures, which process is whose
//! and what a container holds are the host tools' (`vgpu_host::usage`, `attribution`, `held`). Modules: `watchdog` (decisions), `metrics` (the text), `labels` (label values, escaped), `http` (the
//! server), `docker` (the names Docker gave its containers, asked of dockerd), `config` (its settings), the compute share's host wall (`share_wall` its decisions,
//! `share_run` its passes, `freezer` the cgroup writes), the time-quanta arbiter of oversubscribed GPUs (`turns`, a thread of its own);
//! NVML is the host tools' one binding,
//! `vgpu_host::nvml`.

pub mod config;
pub mod docker;
pub mod freezer;

pub mod http;
pub mod labels;
pub mod metrics;
pub mod share_run;
pub mod share_wall;

pub mod turns;
pub mod watchdog;

use metrics::WatchdogView;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vgpu_host::attribution::{self, Truth};
use vgpu_host::nvml::{GpuReading, Nvml};
use vgpu_host::procs;
use vgpu_host::state_root::StateRoot;
use vgpu_host::usage;
use vgpu_ledger::format_bytes;
use watchdog::{Finding, Policy};

/// A running monitor: what it reads and what its watchdog has seen.
pub struct Monitor {
    root: StateRoot,
    nvml: Option<Box<dyn Nvml>>,
    policy: Policy,
    watch: Mutex<Watch>,
    /// The compute share's wall (off until `with_share_wall`).
    share: share_run::ShareRun,
    /// The last collection, which scrapes serve.
    last: Mutex<Option<Arc<Collected>>>,
    build: metrics::BuildInfo,
    /// HAMi's `node` label.
    node: String,
    /// Docker's names for the `container` label (asking nothing until `set_docker_socket`).
    docker: Mutex<docker::Cache>,
    /// The time-quanta arbiter of oversubscribed GPUs (none until `with_turns`).
    turns: Option<Arc<turns::run::Arbiter>>,
}

/// One collection: a reading, when it was finished and how long it took.
pub struct Collected {
    pub reading: Reading,
    pub at: Instant,
    pub took: Duration,
}

/// The watchdog's memory between passes.
#[derive(Default)]
struct Watch {
    /// Findings open after the last pass: (container id, GPU uuid, kind) → the container's labels.
    open: BTreeMap<(String, String, &'static str), metrics::Labels>,
    events: BTreeMap<&'static str, u64>,
    kills: u64,
    kill_failures: u64,
    passes: u64,
    /// What each pending shrink still allows, as the truth went down (`watchdog::Shrinks`).
    shrinks: watchdog::Shrinks,
}

/// One reading of everything: the state root, NVML and the attribution of NVML's processes.
pub struct Reading {
    pub containers: Vec<usage::ContainerState>,
    pub gpus: Option<Vec<GpuReading>>,
    pub truth: Truth,
    pub state_error: Option<String>,
}

/// One log line on stderr: a finding names the tenant's pod and container, so control characters are
/// escaped (a name cannot forge a "killed pid" line or drive the operator's terminal).
pub(crate) fn log(msg: &str) {
    eprintln!("vgpuctl monitor: {}", vgpu_host::printable::printable(msg));
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
        Monitor {
            root,
            nvml,
            policy,
            watch: Mutex::new(Watch::default()),
            share: share_run::ShareRun::new(
                vgpu_host::config::ShareWall::Off,
                share_wall::Settings {
                    window: Duration::from_secs(10),
                    tolerance: 0.05,
                },
                policy.kill,
            ),
            last: Mutex::new(None),
            build: metrics::BuildInfo::default(),
            node: String::new(),
            docker: Mutex::new(docker::Cache::new(None, docker::DEADLINE)),
            turns: None,
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
        self.share = share_run::ShareRun::new(mode, settings, self.policy.kill);
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
        let gpus = self.nvml.as_ref().and_then(|n| n.readings().ok());
        let truth = attribution::attribute(
            &containers,
            gpus.as_deref().unwrap_or_default(),
            procs::inspect,
            procs::own_ns(),
        );
        Reading {
            containers,
            gpus,
            truth,
            state_error,
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
        let r = &c.reading;
        let victims = self.share.pass(&r.containers, &r.truth, r.gpus.as_deref());
        self.kill_runaways(r, &victims, "the share wall");
        c
    }

    /// Kills, under the kill policy, the processes the share wall or the time-quanta arbiter (`by`) found
    /// busy while their container is frozen (`share_run::Victim`), as the watchdog kills: through a pidfd,
    /// only while each is still the process NVML listed and still the container's. Counted with the
    /// watchdog's kills.
    fn kill_runaways(&self, r: &Reading, victims: &[share_run::Victim], by: &str) {
        if victims.is_empty() {
            return;
        }
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        for v in victims {
            let (cs, pid) = (&r.containers[v.c], v.proc_.pid);
            match self.kill(r, v.c, &v.proc_) {
                Ok(()) => {
                    w.kills += 1;
                    log(&format!(
                        "killed pid {pid} (SIGKILL) of {} on GPU {}: its work ran on while the container was frozen ({by})",
                        who(cs),
                        cs.gpus[v.g].uuid
                    ));
                }
                Err(e) => {
                    w.kill_failures += 1;
                    log(&format!("could not kill pid {pid} of {}: {e:#}", who(cs)));
                }
            }
        }
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
        // The share wall's findings are the watchdog's `over_share` and `busy_while_frozen`.
        if share.events > 0 {
            view.events.push(("over_share", share.events));
        }
        if share.runaway_events > 0 {
            view.events
                .push(("busy_while_frozen", share.runaway_events));
        }
        view.open
            .extend(share.open.iter().map(|l| (l.clone(), "over_share")));
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
            if let Some(t) = &turns {
                t.register(
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

    /// One watchdog pass over `r`: findings logged when they begin, kills under the policy. Nothing to do
    /// without NVML.
    fn pass_on(&self, r: &Reading) {
        if r.gpus.is_none() {
            return;
        }
        let mut w = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let findings = watchdog::decide(&r.containers, &r.truth, self.policy, &w.shrinks);
        // A state root that could not be listed shows no container: their marks are kept for the next.
        if r.state_error.is_none() {
            w.shrinks.follow(&r.containers, &r.truth);
        }
        w.passes += 1;
        let mut open = BTreeMap::new();
        for f in &findings {
            let (c, g, kind) = f.key();
            let (cs, gs) = (&r.containers[c], &r.containers[c].gpus[g]);
            let key = (cs.id.clone(), gs.uuid.clone(), kind);
            if !w.open.contains_key(&key) {
                *w.events.entry(kind).or_default() += 1;
                log(&describe(f, r));
            }
            open.insert(key, metrics::container_labels(cs, g));
            if let Finding::OverQuota { kill, procs, .. } = f {
                for &pid in kill {
                    let Some(p) = procs.iter().find(|p| p.pid == pid) else {
                        continue;
                    };
                    match self.kill(r, c, p) {
                        Ok(()) => {
                            w.kills += 1;
                            log(&format!(
                                "killed pid {pid} (SIGKILL) of {} on GPU {}: the container was over its quota",
                                who(cs),
                                gs.uuid
                            ));
                        }
                        Err(e) => {
                            w.kill_failures += 1;
                            log(&format!("could not kill pid {pid} of {}: {e:#}", who(cs)));
                        }
                    }
                }
            }
        }
        w.open = open;
    }

    /// SIGKILLs `p`, attributed to container `c`, if it is still that process and still the container's,
    /// through a pidfd (`procs::kill_checked`): the same start time, the container's as `/proc` shows it
    /// now, and the container's init still alive. A PID reused since NVML listed it is left alone.
    fn kill(
        &self,
        r: &Reading,
        c: usize,
        p: &attribution::TrueProc,
    ) -> Result<(), procs::KillError> {
        let seen = procs::HostProc {
            pid: p.pid,
            start_time: p.start_time,
            ..Default::default()
        };
        procs::kill_checked(&seen, |now| {
            if !r.containers[c].init_alive(procs::init_alive) {
                return Err("the container's init process is gone");
            }
            match attribution::owner_of(&r.containers, now, procs::own_ns()) == Some(c) {
                true => Ok(()),
                false => Err("the process no longer belongs to the container"),
            }
        })?;
        Ok(())
    }
}

/// "container ID (pod NS/POD, container NAME)".
fn who(c: &usage::ContainerState) -> String {
    match &c.names {
        Some(n) => format!(
            "container {} (pod {}/{}, container {})",
            c.id, n.namespace, n.pod, n.container
        ),
        None => format!("container {}", c.id),
    }
}

/// The log line of a finding.
fn describe(f: &Finding, r: &Reading) -> String {
    let (c, g, _) = f.key();
    let (cs, gs) = (&r.containers[c], &r.containers[c].gpus[g]);
    let at = format!("{} GPU {} ({})", who(cs), gs.index, gs.uuid);
    match f {
        Finding::OverQuota { truth, limit, allowed, procs, kill, .. } => {
            let list: Vec<String> = procs
                .iter()
                .map(|p| {
                    format!(
                        "pid {} {}{}",
                        p.pid,
                        format_bytes(p.used),
                        if p.tracked { "" } else { " without a ledger slot" }
                    )
                })
                .collect();
            let shrink = match allowed > limit {
                true => format!(" (lowered by vgpuctl update; it may keep {} held from before)", format_bytes(*allowed)),
                false => String::new(),
            };
            format!(
                "over quota: {at}: its processes hold {} (NVML), quota {}{shrink}, ledger {}: {}{}",
                format_bytes(*truth),
                format_bytes(*limit),
                format_bytes(gs.total),
                list.join(", "),
                if kill.is_empty() { "" } else { "; killing under the kill policy" }
            )
        }
        Finding::PendingShrink {
            truth, limit, from, held, ..
        } => format!(
            "pending shrink: {at}: its processes hold {} (NVML), over its quota {} by {} since vgpuctl update lowered it from {}; its allocations are refused until it frees that, nothing is killed while it holds no more than {} (what it held at the shrink, or less since)",
            format_bytes(*truth),
            format_bytes(*limit),
            format_bytes(truth.saturating_sub(*limit)),
            format_bytes(*from),
            format_bytes(*held)
        ),
        Finding::LedgerBelowTruth { total, truth, .. } => format!(
            "ledger below the truth: {at}: its ledger's total is {}, its own processes hold {} (NVML): tampered with or charges lost",
            format_bytes(*total),
            format_bytes(*truth)
        ),
        Finding::LedgerInconsistent { total, slots_sum, .. } => format!(
            "ledger inconsistent: {at}: its total is {}, its slots add up to {}",
            format_bytes(*total),
            format_bytes(*slots_sum)
        ),
    }
}

/// Why the monitor stopped (it runs until one of these).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// SIGTERM and SIGINT could not be blocked for the thread that waits for them.
    #[error(transparent)]
    Signals(#[from] nix::errno::Errno),
    /// A thread (the collector, or the one that waits for the stop signals) could not be started, or the
    /// HTTP server stopped.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Collects (and runs the watchdog) every `interval` and serves `GET /metrics` and `GET /healthz` on
/// `listener` (`http`); returns only on error.
pub fn run(
    monitor: Arc<Monitor>,
    listener: TcpListener,
    interval: Duration,
) -> Result<(), RunError> {
    // SIGTERM and SIGINT are taken by a thread of their own (blocked here, before any thread starts, so
    // every thread inherits the mask): what the share wall froze is thawed before the monitor exits.
    use nix::sys::signal::{SigSet, Signal};
    let mut stop = SigSet::empty();
    stop.add(Signal::SIGTERM);
    stop.add(Signal::SIGINT);
    stop.thread_block()?;
    let m = monitor.clone();
    std::thread::Builder::new()
        .name("stop".into())
        .spawn(move || {
            if let Ok(sig) = stop.wait() {
                m.share.thaw_all();
                if let Some(a) = &m.turns {
                    a.stop();
                }
                std::process::exit(128 + sig as i32);
            }
        })?;
    // The first reading is made before the first request is accepted: a scrape never waits for one.
    monitor.collect();
    if let Some(a) = monitor.turns.clone() {
        // Its own thread, beating every tick: a collection that takes long never stalls a turn.
        a.thaw_left_frozen();
        let m = monitor.clone();
        let tick = a.turns().tick;
        std::thread::Builder::new()
            .name("turns".into())
            .spawn(move || loop {
                m.turns_tick();
                std::thread::sleep(tick);
            })?;
    }
    let m = monitor.clone();
    std::thread::Builder::new()
        .name("collector".into())
        .spawn(move || loop {
            // Wakes to thaw what the share wall froze when its time is up.
            m.share.sleep(interval);
            m.collect();
        })?;
    Ok(http::serve(
        monitor,
        listener,
        http::LIMITS,
        interval * 3 + Duration::from_secs(30),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_host::nvml::Fake;

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
}
