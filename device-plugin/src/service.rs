//! The `DevicePlugin` gRPC service the kubelet calls on one resource's socket: the options (a preferred
//! allocation, no pre-start call), the device list (sent once and held open until the plugin stops or
//! serves again), `GetPreferredAllocation` (`crate::prefer`) and `Allocate` (`crate::allocate`; a refused
//! container fails the whole call, which is how the kubelet hears it). Not here: sockets and registration
//! (`main.rs`, `crate::register`).

use crate::allocate::container_response;
use crate::devices::{Inventory, Resource};
use crate::prefer::preferred;
use crate::proto::v1beta1::{
    device_plugin_server::DevicePlugin, AllocateRequest, AllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use crate::proto::HEALTHY;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// One resource's service.
pub struct PluginService {
    pub resource: Resource,
    pub inventory: Arc<Inventory>,
    /// Where the GPUs' device nodes are on the node.
    pub dev_root: PathBuf,
    /// Turns true when this socket stops serving: the device lists end with it.
    pub closing: watch::Receiver<bool>,
}

impl PluginService {
    /// Every device of the resource, healthy.
    pub fn devices(&self) -> Vec<Device> {
        self.inventory
            .ids(self.resource)
            .into_iter()
            .map(|id| Device {
                id,
                health: HEALTHY.into(),
                topology: None,
            })
            .collect()
    }
}

/// The options every resource serves with.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(1);
        let list = ListAndWatchResponse {
            devices: self.devices(),
        };
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            if tx.send(Ok(list)).await.is_ok() {
                // The stream stays open (the kubelet takes its end as the plugin gone) until this socket
                // stops serving.
                tokio::select! {
                    _ = closing.wait_for(|c| *c) => {}
                    _ = tx.closed() => {}
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = r
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        r: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut out = AllocateResponse::default();
        for c in r.into_inner().container_requests {
            match container_response(
                &self.inventory,
                self.resource,
                &c.devices_ids,
                &self.dev_root,
            ) {
                Ok(answer) => {
                    eprintln!(
                        "vgpu-device-plugin: allocated {} {} ({})",
                        c.devices_ids.len(),
                        self.resource.name(),
                        answer
                            .annotations
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    out.container_responses.push(answer);
                }
                Err(e) => {
                    eprintln!("vgpu-device-plugin: refused: {e}");
                    return Err(Status::invalid_argument(e.to_string()));
                }
            }
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
