//! `vgpu-dra-plugin`: the DRA driver's command line. It reads the node's GPUs from NVML, deletes the
//! node's stale slices and publishes its ResourceSlice (owned by the Node, the pool's next generation),
//! then serves the kubelet's registration and DRA sockets until SIGTERM or SIGINT, reading the GPUs again
//! every `--rescan-seconds` and republishing on a change; it removes both sockets on the way out.
//! `--print-slice` prints the slice instead (no API server).

use anyhow::{Context, Result};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use vgpu_dra::claim_spec::Hooks;
use vgpu_dra::kubelet::{DraService, RegistrationService};
use vgpu_dra::plugin::Plugin;
use vgpu_dra::proto::dra_v1::dra_plugin_server::DraPluginServer;
use vgpu_dra::proto::registration::registration_server::RegistrationServer;
use vgpu_dra::publisher::Publisher;
use vgpu_dra::{apiserver, node_gpus, slice};
use vgpu_host::driver_root;
use vgpu_host::keys::dra;
use vgpu_host::nvml::Nvml;

#[derive(Parser)]
#[command(
    name = "vgpu-dra-plugin",
    version,
    about = "vgpu's Kubernetes DRA driver: publishes this node's GPUs (memory and compute share as consumable capacity) and prepares claims as CDI devices whose quota the claim fixes",
    after_help = "The API server comes from KUBECONFIG or the pod's service account; the hook, its stage and NVML from the vgpu config (VGPU_CONFIG)."
)]
struct Cli {
    /// This node's name (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The driver's name (DeviceClass selectors and ResourceSlices name it).
    #[arg(long, default_value = dra::DRIVER)]
    driver_name: String,
    /// The plugin's folder: its DRA socket (dra.sock) and checkpoint.
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpu.vgpu.io")]
    plugin_dir: PathBuf,
    /// The kubelet's plugin registration folder (the registration socket goes there).
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// Where the claims' CDI specs are written (a folder the container runtime reads).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The NVML library (default: found under --driver-root, else the vgpu config's nvml_library).
    #[arg(long, env = "VGPU_NVML_LIBRARY")]
    nvml_library: Option<String>,
    /// The node's driver root as mounted in the pod (`/` of a host-installed driver, or GPU Operator's
    /// `/run/nvidia/driver`): libnvidia-ml.so.1 is looked for in its library folders.
    #[arg(long, env = "VGPU_DRIVER_ROOT")]
    driver_root: Option<PathBuf>,
    /// How often the GPUs are read again (a change is republished at the pool's next generation).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    rescan_seconds: u64,
    /// Print the node's ResourceSlice as JSON and exit.
    #[arg(long)]
    print_slice: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let cfg = vgpu_host::config::Config::load()?;
    let lib = match (&cli.nvml_library, &cli.driver_root) {
        (Some(l), _) => l.clone(),
        (None, Some(root)) => driver_root::nvml_library(root)?
            .to_string_lossy()
            .into_owned(),
        (None, None) => cfg.nvml_library.clone(),
    };
    let nvml = vgpu_host::nvml::open(&lib).with_context(|| format!("cannot load NVML ({lib})"))?;
    let gpus = node_gpus::read(&*nvml)?;
    let node_slice = slice::build(&cli.driver_name, &cli.node_name, &gpus);
    if cli.print_slice {
        println!("{}", serde_json::to_string_pretty(&node_slice)?);
        return Ok(());
    }
    let hooks = Hooks {
        hook_path: cfg.hook_path.clone(),
        hook_stage: cfg.hook_stage.as_str().to_string(),
        hook_env: vgpu_host::config::Config::hook_env(),
    };
    let plugin = Plugin::new(
        cli.driver_name.clone(),
        cli.node_name.clone(),
        node_gpus::host_gpus(&gpus),
        cli.cdi_dir.clone(),
        hooks,
        cli.plugin_dir.join("checkpoint.json"),
    )?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(cli, plugin, nvml, gpus))
}

/// Binds `path`, replacing a socket a previous run left.
fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

async fn serve(
    cli: Cli,
    plugin: Plugin,
    nvml: Box<dyn Nvml>,
    gpus: Vec<node_gpus::NodeGpu>,
) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the API server (KUBECONFIG or the pod's service account)")?;
    let (driver, node) = (cli.driver_name.as_str(), cli.node_name.as_str());
    let node_uid = apiserver::node_uid(&client, node)
        .await
        .with_context(|| format!("cannot read Node {node} (its slices are owned by it)"))?;
    let existing = apiserver::node_slices(&client, driver, node)
        .await
        .context("cannot list the node's ResourceSlices")?;
    let start = Publisher::start(driver, node, &node_uid, &existing, &gpus);
    for name in &start.stale {
        apiserver::delete_slice(&client, name)
            .await
            .with_context(|| format!("cannot delete the stale ResourceSlice {name}"))?;
        eprintln!("vgpu-dra-plugin: deleted the stale ResourceSlice {name}");
    }
    apiserver::publish(&client, &start.slice)
        .await
        .context("cannot publish the node's ResourceSlice")?;
    let mut publisher = start.publisher;
    announce(&start.slice);
    let dra_sock = cli.plugin_dir.join("dra.sock");
    let reg_sock = cli
        .registry_dir
        .join(format!("{}-reg.sock", cli.driver_name));
    let dra_listener = bind(&dra_sock)?;
    let reg_listener = bind(&reg_sock)?;
    let registration = RegistrationService {
        driver: cli.driver_name.clone(),
        endpoint: dra_sock.to_string_lossy().into_owned(),
    };
    let plugin = Arc::new(plugin);
    let dra_service = DraService {
        plugin: plugin.clone(),
        client: client.clone(),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_rescan = stop_rx.clone();
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(dra_service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(dra_listener),
            stopped(stop_rx.clone()),
        );
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), stopped(stop_rx));
    eprintln!(
        "vgpu-dra-plugin: serving {} and {}",
        reg_sock.display(),
        dra_sock.display()
    );
    let signals = async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = stop_tx.send(true);
        anyhow::Ok(())
    };
    // The GPUs read again every interval; a change republished (a failure is said and tried next time).
    let mut stop_rescan = stop_rx_rescan;
    let rescan = async {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(cli.rescan_seconds));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop_rescan.wait_for(|s| *s) => return,
            }
            let gpus = match node_gpus::read(&*nvml) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("vgpu-dra-plugin: cannot read the GPUs again: {e}");
                    continue;
                }
            };
            let Some(s) = publisher.rescan(&gpus) else {
                continue;
            };
            plugin.set_gpus(node_gpus::host_gpus(&gpus));
            match apiserver::publish(&client, &s).await {
                Ok(()) => announce(&s),
                Err(e) => {
                    eprintln!("vgpu-dra-plugin: cannot publish the changed ResourceSlice: {e}");
                    publisher.retry();
                }
            }
        }
    };
    let (a, b, c, ()) = tokio::join!(dra_server, reg_server, signals, rescan);
    // The registration socket first: the kubelet stops calling a plugin whose socket is gone.
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    a?;
    b?;
    c?;
    eprintln!("vgpu-dra-plugin: stopped");
    Ok(())
}

/// Says what was published.
fn announce(s: &k8s_openapi::api::resource::v1::ResourceSlice) {
    let n = s.spec.devices.as_ref().map_or(0, Vec::len);
    eprintln!(
        "vgpu-dra-plugin: published ResourceSlice {} ({n} GPU{}, generation {})",
        s.metadata.name.as_deref().unwrap_or_default(),
        if n == 1 { "" } else { "s" },
        s.spec.pool.generation
    );
}
