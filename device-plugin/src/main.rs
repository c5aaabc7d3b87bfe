//! `vgpu-device-plugin`: the device plugin's command line. It reads the node's GPUs from NVML, then for each
//! of its two resources (`vgpu.io/memory`, `vgpu.io/compute`) serves the device plugin API on a socket in the
//! kubelet's device plugin folder and registers it with the kubelet; when the kubelet removes the socket
//! (it does on its restart) it serves and registers again. Stops on SIGTERM or SIGINT, removing its
//! sockets. `--print-devices` prints what it would list instead (no kubelet).

use anyhow::{Context, Result};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use vgpu_device_plugin::devices::{Inventory, Resource};
use vgpu_device_plugin::proto::v1beta1::device_plugin_server::DevicePluginServer;
use vgpu_device_plugin::proto::KUBELET_SOCKET;
use vgpu_device_plugin::register::register;
use vgpu_device_plugin::service::PluginService;
use vgpu_host::driver_root;

#[derive(Parser)]
#[command(
    name = "vgpu-device-plugin",
    version,
    about = "vgpu's Kubernetes device plugin: GPU memory (vgpu.io/memory) and compute share (vgpu.io/compute) as extended resources the scheduler counts, each container's grant on one GPU and written into it as its vgpu quota",
    after_help = "NVML comes from --nvml-library, else under --driver-root, else the vgpu config's nvml_library (VGPU_CONFIG); the config's admission_reserve is kept out of every GPU's memory."
)]
struct Cli {
    /// The kubelet's device plugin folder (its kubelet.sock, and the plugin's sockets).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugin_dir: PathBuf,
    /// The memory one vgpu.io/memory device stands for: a quantity, whole MiB, at least 64Mi. Every node of
    /// a cluster must use the same unit (a pod's number means units).
    #[arg(long, default_value = "1Gi", value_parser = memory_unit)]
    memory_unit: u64,
    /// Where the GPUs' device nodes are (nvidiaN, nvidiactl, nvidia-uvm).
    #[arg(long, default_value = "/dev")]
    dev_root: PathBuf,
    /// The NVML library (default: found under --driver-root, else the vgpu config's nvml_library).
    #[arg(long, env = "VGPU_NVML_LIBRARY")]
    nvml_library: Option<String>,
    /// The node's driver root as mounted in the pod: libnvidia-ml.so.1 is looked for in its library folders.
    #[arg(long, env = "VGPU_DRIVER_ROOT")]
    driver_root: Option<PathBuf>,
    /// Print the devices each resource lists, as JSON lines, and exit.
    #[arg(long)]
    print_devices: bool,
}

/// `--memory-unit`: a quantity of whole MiB, at least the smallest quota.
fn memory_unit(s: &str) -> Result<u64, String> {
    let b = vgpu_ledger::quantity::parse_quantity(s).map_err(|e| e.to_string())?;
    vgpu_ledger::quantity::check_min_quota(b).map_err(|e| e.to_string())?;
    if b % (1 << 20) != 0 {
        return Err(format!("{s} is not a whole number of MiB"));
    }
    Ok(b)
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
    let inventory = Inventory::new(
        &nvml.devices()?,
        cli.memory_unit,
        cfg.admission_reserve_bytes(),
    )?;
    if cli.print_devices {
        for r in Resource::ALL {
            println!(
                "{{\"resource\":{:?},\"devices\":{}}}",
                r.name(),
                inventory.ids(r).len()
            );
        }
        return Ok(());
    }
    let gpus = inventory
        .gpus
        .iter()
        .map(|g| format!("GPU {} {} units", g.index, g.memory_units))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "vgpu-device-plugin: {} GPU{} ({gpus} of {}){}",
        inventory.gpus.len(),
        if inventory.gpus.len() == 1 { "" } else { "s" },
        vgpu_ledger::quantity::format_bytes(cli.memory_unit),
        if inventory.gpus.len() > 1 {
            "; several GPUs: a container's memory is kept on one GPU or refused at Allocate, and its vgpu.io/compute is counted on whichever GPU the kubelet picks for it (docs/engines/kubernetes.md)"
        } else {
            ""
        }
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve(cli, Arc::new(inventory)))
}

/// Binds `path`, replacing a socket a previous run left.
fn bind(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

async fn serve(cli: Cli, inventory: Arc<Inventory>) -> Result<()> {
    std::fs::create_dir_all(&cli.device_plugin_dir)
        .with_context(|| format!("cannot create {}", cli.device_plugin_dir.display()))?;
    let (stop_tx, stop_rx) = watch::channel(false);
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
    let memory = serve_resource(&cli, Resource::Memory, inventory.clone(), stop_rx.clone());
    let compute = serve_resource(&cli, Resource::Compute, inventory, stop_rx);
    let (a, b, c) = tokio::join!(memory, compute, signals);
    a?;
    b?;
    c?;
    eprintln!("vgpu-device-plugin: stopped");
    Ok(())
}

/// One resource: serve its socket and register it, again whenever the socket is removed, until stopped.
async fn serve_resource(
    cli: &Cli,
    resource: Resource,
    inventory: Arc<Inventory>,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let sock = cli.device_plugin_dir.join(resource.socket());
    let kubelet = cli.device_plugin_dir.join(KUBELET_SOCKET);
    loop {
        let listener = bind(&sock)?;
        let (closing_tx, closing) = watch::channel(false);
        let service = PluginService {
            resource,
            inventory: inventory.clone(),
            dev_root: cli.dev_root.clone(),
            closing: closing.clone(),
        };
        let mut until = closing.clone();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = until.wait_for(|c| *c).await;
                }),
        );
        // Registered once the kubelet answers (tried every 5 s, said once), then watched.
        let mut said = false;
        let stopped = loop {
            match register(&kubelet, resource).await {
                Ok(()) => {
                    eprintln!(
                        "vgpu-device-plugin: registered {} at {}",
                        resource.name(),
                        sock.display()
                    );
                    break false;
                }
                Err(e) if !said => {
                    eprintln!("vgpu-device-plugin: {e} (trying every 5 s)");
                    said = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break true,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        };
        let stopped = stopped
            || loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break true,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {
                        if !sock.exists() {
                            eprintln!("vgpu-device-plugin: {} was removed (the kubelet restarted): serving and registering {} again", sock.display(), resource.name());
                            break false;
                        }
                    }
                }
            };
        let _ = closing_tx.send(true);
        server.await??;
        if stopped {
            let _ = std::fs::remove_file(&sock);
            return Ok(());
        }
    }
}
