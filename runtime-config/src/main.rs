use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use vgpu_ledger::layout::StateRoot;
use vgpuctl::engines::{self, Engine};

/// vgpuctl: configure container engines for vgpu and show GPU memory usage.
#[derive(Parser)]
#[command(version = vgpu_oci::version::LONG, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Configure a container engine to run containers through vgpu, or take that back.
    #[command(subcommand)]
    Runtime(RuntimeCmd),
    /// Show quota, usage by kind and processes per container and GPU (read-only).
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        root: RootArgs,
    },
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

#[derive(Args)]
struct MonitorArgs {
    /// Address to serve /metrics on (default: [monitor] listen, else 0.0.0.0:9394).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Seconds between watchdog passes (default: [monitor] interval_seconds, else 10).
    #[arg(long, value_name = "SECONDS")]
    interval: Option<u64>,
    /// Bytes over a quota not reported, e.g. 64Mi (default: [monitor] tolerance, else 64Mi).
    #[arg(long)]
    tolerance: Option<String>,
    /// SIGKILL the processes that put a container over its quota (default: [monitor] kill, else off).
    #[arg(long)]
    kill: bool,
    /// NVML library (default: [monitor] nvml_library, else the config's nvml_library).
    #[arg(long)]
    nvml_library: Option<String>,
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
            None => Ok(StateRoot::new(vgpu_oci::config::Config::load()?.state_root)),
        }
    }
}

#[derive(Subcommand)]
enum RuntimeCmd {
    /// Add the vgpu runtime (Docker, containerd, CRI-O) or hooks (Podman) to the engine's config.
    ///
    /// Every other setting and comment of the engine's files is kept; files are written atomically; the
    /// engine is never restarted (the command says what to restart). What unconfigure must restore that
    /// the engine's files cannot hold (the default runtime --set-as-default replaced, containerd's drop-in
    /// and the `imports` entry added for it) goes to vgpuctl's record, /var/lib/vgpu/engines.json
    /// (VGPUCTL_STATE_DIR moves the folder).
    Configure(ConfigureArgs),
    /// Remove what `configure` added, and only that: an entry named vgpu that vgpuctl did not write is
    /// left as it is (an error says so).
    ///
    /// The default runtime --set-as-default replaced is put back from vgpuctl's record (or, for configs
    /// of older vgpuctl versions, from their comment in containerd's file or the hidden file beside
    /// daemon.json), and the record's entry removed. containerd: vgpuctl's drop-in is removed with the
    /// `imports` entry vgpuctl added for it; a foreign vgpu handler in the main file is then left as it is,
    /// without an error.
    Unconfigure(CommonArgs),
}

#[derive(Args)]
struct CommonArgs {
    /// The engine to configure (or unconfigure).
    #[arg(long, value_enum)]
    runtime: Engine,
    /// The engine's config file (default: /etc/docker/daemon.json, /etc/containerd/config.toml,
    /// /etc/crio/crio.conf). containerd: the files it imports are read as containerd reads them (for the
    /// default runtime, and for a vgpu handler that is not vgpu's), never edited.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Change nothing: print each file as it would be written on stdout, and what would be written,
    /// recorded or removed where on stderr.
    #[arg(long)]
    dry_run: bool,
    /// Podman: the hooks.d folder (default: /usr/share/containers/oci/hooks.d).
    #[arg(long)]
    hooks_dir: Option<PathBuf>,
    /// CRI-O: the drop-in folder (default: crio.conf.d beside --config); its other files are read, in
    /// CRI-O's order, for the default runtime whose settings vgpu's handler copies.
    #[arg(long)]
    drop_in_dir: Option<PathBuf>,
    /// containerd: put vgpu's handler in a file of its own that the main config imports, instead of editing
    /// the main config (PATH default: conf.d/99-vgpu.toml beside --config). The main config gets an
    /// `imports` entry for it unless one of its imports (a glob) already covers it. Unconfigure removes the
    /// drop-in (this one, the one vgpuctl recorded, or any file with vgpuctl's header containerd reads) and
    /// the `imports` entry if vgpuctl added it.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    drop_in: Option<Option<PathBuf>>,
}

#[derive(Args)]
struct ConfigureArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Also make vgpu the engine's default runtime (Docker, containerd, CRI-O; refused for Podman, whose
    /// hooks apply under any runtime). The previous default is kept in vgpuctl's record, and unconfigure
    /// puts it back.
    #[arg(long)]
    set_as_default: bool,
    /// Replace an existing entry named vgpu that vgpuctl did not write (by default it is refused and left
    /// as it is). Unconfigure never removes such an entry. containerd: a vgpu handler in an imported file
    /// is never edited; --force lets vgpu's drop-in override one read before it, never one read after.
    #[arg(long)]
    force: bool,
    /// Where vgpu-container-runtime is installed (the file name must stay vgpu-container-runtime: it is how
    /// vgpuctl recognises its own entries).
    #[arg(long, default_value = "/usr/bin/vgpu-container-runtime")]
    runtime_path: String,
    /// Where vgpu-hook is installed (Podman's hooks.d files; the file name must stay vgpu-hook).
    #[arg(long, default_value = "/usr/bin/vgpu-hook")]
    hook_path: String,
    /// Extra KEY=VALUE for the hooks' explicit environment (VGPU_CONFIG is passed on when set).
    #[arg(long = "hook-env", value_name = "KEY=VALUE")]
    hook_env: Vec<String>,
}

