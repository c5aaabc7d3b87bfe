//! The kubelet's gRPC APIs a DRA plugin serves, generated at build time from `proto/` (build.rs): plugin
//! registration (`pluginregistration`, the socket in the kubelet's plugins_registry folder) and the DRA
//! plugin service v1 (`NodePrepareResources`, `NodeUnprepareResources`). Servers for the plugin, clients
//! for the stand-in kubelet of the tests.

/// The registration service (`pluginregistration.Registration`).
#[allow(clippy::all, missing_docs)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The DRA plugin service v1 (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
#[allow(clippy::all, missing_docs)]
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The plugin type the kubelet's plugin watcher hands to its DRA manager.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service version listed at registration: the kubelet (1.34+) then calls the v1 service.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
