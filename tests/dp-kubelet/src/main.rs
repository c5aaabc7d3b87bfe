//! `vgpu-dp-kubelet`: what the kubelet's device manager does with a device plugin, over the plugin's real
//! sockets, for tests/e2e/device-plugin.test.sh (no kubelet runs here). It serves the registration socket
//! (`kubelet.sock`) in a folder and waits for the plugin's resources to register (only `v1beta1` accepted,
//! as the kubelet does), dials each at its endpoint, asks its options and reads its first device list, then
//! admits pods in order as the kubelet does: a pod asking more than is free is refused (`OutOf<resource>`);
//! otherwise for each resource it asks `GetPreferredAllocation` among the free IDs, takes the preferred IDs
//! that are free and fills up from the rest (the kubelet's rule), calls `Allocate`, and on an error releases
//! the pod's devices (`UnexpectedAdmissionError`). `-NAME` removes an admitted pod. `--restart` then
//! removes the plugin's sockets, as a restarted kubelet does, and waits for the plugin to register again.
//! Each step prints one JSON line.

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_device_plugin::proto::v1beta1::device_plugin_client::DevicePluginClient;
use vgpu_device_plugin::proto::v1beta1::registration_server::{Registration, RegistrationServer};
use vgpu_device_plugin::proto::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest, RegisterRequest,
};
use vgpu_device_plugin::proto::{HEALTHY, KUBELET_SOCKET, VERSION};
use vgpu_device_plugin::register::connect;

#[derive(Parser)]
#[command(
    name = "vgpu-dp-kubelet",
    about = "A kubelet stand-in for device plugins (tests)"
)]
struct Cli {
    /// The device plugin folder: kubelet.sock is served there, the plugin's sockets are dialled there.
    #[arg(long)]
    dir: PathBuf,
    /// How many resources to wait for.
    #[arg(long, default_value_t = 2)]
    resources: usize,
    /// Seconds to wait for the registrations.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
    /// Remove the plugin's sockets after the pods and wait for it to register again.
    #[arg(long)]
    restart: bool,
    /// Pods, in order: NAME:RESOURCE=N[,RESOURCE=N...] (one container each), or -NAME to remove one.
    pods: Vec<String>,
}

/// The registration service: each request passed on to the main task.
struct Kubelet {
    tx: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, r: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = r.into_inner();
        if r.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported API version {:?}",
                r.version
            )));
        }
        let _ = self.tx.send(r);
        Ok(Response::new(Empty {}))
    }
}

/// A registered resource as the device manager keeps it.
struct Plugin {
    endpoint: PathBuf,
    client: DevicePluginClient<tonic::transport::Channel>,
    preferred: bool,
    healthy: Vec<String>,
    allocated: BTreeSet<String>,
}

async fn registrations(
    rx: &mut mpsc::UnboundedReceiver<RegisterRequest>,
    n: usize,
    timeout: u64,
) -> Result<Vec<RegisterRequest>> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(timeout), rx.recv()).await {
            Ok(Some(r)) => out.push(r),
            _ => bail!(
                "{} of {n} resources registered within {timeout} s",
                out.len()
            ),
        }
    }
    Ok(out)
}

async fn dial(cli: &Cli, r: &RegisterRequest) -> Result<(String, Plugin)> {
    let endpoint = cli.dir.join(&r.endpoint);
    let mut client = DevicePluginClient::new(
        connect(&endpoint)
            .await
            .with_context(|| format!("dialling {}", endpoint.display()))?,
    );
    let opts = client
        .get_device_plugin_options(Empty {})
        .await?
        .into_inner();
    let mut stream = client.list_and_watch(Empty {}).await?.into_inner();
    let list = stream
        .message()
        .await?
        .context("ListAndWatch ended at once")?;
    // The stream stays open, as the kubelet's does; its end would mean the plugin is gone.
    tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    let healthy = list
        .devices
        .into_iter()
        .filter(|d| d.health == HEALTHY)
        .map(|d| d.id)
        .collect();
    Ok((
        r.resource_name.clone(),
        Plugin {
            endpoint,
            client,
            preferred: opts.get_preferred_allocation_available,
            healthy,
            allocated: BTreeSet::new(),
        },
    ))
}

