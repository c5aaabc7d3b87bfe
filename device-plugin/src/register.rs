//! The plugin's side of the kubelet's registration: a gRPC channel over a unix socket (also what the
//! stand-in kubelet of the tests dials the plugin with), and `Register` of one resource at the kubelet's
//! socket. Not here: when to register again (`main.rs`: when the kubelet removed the plugin's socket on
//! its restart).

use crate::devices::Resource;
use crate::proto::v1beta1::registration_client::RegistrationClient;
use crate::proto::v1beta1::RegisterRequest;
use crate::proto::VERSION;
use hyper_util::rt::TokioIo;
use std::path::Path;
use tonic::transport::{Channel, Endpoint, Uri};

/// A registration that failed. `Display` is one line naming the socket.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot reach the kubelet at {socket}: {error}")]
    Connect { socket: String, error: String },
    #[error("the kubelet at {socket} refused {resource}: {error}")]
    Refused {
        socket: String,
        resource: &'static str,
        error: String,
    },
}

/// A channel whose every connection goes to the unix socket `socket`.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is not used: the connector dials the socket.
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// Registers `resource`, served at `endpoint` (its socket's name in the kubelet's folder), with the
/// kubelet at `kubelet`.
pub async fn register(kubelet: &Path, resource: Resource) -> Result<(), RegisterError> {
    let socket = kubelet.display().to_string();
    let channel = connect(kubelet).await.map_err(|e| RegisterError::Connect {
        socket: socket.clone(),
        error: e.to_string(),
    })?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: resource.socket().into(),
            resource_name: resource.name().into(),
            options: Some(crate::service::options()),
        })
        .await
        .map_err(|e| RegisterError::Refused {
            socket,
            resource: resource.name(),
            error: e.message().to_string(),
        })?;
    Ok(())
}
