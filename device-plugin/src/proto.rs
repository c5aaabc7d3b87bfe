//! The kubelet's device plugin API v1beta1, generated at build time from `proto/` (build.rs): the
//! `Registration` service the kubelet serves on its socket and the `DevicePlugin` service a plugin serves on
//! its own. Servers and clients both: the plugin uses the device plugin server and the registration client,
//! the stand-in kubelet of the tests the other two.

/// The generated messages and services (`v1beta1`).
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version a plugin registers with (the kubelet's `SupportedVersions`).
pub const VERSION: &str = "v1beta1";
/// A device the kubelet may allocate.
pub const HEALTHY: &str = "Healthy";
/// The kubelet's registration socket, in the device plugin folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
