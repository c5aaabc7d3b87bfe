//! vgpuctl's command line: the subcommands (runtime, cdi, doctor, status, update, gc, monitor, generate-docs),
//! each handed to the library module that owns it (`engines::cli`, `vgpu_host::cdi`, `doctor`, `status`, `update`,
//! `vgpu_host::gc`, `monitor`, `clidocs`).

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use vgpu_host::state_root::StateRoot;

/// vgpuctl: configure container engines for vgpu and show GPU memory usage.
#[derive(Parser)]
#[command(version = vgpu_host::version::LONG)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Configure a container engine to run containers through vgpu, or take that back.
    #[command(subcommand)]
    Runtime(vgpuctl::engines::cli::RuntimeCmd),
    /// Container Device Interface: vgpu's GPUs as CDI devices (vgpu.io/gpu=<index|uuid|all>).
    #[command(subcommand)]
    Cdi(CdiCmd),
    /// Check this node's vgpu setup, one line per check: the config, the engines' entries, NVML and the
    /// driver, NVIDIA's runtime or CDI spec, vgpu's CDI spec, the state root, the installed files. Exit status:
    /// 0 all well, 1 a check failed, 2 warnings only.
    Doctor(vgpuctl::doctor::cli::DoctorArgs),
    /// Show quota, usage by kind and processes per container and GPU (read-only).
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        root: RootArgs,
    },
    /// Change a running container's memory quota, compute share or pacing window without restarting it,
    /// through admission as at creation; its processes see the change within a second. Only containers
    /// vgpu provisioned (an engine with vgpu's runtime, hook or CDI devices): a process limited by the
    /// environment alone (LD_PRELOAD with CUDA_DEVICE_MEMORY_LIMIT) has nothing on the host to update.
    Update(vgpuctl::update::UpdateArgs),
    /// Serve Prometheus metrics (quotas, usage, NVML's truth) and run the NVML-truth watchdog.
    Monitor(MonitorArgs),
    /// Remove the state of containers that are gone (whose poststop hook never came).
    Gc {
        #[command(flatten)]
        root: RootArgs,
    },
    /// Write vgpuctl's shell completions and the man pages of vgpuctl, vgpu-hook and vgpu-container-runtime
    /// under DIR (package builds).
    #[command(hide = true)]
    GenerateDocs { dir: PathBuf },
}

#[derive(Subcommand)]
enum CdiCmd {
    /// Write a CDI spec whose devices vgpu.io/gpu=<index|uuid|all> give a container vgpu's quota with no
    /// runtime shim or hooks.d file: `podman run --device nvidia.com/gpu=0 --device vgpu.io/gpu=0
    /// --annotation vgpu.io/memory-limit=4Gi ...` (NVIDIA's devices from its own spec, `nvidia-ctk cdi
    /// generate`). Run it again when the GPUs change.
    Generate {
        /// Where to write it; `.json` writes JSON, anything else YAML; `-` prints it.
        #[arg(long, value_name = "PATH", default_value = vgpu_host::cdi::DEFAULT_OUTPUT)]
        output: PathBuf,
        /// NVML library listing the GPUs (default: the config's nvml_library).
        #[arg(long)]
        nvml_library: Option<String>,
        /// The vgpu-hook the spec's hooks run (default: the config's hook_path).
        #[arg(long)]
        hook_path: Option<PathBuf>,
    },
}

#[derive(Args)]
struct MonitorArgs {
    /// Address to serve /metrics on (default: [monitor] listen, else 127.0.0.1:9394).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Seconds between watchdog passes (default: [monitor] interval_seconds, else 10).
    #[arg(long, value_name = "SECONDS")]
    interval: Option<u64>,
    /// Bytes over a quota not reported, e.g. 64Mi (default: [monitor] tolerance, else 64Mi).
    #[arg(long)]
    tolerance: Option<String>,
    /// SIGKILL the processes that put a container over its quota, and those whose GPU work runs on while
    /// the share wall or the time-quanta arbiter holds their container frozen (default: [monitor] kill,
    /// else off).
    #[arg(long)]
    kill: bool,
    /// NVML library (default: [monitor] nvml_library, else the config's nvml_library).
    #[arg(long)]
    nvml_library: Option<String>,
    /// The compute share wall: freeze (a container past its share + tolerance is frozen for its
    /// excess), report (findings only) or off (default: [monitor] share_wall, else freeze).
    #[arg(long, value_name = "MODE")]
    share_wall: Option<String>,
    /// Seconds over which the share wall lets a container run ahead of its share by the tolerance
    /// (default: [monitor] share_window_seconds, else 10).
    #[arg(long, value_name = "SECONDS")]
    share_window: Option<u64>,
    /// Points of the GPU's time past its share a container may use (default: [monitor]
    /// share_tolerance, else 5).
    #[arg(long, value_name = "POINTS")]
    share_tolerance: Option<f64>,
    /// A GPU's used memory that no process's NVML figure shows is logged past this, e.g. 256Mi (default:
    /// [monitor] unattributed_threshold, else 256Mi).
    #[arg(long, value_name = "QUANTITY")]
    unattributed_threshold: Option<String>,
    /// ... once it stayed past the threshold this many collections in a row (default: [monitor]
    /// unattributed_scans, else 3).
    #[arg(long, value_name = "N")]
    unattributed_scans: Option<u64>,
    /// Print one scrape on stdout and exit (no server, no watchdog).
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    root: RootArgs,
}

