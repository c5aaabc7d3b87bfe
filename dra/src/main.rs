//! `vgpu-dra-plugin`: the DRA driver's command line. It reads the node's GPUs from NVML, publishes the
//! node's ResourceSlice, then serves the kubelet's registration and DRA sockets until SIGTERM or SIGINT,
//! removing both sockets on the way out. `--print-slice` prints the slice instead (no API server).

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
use vgpu_dra::{apiserver, slice};
use vgpu_ledger::keys::dra;

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
    /// The NVML library (default: the vgpu config's nvml_library).
    #[arg(long)]
    nvml_library: Option<String>,
    /// Print the node's ResourceSlice as JSON and exit.
    #[arg(long)]
    print_slice: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let cfg = vgpu_oci::config::Config::load()?;
    let lib = cli
        .nvml_library
        .clone()
        .unwrap_or_else(|| cfg.nvml_library.clone());
    let gpus = vgpu_host::nvml::open(&lib)?.devices()?;
    let node_slice = slice::build(&cli.driver_name, &cli.node_name, &gpus);
    if cli.print_slice {
        println!("{}", serde_json::to_string_pretty(&node_slice)?);
        return Ok(());
    }
    let hooks = Hooks {
        hook_path: cfg.hook_path.clone(),
        hook_stage: cfg.hook_stage.as_str().to_string(),
        hook_env: vgpu_oci::edits::hook_env(),
    };
    let plugin = Plugin::new(
        cli.driver_name.clone(),
        cli.node_name.clone(),
        gpus,
        cli.cdi_dir.clone(),
        hooks,
        cli.plugin_dir.join("checkpoint.json"),
    )?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(cli, plugin, node_slice))
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
    node_slice: k8s_openapi::api::resource::v1::ResourceSlice,
) -> Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the API server (KUBECONFIG or the pod's service account)")?;
    apiserver::publish(&client, &node_slice)
        .await
        .context("cannot publish the node's ResourceSlice")?;
    let n = node_slice.spec.devices.as_ref().map_or(0, Vec::len);
    eprintln!(
        "vgpu-dra-plugin: published ResourceSlice {} ({n} GPU{})",
        node_slice.metadata.name.as_deref().unwrap_or_default(),
        if n == 1 { "" } else { "s" }
    );
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
    let dra_service = DraService {
        plugin: Arc::new(plugin),
        client,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
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
    let (a, b, c) = tokio::join!(dra_server, reg_server, signals);
    // The registration socket first: the kubelet stops calling a plugin whose socket is gone.
    let _ = std::fs::remove_file(&reg_sock);
    let _ = std::fs::remove_file(&dra_sock);
    a?;
    b?;
    c?;
    eprintln!("vgpu-dra-plugin: stopped");
    Ok(())
}