/// Admits one pod: `Ok(line)` is what to print either way.
async fn admit(
    plugins: &mut BTreeMap<String, Plugin>,
    pods: &mut BTreeMap<String, Vec<(String, Vec<String>)>>,
    name: &str,
    asks: &[(String, usize)],
) -> Result<Value> {
    let mut got: Vec<(String, Vec<String>)> = Vec::new();
    let mut merged =
        json!({"pod": name, "ok": true, "ids": {}, "envs": {}, "annotations": {}, "devices": []});
    let release = |plugins: &mut BTreeMap<String, Plugin>, got: &[(String, Vec<String>)]| {
        for (res, ids) in got {
            let p = plugins.get_mut(res).expect("registered");
            for id in ids {
                p.allocated.remove(id);
            }
        }
    };
    for (res, n) in asks {
        let Some(p) = plugins.get_mut(res) else {
            release(plugins, &got);
            return Ok(
                json!({"pod": name, "ok": false, "error": format!("{res}: no plugin registered it")}),
            );
        };
        let free: Vec<String> = p
            .healthy
            .iter()
            .filter(|id| !p.allocated.contains(*id))
            .cloned()
            .collect();
        if free.len() < *n {
            release(plugins, &got);
            return Ok(
                json!({"pod": name, "ok": false, "error": format!("OutOf{res}: {n} asked, {} free", free.len())}),
            );
        }
        let mut ids: Vec<String> = Vec::new();
        if p.preferred {
            let pref = p
                .client
                .get_preferred_allocation(PreferredAllocationRequest {
                    container_requests: vec![ContainerPreferredAllocationRequest {
                        available_device_i_ds: free.clone(),
                        must_include_device_i_ds: vec![],
                        allocation_size: *n as i32,
                    }],
                })
                .await?
                .into_inner();
            for id in pref
                .container_responses
                .into_iter()
                .flat_map(|c| c.device_i_ds)
            {
                if ids.len() < *n && free.contains(&id) && !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        for id in &free {
            if ids.len() < *n && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let answer = p
            .client
            .allocate(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: ids.clone(),
                }],
            })
            .await;
        let answer = match answer {
            Ok(a) => a.into_inner(),
            Err(e) => {
                release(plugins, &got);
                return Ok(json!({"pod": name, "ok": false, "resource": res,
                    "error": format!("UnexpectedAdmissionError: Allocate failed due to {}, which is unexpected", e.message())}));
            }
        };
        let p = plugins.get_mut(res).expect("registered");
        p.allocated.extend(ids.iter().cloned());
        let c = answer
            .container_responses
            .into_iter()
            .next()
            .context("Allocate answered no container")?;
        merged["ids"][res] = json!(ids);
        for (k, v) in c.envs {
            merged["envs"][k] = json!(v);
        }
        for (k, v) in c.annotations {
            merged["annotations"][k] = json!(v);
        }
        for d in c.devices {
            merged["devices"].as_array_mut().expect("array").push(
                json!({"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}),
            );
        }
        got.push((res.clone(), ids));
    }
    pods.insert(name.to_string(), got);
    Ok(merged)
}

fn parse_pod(spec: &str) -> Result<(String, Vec<(String, usize)>)> {
    let (name, asks) = spec
        .split_once(':')
        .with_context(|| format!("{spec:?}: not NAME:RESOURCE=N,..."))?;
    let asks = asks
        .split(',')
        .map(|a| {
            let (r, n) = a
                .split_once('=')
                .with_context(|| format!("{a:?}: not RESOURCE=N"))?;
            Ok((
                r.to_string(),
                n.parse()
                    .with_context(|| format!("{a:?}: N is no number"))?,
            ))
        })
        .collect::<Result<_>>()?;
    Ok((name.to_string(), asks))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let sock = cli.dir.join(KUBELET_SOCKET);
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("binding {}", sock.display()))?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet { tx }))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let regs = registrations(&mut rx, cli.resources, cli.timeout).await?;
    let mut plugins = BTreeMap::new();
    for r in &regs {
        let (name, p) = dial(&cli, r).await?;
        plugins.insert(name, p);
    }
    println!(
        "{}",
        json!({"registered": regs.iter().map(|r| json!({"resource": r.resource_name, "endpoint": r.endpoint, "version": r.version,
            "preferred": r.options.as_ref().is_some_and(|o| o.get_preferred_allocation_available),
            "pre_start": r.options.as_ref().is_some_and(|o| o.pre_start_required)})).collect::<Vec<_>>(),
            "devices": plugins.iter().map(|(k, p)| (k.clone(), json!(p.healthy.len()))).collect::<serde_json::Map<_, _>>()})
    );
    let mut pods = BTreeMap::new();
    for spec in &cli.pods {
        if let Some(name) = spec.strip_prefix('-') {
            for (res, ids) in pods
                .remove(name)
                .with_context(|| format!("no pod {name} to remove"))?
            {
                let p: &mut Plugin = plugins.get_mut(&res).expect("registered");
                for id in ids {
                    p.allocated.remove(&id);
                }
            }
            println!("{}", json!({"removed": name}));
            continue;
        }
        let (name, asks) = parse_pod(spec)?;
        println!("{}", admit(&mut plugins, &mut pods, &name, &asks).await?);
    }
    if cli.restart {
        for p in plugins.values() {
            std::fs::remove_file(&p.endpoint)
                .with_context(|| format!("removing {}", p.endpoint.display()))?;
        }
        let again = registrations(&mut rx, cli.resources, cli.timeout).await?;
        let mut devices = serde_json::Map::new();
        for r in &again {
            let (name, p) = dial(&cli, r).await?;
            devices.insert(name, json!(p.healthy.len()));
        }
        println!(
            "{}",
            json!({"registered_again": again.iter().map(|r| r.resource_name.clone()).collect::<Vec<_>>(), "devices": devices})
        );
    }
    Ok(())
}