#[derive(Args)]
struct RootArgs {
    /// The state root (default: state_root from /etc/vgpu/config.toml, or the file VGPU_CONFIG names).
    #[arg(long)]
    state_root: Option<PathBuf>,
}

impl RootArgs {
    /// The state root: --state-root, else the vgpu config's.
    fn root(&self) -> Result<StateRoot> {
        match &self.state_root {
            Some(r) => Ok(StateRoot::new(r.clone())),
            None => Ok(StateRoot::new(
                vgpu_host::config::Config::load()?.state_root,
            )),
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match cli.cmd {
        Cmd::Runtime(r) => Ok(r.run(&mut out)?),
        Cmd::Cdi(CdiCmd::Generate {
            output,
            nvml_library,
            hook_path,
        }) => cdi_generate(&output, nvml_library, hook_path, &mut out),
        Cmd::Status { json, root } => {
            // The GPUs' memory and addressing mode for the per-GPU totals, and their memory no process's
            // figure shows, when NVML is there (status works without it).
            let cfg = vgpu_host::config::Config::load().ok();
            let nvml = cfg
                .as_ref()
                .and_then(|c| vgpu_host::nvml::open(&c.nvml_library).ok());
            let gpus = nvml
                .as_ref()
                .and_then(|n| n.devices().ok())
                .unwrap_or_default();
            let physical: Vec<(String, u64)> = gpus
                .iter()
                .map(|g| (g.uuid.clone(), g.total_memory))
                .collect();
            let addressing: Vec<_> = gpus
                .iter()
                .filter_map(|g| {
                    let mode = nvml.as_ref()?.addressing_mode(g.index).ok()??;
                    Some((g.uuid.clone(), mode))
                })
                .collect();
            let root = root.root()?;
            let mut status = vgpuctl::status::collect(&root, &physical)?;
            status.note_addressing(&addressing);
            // HAMi's per-container folders, where the monitor looks for them ([monitor] of the config).
            let hami = cfg
                .as_ref()
                .and_then(|c| c.monitor().ok())
                .map(|t| t.hami_containers_dir.clone())
                .unwrap_or_default();
            if let Some(dir) = hami.dir() {
                let mut order: Vec<_> = gpus.iter().collect();
                order.sort_by_key(|g| g.index);
                let order: Vec<String> = order.into_iter().map(|g| g.uuid.clone()).collect();
                status.note_hami(dir, hami.is_set(), &order);
                // The quotas containerd's bundles hold, as the monitor enforces them ([monitor] hami_task_dir).
                let tasks = cfg
                    .as_ref()
                    .and_then(|c| c.monitor().ok())
                    .map(|t| t.hami_task_dir.clone())
                    .unwrap_or_default();
                let auto = std::path::Path::new(vgpu_host::hami::bundle::DEFAULT_TASK_DIR);
                if let Some(tasks) = tasks.dir_or(auto) {
                    status.note_hami_quotas(tasks, &order);
                }
                for line in &status.hami_skipped {
                    eprintln!(
                        "vgpuctl status: skipped in HAMi's folders: {}",
                        vgpu_host::printable::printable(line)
                    );
                }
            }
            if let Some(readings) = nvml.as_ref().and_then(|n| n.readings().ok()) {
                // The threshold and tolerance the monitor uses ([monitor] of the config, else the defaults).
                let table = cfg.as_ref().and_then(|c| c.monitor().ok());
                let settings = vgpu_monitor::unattributed::Settings {
                    threshold: table
                        .and_then(|t| t.unattributed_threshold)
                        .unwrap_or(vgpu_host::config::DEFAULT_UNATTRIBUTED_THRESHOLD),
                    scans: 1,
                    tolerance: table
                        .and_then(|t| t.tolerance)
                        .unwrap_or(vgpu_host::config::DEFAULT_TOLERANCE),
                };
                status.note_unattributed(&root, &readings, settings);
            }
            docker_names(&mut status);
            if status.wants_names() {
                let graphroot = vgpuctl::containers::podman_graphroot(
                    std::env::var("CONTAINERS_STORAGE_CONF").ok().as_deref(),
                );
                status.note_podman_names(&vgpuctl::containers::podman_names(&graphroot));
            }
            if json {
                serde_json::to_writer_pretty(&mut out, &status)?;
                writeln!(out)?;
            } else {
                vgpuctl::status::print_table(&status, &mut out)?;
            }
            Ok(())
        }
        Cmd::Doctor(a) => {
            let report = a.run()?;
            report.print(&mut out)?;
            out.flush()?;
            std::process::exit(report.exit_status());
        }
        Cmd::Update(a) => Ok(a.run(&mut out)?),
        Cmd::Monitor(a) => monitor(a, &mut out),
        Cmd::Gc { root } => {
            // The grace for state without an owner comes from the config, like the hooks' own collection.
            let cfg = vgpu_host::config::Config::load()?;
            let grace = std::time::Duration::from_secs(cfg.gc_pending_grace_seconds);
            let root = root
                .state_root
                .clone()
                .map(StateRoot::new)
                .unwrap_or_else(|| StateRoot::new(cfg.state_root));
            let report = vgpu_host::gc::collect_with(&root, grace)?;
            for id in &report.removed {
                writeln!(out, "removed {id}")?;
            }
            writeln!(
                out,
                "{} removed, {} kept (still running)",
                report.removed.len(),
                report.kept.len()
            )?;
            if !report.errors.is_empty() {
                anyhow::bail!(
                    "{} folder(s) could not be collected: {}",
                    report.errors.len(),
                    report.errors.join("; ")
                );
            }
            Ok(())
        }
        Cmd::GenerateDocs { dir } => {
            let others = [vgpu_oci::cli::hook_command(), vgpu_oci::cli::shim_command()];
            vgpuctl::clidocs::write_all(<Cli as clap::CommandFactory>::command(), &others, &dir)?;
            Ok(())
        }
    }
}

fn cdi_generate(
    output: &std::path::Path,
    nvml_library: Option<String>,
    hook_path: Option<PathBuf>,
    out: &mut dyn Write,
) -> Result<()> {
    use vgpu_host::cdi;
    let cfg = vgpu_host::config::Config::load()?;
    let lib = nvml_library.unwrap_or_else(|| cfg.nvml_library.clone());
    let gpus = vgpu_host::nvml::open(&lib)?.devices()?;
    let hook_path = hook_path.unwrap_or_else(|| cfg.hook_path.clone());
    let spec = cdi::build(&cdi::Inputs {
        gpus: &gpus,
        hook_path: &hook_path,
        hook_stage: cfg.hook_stage.as_str(),
        hook_env: vgpu_host::config::Config::hook_env(),
    })?;
    if output == std::path::Path::new("-") {
        out.write_all(cdi::render(&spec, cdi::Format::Yaml)?.as_bytes())?;
        return Ok(());
    }
    cdi::write(output, &cdi::render(&spec, cdi::Format::for_path(output))?)?;
    writeln!(
        out,
        "wrote {}: {} ({} GPU{}); run containers with NVIDIA's device and vgpu's, e.g. --device {}=0 --device {}=0 --annotation {}=4Gi",
        output.display(),
        spec.device_names().join(", "),
        gpus.len(),
        if gpus.len() == 1 { "" } else { "s" },
        vgpu_host::keys::cdi::NVIDIA_KIND,
        vgpu_host::keys::cdi::KIND,
        vgpu_ledger::keys::annotation::MEMORY_LIMIT,
    )?;
    Ok(())
}

fn monitor(a: MonitorArgs, out: &mut dyn Write) -> Result<()> {
    use vgpu_monitor::{config, watchdog::Policy, Monitor};
    let cfg = vgpu_host::config::Config::load()?;
    let flags = config::Flags {
        listen: a.listen,
        interval_seconds: a.interval,
        tolerance: a.tolerance,
        kill: a.kill,
        nvml_library: a.nvml_library,
        share_wall: a.share_wall,
        share_window_seconds: a.share_window,
        share_tolerance: a.share_tolerance,
        unattributed_threshold: a.unattributed_threshold,
        unattributed_scans: a.unattributed_scans,
    };
    let s = config::Settings::new(cfg.monitor()?, flags, &cfg.nvml_library)?;
    let root = a
        .root
        .state_root
        .map(StateRoot::new)
        .unwrap_or_else(|| StateRoot::new(cfg.state_root));
    let policy = Policy {
        tolerance: s.tolerance,
        kill: s.kill,
    };
    let share = vgpu_monitor::share_wall::Settings {
        window: s.share_window,
        tolerance: s.share_tolerance / 100.0,
    };
    let mut m = Monitor::new(root.clone(), &s.nvml_library, policy)
        .with_unattributed(s.unattributed_threshold, s.unattributed_scans)
        .with_share_wall(s.share_wall, share)
        .with_hami(s.hami_containers.clone())
        .with_hami_tasks(s.hami_tasks.clone())
        .with_turns(vgpu_monitor::turns::run::Arbiter::new(
            s.turns,
            root.clone(),
            s.interval,
        ));
    m.set_node(s.node.clone());
    m.set_docker_socket(vgpu_monitor::docker::socket(
        std::env::var("DOCKER_HOST").ok().as_deref(),
    ));
    m.set_build(vgpu_monitor::metrics::BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        commit: vgpu_host::version::COMMIT,
    });
    let m = std::sync::Arc::new(m);
    if a.once {
        out.write_all(m.scrape().as_bytes())?;
        return Ok(());
    }
    let listener = std::net::TcpListener::bind(&s.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", s.listen))?;
    eprintln!(
        "vgpuctl monitor: serving http://{}/metrics for {}; watchdog every {} s, tolerance {}, kill {}; unattributed memory logged past {} for {} collections; share wall {}, window {} s, tolerance {} points; turns {}; HAMi's folders {}",
        listener.local_addr()?,
        root.root().display(),
        s.interval.as_secs(),
        vgpu_ledger::format_bytes(s.tolerance),
        if s.kill { "on" } else { "off" },
        vgpu_ledger::format_bytes(s.unattributed_threshold),
        s.unattributed_scans,
        s.share_wall.name(),
        s.share_window.as_secs(),
        s.share_tolerance,
        match s.turns {
            t if !t.enabled => "off".to_string(),
            t => format!(
                "on{}, quantum {} s, idle {} s, grace {} s",
                if t.force { " (forced)" } else { "" },
                t.quantum.as_secs_f64(),
                t.idle.as_secs_f64(),
                t.grace.as_secs_f64()
            ),
        },
        match &s.hami_containers {
            vgpu_host::config::HamiContainers::Off => "off".to_string(),
            h @ vgpu_host::config::HamiContainers::Auto => format!(
                "{} when it exists",
                h.dir().unwrap_or(std::path::Path::new("")).display()
            ),
            vgpu_host::config::HamiContainers::Dir(d) => d.display().to_string(),
        }
    );
    Ok(vgpu_monitor::run(m, listener, s.interval)?)
}

/// Names Docker's containers in `status` when dockerd's socket is there (DOCKER_HOST's, else the default);
/// a dockerd that fails to answer in time leaves the ids, with one line on stderr saying why.
fn docker_names(status: &mut vgpuctl::status::Status) {
    use vgpu_monitor::docker;
    let Some(sock) = docker::socket(std::env::var("DOCKER_HOST").ok().as_deref()) else {
        return;
    };
    if !status.wants_names() || !sock.exists() {
        return;
    }
    match docker::names(&sock, docker::DEADLINE) {
        Ok(names) => status.note_docker_names(&names),
        Err(e) => eprintln!("vgpuctl status: Docker's names not shown: {e}"),
    }
}

fn main() {
    let cli = Cli::parse();
    // Logs (from the vgpu config's log_level and log_file; stderr by default). A config that cannot be
    // loaded is reported by the command that needs it, not here.
    match vgpu_host::config::Config::load() {
        Ok(cfg) => vgpu_host::logging::init("vgpuctl", &cfg),
        Err(_) => vgpu_host::logging::init_with(
            "vgpuctl",
            vgpu_host::config::LogLevel::Error,
            Default::default(),
        ),
    }
    if let Err(e) = run(cli) {
        // `vgpuctl status | head`: the reader has gone, which is no error to report. Exit as the shell's
        // tools do when SIGPIPE ends them (the signal itself stays ignored: the monitor writes to sockets).
        if e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                || c.downcast_ref::<vgpuctl::engines::error::EngineError>()
                    .is_some_and(|e| e.is_broken_pipe())
        }) {
            std::process::exit(128 + nix::sys::signal::Signal::SIGPIPE as i32);
        }
        eprintln!("vgpuctl: error: {e:#}");
        std::process::exit(1);
    }
}
