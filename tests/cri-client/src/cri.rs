//! The CRI runtime service over a Unix socket (tonic over tokio's `UnixStream`), each call's failure
//! turned into one line naming the call and carrying the runtime's message.

use anyhow::{anyhow, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as api;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::path::Path;
use tonic::transport::{Channel, Endpoint, Uri};

pub struct Client {
    rt: RuntimeServiceClient<Channel>,
}

/// `<call>: <status message>`: what a CRI error says, without gRPC's framing.
fn call_failed(call: &str, s: tonic::Status) -> anyhow::Error {
    anyhow!("{call}: {}", s.message())
}

/// The `pid` in a runtime's verbose `info` (containerd puts a JSON document under the key "info").
fn pid_of(info: &std::collections::HashMap<String, String>) -> Option<u32> {
    let doc: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    doc.get("pid")?
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p > 0)
}

/// A status the runtime must have sent, with the pid from its verbose info.
fn with_pid<T>(
    call: &str,
    id: &str,
    status: Option<T>,
    info: &std::collections::HashMap<String, String>,
) -> Result<(T, Option<u32>)> {
    let status = status.ok_or_else(|| anyhow!("{call}: no status for {id}"))?;
    Ok((status, pid_of(info)))
}

impl Client {
    pub async fn connect(socket: &Path) -> Result<Client> {
        let path = socket.to_path_buf();
        // The URI is not used: every connection goes to the socket.
        let channel = Endpoint::try_from("http://[::]:0")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        Ok(Client {
            rt: RuntimeServiceClient::new(channel),
        })
    }

    pub async fn version(&mut self) -> Result<api::VersionResponse> {
        let r = self
            .rt
            .version(api::VersionRequest {
                version: "v1".into(),
            })
            .await;
        Ok(r.map_err(|s| call_failed("Version", s))?.into_inner())
    }

    pub async fn run_pod(
        &mut self,
        config: api::PodSandboxConfig,
        handler: &str,
    ) -> Result<String> {
        let req = api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: handler.into(),
        };
        let r = self
            .rt
            .run_pod_sandbox(req)
            .await
            .map_err(|s| call_failed("RunPodSandbox", s))?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    pub async fn create(
        &mut self,
        pod_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let r = self
            .rt
            .create_container(req)
            .await
            .map_err(|s| call_failed("CreateContainer", s))?;
        Ok(r.into_inner().container_id)
    }

    pub async fn start(&mut self, id: &str) -> Result<()> {
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        self.rt
            .start_container(req)
            .await
            .map_err(|s| call_failed("StartContainer", s))?;
        Ok(())
    }

    /// The container's status and, while it runs, its pid.
    pub async fn container_status(
        &mut self,
        id: &str,
    ) -> Result<(api::ContainerStatus, Option<u32>)> {
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let r = self
            .rt
            .container_status(req)
            .await
            .map_err(|s| call_failed("ContainerStatus", s))?;
        let r = r.into_inner();
        with_pid("ContainerStatus", id, r.status, &r.info)
    }

    /// The sandbox's status and, while it runs, the pid of its pause process.
    pub async fn pod_status(&mut self, id: &str) -> Result<(api::PodSandboxStatus, Option<u32>)> {
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let r = self
            .rt
            .pod_sandbox_status(req)
            .await
            .map_err(|s| call_failed("PodSandboxStatus", s))?;
        let r = r.into_inner();
        with_pid("PodSandboxStatus", id, r.status, &r.info)
    }

    pub async fn stop_pod(&mut self, id: &str) -> Result<()> {
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.rt
            .stop_pod_sandbox(req)
            .await
            .map_err(|s| call_failed("StopPodSandbox", s))?;
        Ok(())
    }

    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.rt
            .remove_pod_sandbox(req)
            .await
            .map_err(|s| call_failed("RemovePodSandbox", s))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_comes_from_containerds_verbose_info() {
        let info = |s: &str| [("info".to_string(), s.to_string())].into_iter().collect();
        assert_eq!(pid_of(&info(r#"{"pid": 42, "sandboxID": "x"}"#)), Some(42));
        assert_eq!(pid_of(&info(r#"{"pid": 0}"#)), None);
        assert_eq!(pid_of(&info("not json")), None);
        assert_eq!(pid_of(&Default::default()), None);
    }

    #[test]
    fn a_cri_error_is_the_call_and_the_runtimes_message() {
        let e = call_failed(
            "StartContainer",
            tonic::Status::unknown("failed to create task: vgpu: bad"),
        );
        assert_eq!(
            e.to_string(),
            "StartContainer: failed to create task: vgpu: bad"
        );
    }
}
