//! `vgpu-dra-kubelet`: what the kubelet does with a DRA plugin, over the plugin's real unix sockets, for
//! the e2e suite (no kubelet runs here). `register` finds the plugin's registration socket in a
//! plugins_registry folder, asks `GetInfo` and reports the registration back, as the kubelet's plugin
//! watcher does; `prepare` and `unprepare` call the DRA v1 service at the endpoint `GetInfo` gave. Each
//! prints the answer as one JSON line.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};
use vgpu_dra::proto::dra_v1::dra_plugin_client::DraPluginClient;
use vgpu_dra::proto::dra_v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use vgpu_dra::proto::registration::registration_client::RegistrationClient;
use vgpu_dra::proto::registration::{InfoRequest, RegistrationStatus};

#[derive(Parser)]
#[command(
    name = "vgpu-dra-kubelet",
    about = "A kubelet stand-in for DRA plugins (tests)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Registers the plugin whose socket is in REGISTRY: GetInfo, then NotifyRegistrationStatus.
    Register { registry: PathBuf },
    /// NodePrepareResources for one claim at the DRA socket.
    Prepare {
        socket: PathBuf,
        namespace: String,
        name: String,
        uid: String,
    },
    /// NodeUnprepareResources for one claim at the DRA socket.
    Unprepare {
        socket: PathBuf,
        namespace: String,
        name: String,
        uid: String,
    },
}

async fn channel(socket: &Path) -> Result<Channel> {
    let path = socket.to_path_buf();
    // The URI is not used: every connection goes to the socket.
    Endpoint::try_from("http://[::]:0")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Register { registry } => {
            // The plugin watcher's rule: a socket in the folder is a plugin.
            let mut socks: Vec<PathBuf> = std::fs::read_dir(&registry)?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect();
            socks.sort();
            let Some(sock) = socks.first() else {
                bail!("no plugin socket in {}", registry.display());
            };
            let mut c = RegistrationClient::new(channel(sock).await?);
            let info = c.get_info(InfoRequest {}).await?.into_inner();
            let ok = info.r#type == "DRAPlugin"
                && info.supported_versions.iter().any(|v| v == "v1.DRAPlugin");
            c.notify_registration_status(RegistrationStatus {
                plugin_registered: ok,
                error: if ok {
                    String::new()
                } else {
                    "no v1.DRAPlugin".into()
                },
            })
            .await?;
            println!(
                "{}",
                json!({"socket": sock, "type": info.r#type, "name": info.name, "endpoint": info.endpoint,
                       "supported_versions": info.supported_versions, "registered": ok})
            );
        }
        Cmd::Prepare {
            socket,
            namespace,
            name,
            uid,
        } => {
            let mut c = DraPluginClient::new(channel(&socket).await?);
            let r = c
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![Claim {
                        namespace,
                        uid,
                        name,
                    }],
                })
                .await?
                .into_inner();
            let claims: serde_json::Map<String, serde_json::Value> = r
                .claims
                .into_iter()
                .map(|(uid, a)| {
                    let devices: Vec<_> = a
                        .devices
                        .into_iter()
                        .map(|d| json!({"request_names": d.request_names, "pool": d.pool_name,
                                        "device": d.device_name, "cdi_device_ids": d.cdi_device_ids}))
                        .collect();
                    (uid, json!({"devices": devices, "error": a.error}))
                })
                .collect();
            println!("{}", json!({ "claims": claims }));
        }
        Cmd::Unprepare {
            socket,
            namespace,
            name,
            uid,
        } => {
            let mut c = DraPluginClient::new(channel(&socket).await?);
            let r = c
                .node_unprepare_resources(NodeUnprepareResourcesRequest {
                    claims: vec![Claim {
                        namespace,
                        uid,
                        name,
                    }],
                })
                .await?
                .into_inner();
            let claims: serde_json::Map<String, serde_json::Value> = r
                .claims
                .into_iter()
                .map(|(uid, a)| (uid, json!({"error": a.error})))
                .collect();
            println!("{}", json!({ "claims": claims }));
        }
    }
    Ok(())
}
