//! The two gRPC services the kubelet calls, each on its unix socket: registration (the kubelet's plugin
//! watcher finds `<driver>-reg.sock` in its plugins_registry folder, asks `GetInfo` and is told the DRA
//! socket and the v1 service) and the DRA service (`NodePrepareResources` / `NodeUnprepareResources`, one
//! answer per claim, keyed by uid, a claim's failure in its own `error`). Not here: what preparing does
//! (`crate::plugin`).

use crate::apiserver;
use crate::plugin::Plugin;
use crate::proto::dra_v1::{
    dra_plugin_server::DraPlugin, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::proto::registration::{
    registration_server::Registration, InfoRequest, PluginInfo, RegistrationStatus,
    RegistrationStatusResponse,
};
use crate::proto::{DRA_V1_SERVICE, PLUGIN_TYPE};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The registration service: who the plugin is and where its DRA socket is.
pub struct RegistrationService {
    pub driver: String,
    /// The DRA socket's path as the kubelet sees it.
    pub endpoint: String,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![DRA_V1_SERVICE.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        if r.plugin_registered {
            eprintln!("vgpu-dra-plugin: registered with the kubelet");
        } else {
            eprintln!(
                "vgpu-dra-plugin: the kubelet refused the registration: {}",
                r.error
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The DRA service.
pub struct DraService {
    pub plugin: Arc<Plugin>,
    pub client: kube::Client,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        r: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut out = NodePrepareResourcesResponse::default();
        for c in r.into_inner().claims {
            let answer = match self.prepare(&c.namespace, &c.name, &c.uid).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    eprintln!(
                        "vgpu-dra-plugin: prepare {}/{}: {error}",
                        c.namespace, c.name
                    );
                    NodePrepareResourceResponse {
                        devices: vec![],
                        error,
                    }
                }
            };
            out.claims.insert(c.uid, answer);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut out = NodeUnprepareResourcesResponse::default();
        for c in r.into_inner().claims {
            let error = match self.plugin.unprepare(&c.uid) {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
            out.claims
                .insert(c.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

impl DraService {
    /// One claim: from the checkpoint when prepared already, else from its API object.
    async fn prepare(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<Device>, String> {
        let prepared = match self.plugin.prepared(uid) {
            Some(p) => p,
            None => {
                let claim = apiserver::claim(&self.client, namespace, name)
                    .await
                    .map_err(|e| {
                        format!("claim {namespace}/{name}: cannot read it from the API server: {e}")
                    })?;
                self.plugin
                    .prepare(uid, &claim)
                    .map_err(|e| e.to_string())?
            }
        };
        Ok(prepared
            .devices
            .into_iter()
            .map(|d| Device {
                request_names: std::iter::once(d.request).chain(d.more_requests).collect(),
                pool_name: d.pool,
                device_name: d.device,
                cdi_device_ids: d.cdi_device_ids,
            })
            .collect())
    }
}