fn options(c: &CommonArgs) -> engines::Options {
    engines::Options {
        engine: c.runtime,
        config: c.config.clone(),
        set_as_default: false,
        force: false,
        runtime_path: String::new(),
        hook_path: String::new(),
        hooks_dir: c.hooks_dir.clone(),
        hook_env: vec![],
        drop_in_dir: c.drop_in_dir.clone(),
        drop_in: c.drop_in.clone(),
        record: engines::record::default_path(),
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match cli.cmd {
        Cmd::Runtime(RuntimeCmd::Configure(a)) => {
            let mut o = options(&a.common);
            o.set_as_default = a.set_as_default;
            o.force = a.force;
            o.runtime_path = a.runtime_path;
            o.hook_path = a.hook_path;
            o.hook_env = a.hook_env;
            // Hooks must find the same vgpu config as the operator who configured them.
            if !o.hook_env.iter().any(|e| e.starts_with("VGPU_CONFIG=")) {
                o.hook_env.extend(vgpu_oci::config::Config::env_for_hooks());
            }
            // Held from reading the files to writing them: runs at once keep each other's changes.
            let _lock = (!a.common.dry_run)
                .then(|| engines::record::lock(&o.record))
                .transpose()?;
            let changes = engines::plan_configure(&o)?;
            finish(&changes, a.common.dry_run, o.engine, "configured", &mut out)?;
            for n in engines::notes(&o) {
                eprintln!("{n}");
            }
            Ok(())
        }
        Cmd::Status { json, root } => {
            // The GPUs' memory for the per-GPU totals, when NVML is there (status works without it).
            let physical: Vec<(String, u64)> = vgpu_oci::config::Config::load()
                .ok()
                .and_then(|c| vgpu_oci::nvml::list_gpus(&c.nvml_library).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|g| (g.uuid, g.total_memory))
                .collect();
            let status = vgpuctl::status::collect(&root.root()?, &physical)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &status)?;
                writeln!(out)?;
            } else {
                vgpuctl::status::print_table(&status, &mut out)?;
            }
            Ok(())
        }
        Cmd::Monitor(a) => monitor(a, &mut out),
        Cmd::Gc { root } => {
            // The grace for state without an owner comes from the config, like the hooks' own collection.
            let cfg = vgpu_oci::config::Config::load()?;
            let grace = std::time::Duration::from_secs(cfg.gc_pending_grace_seconds);
            let root = root
                .state_root
                .clone()
                .map(StateRoot::new)
                .unwrap_or_else(|| StateRoot::new(cfg.state_root));
            let report = vgpu_oci::gc::collect_with(&root, grace)?;
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
            vgpuctl::clidocs::write_all(<Cli as clap::CommandFactory>::command(), &others, &dir)
                .map(drop)
        }
        Cmd::Runtime(RuntimeCmd::Unconfigure(c)) => {
            let o = options(&c);
            let _lock = (!c.dry_run)
                .then(|| engines::record::lock(&o.record))
                .transpose()?;
            let changes = engines::plan_unconfigure(&o)?;
            finish(&changes, c.dry_run, o.engine, "not configured", &mut out)
        }
    }
}

fn monitor(a: MonitorArgs, out: &mut dyn Write) -> Result<()> {
    use vgpuctl::monitor::{config, watchdog::Policy, Monitor};
    let cfg = vgpu_oci::config::Config::load()?;
    let flags = config::Flags {
        listen: a.listen,
        interval_seconds: a.interval,
        tolerance: a.tolerance,
        kill: a.kill,
        nvml_library: a.nvml_library,
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
    let m = std::sync::Arc::new(Monitor::new(root.clone(), &s.nvml_library, policy));
    if a.once {
        out.write_all(m.scrape().as_bytes())?;
        return Ok(());
    }
    let listener = std::net::TcpListener::bind(&s.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", s.listen))?;
    eprintln!(
        "vgpuctl monitor: serving http://{}/metrics for {}; watchdog every {} s, tolerance {}, kill {}",
        listener.local_addr()?,
        root.root().display(),
        s.interval.as_secs(),
        vgpu_ledger::format_bytes(s.tolerance),
        if s.kill { "on" } else { "off" }
    );
    vgpuctl::monitor::run(m, listener, s.interval)
}

/// Applies the changes and says what to restart, or with `dry_run` prints the new files on stdout and
/// everything else on stderr.
fn finish(
    changes: &[engines::Change],
    dry_run: bool,
    engine: Engine,
    state: &str,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    if changes.is_empty() {
        let line = format!("{engine:?} is already {state} for vgpu: nothing to change");
        if dry_run {
            eprintln!("{line}");
        } else {
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    if dry_run {
        return engines::preview(changes, out, &mut std::io::stderr());
    }
    engines::apply(changes, out)?;
    writeln!(out, "{}", engines::restart_hint(engine))?;
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    // Logs (from the vgpu config's log_level and log_file; stderr by default). A config that cannot be
    // loaded is reported by the command that needs it, not here.
    match vgpu_oci::config::Config::load() {
        Ok(cfg) => vgpu_oci::logging::init("vgpuctl", &cfg),
        Err(_) => vgpu_oci::logging::init_with(
            "vgpuctl",
            vgpu_oci::config::LogLevel::Error,
            Default::default(),
        ),
    }
    if let Err(e) = run(cli) {
        eprintln!("vgpuctl: error: {e:#}");
        std::process::exit(1);
    }
}
