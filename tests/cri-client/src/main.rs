//! A kubelet stand-in for the end-to-end suites: it drives a container runtime's CRI (containerd's CRI
//! plugin) over its Unix socket with the calls, and the fields, the kubelet uses to run a pod —
//! `RunPodSandbox` with a runtime handler and the pod's annotations, `CreateContainer` with the pod's
//! sandbox config, `StartContainer`, `ContainerStatus`, the container's log file, `StopPodSandbox`,
//! `RemovePodSandbox`. One subcommand per step, so a suite can look at the node between the steps.
//!
//! A pod is run on the node's network (no CNI needed). `run-pod --save FILE` keeps the pod's id and the
//! sandbox config it was run with; `create --pod FILE` sends that config again, as the kubelet does.
//! A failed call prints one line, `vgpu-cri-client: <call>: <the runtime's message>`, and exits 1.

mod cri;
mod logs;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use k8s_cri::v1 as api;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "vgpu-cri-client",
    about = "Drives a CRI runtime the way the kubelet does (test tool)"
)]
struct Cli {
    /// The runtime's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Prints the runtime's name and version (`Version`).
    Version,
    /// Runs a pod sandbox on the node's network; prints its id.
    RunPod {
        /// Where to keep the pod's id and sandbox config (for `create`, `pod-status`, `stop-pod`, `remove-pod`).
        #[arg(long)]
        save: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "default")]
        namespace: String,
        /// The pod's uid (default: derived from namespace and name).
        #[arg(long)]
        uid: Option<String>,
        /// The RuntimeClass handler (`runtime_handler`).
        #[arg(long, default_value = "vgpu")]
        handler: String,
        /// A pod annotation KEY=VALUE (repeatable).
        #[arg(long = "annotation", value_parser = key_value)]
        annotations: Vec<(String, String)>,
        /// The pod's log directory (the kubelet's /var/log/pods/<ns>_<name>_<uid>).
        #[arg(long)]
        log_dir: PathBuf,
    },
    /// Creates a container in a pod; prints its id.
    Create {
        /// The file `run-pod --save` wrote.
        #[arg(long)]
        pod: PathBuf,
        /// The container's name in the pod spec.
        #[arg(long)]
        name: String,
        #[arg(long)]
        image: String,
        /// KEY=VALUE in the container's environment (repeatable).
        #[arg(long = "env", value_parser = key_value)]
        envs: Vec<(String, String)>,
        /// HOST:CONTAINER[:ro], a hostPath volume (repeatable).
        #[arg(long = "mount", value_parser = mount)]
        mounts: Vec<api::Mount>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Starts a created container.
    Start { id: String },
    /// One line: `state=... exit_code=... pid=... reason=... message=...`.
    Status { id: String },
    /// Waits until the container has exited; prints `exit_code=N`.
    Wait {
        id: String,
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Prints what the container wrote (from its CRI log file), without the log's prefixes.
    Logs { id: String },
    /// One line: `state=... pid=...` of the pod's sandbox.
    PodStatus {
        #[arg(long)]
        pod: PathBuf,
    },
    /// `StopPodSandbox`: stops every container of the pod and the sandbox.
    StopPod {
        #[arg(long)]
        pod: PathBuf,
    },
    /// `RemovePodSandbox`: removes the pod and its containers.
    RemovePod {
        #[arg(long)]
        pod: PathBuf,
    },
}

/// What `run-pod --save` keeps: the kubelet sends the sandbox config again with every `CreateContainer`.
#[derive(Debug, Serialize, Deserialize)]
struct SavedPod {
    id: String,
    config: api::PodSandboxConfig,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn mount(s: &str) -> Result<api::Mount, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (host, ctr, readonly) = match parts[..] {
        [h, c] => (h, c, false),
        [h, c, "ro"] => (h, c, true),
        _ => return Err(format!("{s:?} is not HOST:CONTAINER[:ro]")),
    };
    Ok(api::Mount {
        host_path: host.to_string(),
        container_path: ctr.to_string(),
        readonly,
        ..Default::default()
    })
}

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&anyhow::anyhow!("starting the async runtime: {e}")),
    };
    if let Err(e) = rt.block_on(run(cli)) {
        fail(&e);
    }
}

/// One line on stderr, exit 1.
fn fail(e: &anyhow::Error) -> ! {
    let line = format!("{e:#}").replace('\n', " ");
    eprintln!("vgpu-cri-client: {line}");
    std::process::exit(1);
}

async fn run(cli: Cli) -> Result<()> {
    let mut c = cri::Client::connect(&cli.socket).await?;
    match cli.cmd {
        Cmd::Version => {
            let v = c.version().await?;
            println!(
                "{} {} (CRI {})",
                v.runtime_name, v.runtime_version, v.runtime_api_version
            );
        }
        Cmd::RunPod {
            save,
            name,
            namespace,
            uid,
            handler,
            annotations,
            log_dir,
        } => {
            let uid = uid.unwrap_or_else(|| format!("{namespace}-{name}-uid"));
            let config = pod_config(&name, &namespace, &uid, annotations, &log_dir);
            let id = c.run_pod(config.clone(), &handler).await?;
            write_saved(
                &save,
                &SavedPod {
                    id: id.clone(),
                    config,
                },
            )?;
            println!("{id}");
        }
        Cmd::Create {
            pod,
            name,
            image,
            envs,
            mounts,
            command,
        } => {
            let pod = read_saved(&pod)?;
            let config = container_config(&pod.config, &name, &image, envs, mounts, command);
            println!("{}", c.create(&pod.id, config, pod.config).await?);
        }
        Cmd::Start { id } => c.start(&id).await?,
        Cmd::Status { id } => {
            let (s, pid) = c.container_status(&id).await?;
            println!(
                "state={} exit_code={} pid={} reason={} message={}",
                api::ContainerState::try_from(s.state).map_or("?", |st| st.as_str_name()),
                s.exit_code,
                pid.map_or("-".into(), |p| p.to_string()),
                if s.reason.is_empty() { "-" } else { &s.reason },
                s.message.replace('\n', " ")
            );
        }
        Cmd::Wait { id, timeout } => {
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                let (s, _) = c.container_status(&id).await?;
                if s.state == api::ContainerState::ContainerExited as i32 {
                    println!("exit_code={}", s.exit_code);
                    break;
                }
                if Instant::now() > deadline {
                    bail!("container {id} still not exited after {timeout}s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Cmd::Logs { id } => {
            let (s, _) = c.container_status(&id).await?;
            let text = std::fs::read_to_string(&s.log_path)
                .with_context(|| format!("reading the container's log {}", s.log_path))?;
            print!("{}", logs::messages(&text)?);
        }
        Cmd::PodStatus { pod } => {
            let pod = read_saved(&pod)?;
            let (s, pid) = c.pod_status(&pod.id).await?;
            println!(
                "state={} pid={}",
                api::PodSandboxState::try_from(s.state).map_or("?", |st| st.as_str_name()),
                pid.map_or("-".into(), |p| p.to_string())
            );
        }
        Cmd::StopPod { pod } => c.stop_pod(&read_saved(&pod)?.id).await?,
        Cmd::RemovePod { pod } => c.remove_pod(&read_saved(&pod)?.id).await?,
    }
    Ok(())
}

/// The sandbox config the kubelet sends for a pod on the node's network: metadata, the pod's labels
/// (`io.kubernetes.pod.*`) and annotations, its log directory, host namespaces for network.
fn pod_config(
    name: &str,
    namespace: &str,
    uid: &str,
    annotations: Vec<(String, String)>,
    log_dir: &Path,
) -> api::PodSandboxConfig {
    let labels = [
        ("io.kubernetes.pod.name", name),
        ("io.kubernetes.pod.namespace", namespace),
        ("io.kubernetes.pod.uid", uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        // On the node's network the pod has no UTS namespace of its own, so no hostname of its own.
        log_directory: log_dir.display().to_string(),
        labels,
        annotations: annotations.into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container config the kubelet sends: metadata with the container's name, the image, command,
/// env and hostPath mounts, labels naming pod and container, a log path `<name>/0.log` under the pod's
/// log directory. The pod's annotations are not here: the runtime copies the ones its handler allows.
fn container_config(
    pod: &api::PodSandboxConfig,
    name: &str,
    image: &str,
    envs: Vec<(String, String)>,
    mounts: Vec<api::Mount>,
    command: Vec<String>,
) -> api::ContainerConfig {
    let mut labels: std::collections::HashMap<String, String> = pod.labels.clone();
    labels.insert("io.kubernetes.container.name".into(), name.into());
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command,
        envs: envs
            .into_iter()
            .map(|(key, value)| api::KeyValue { key, value })
            .collect(),
        mounts,
        labels,
        annotations: [(
            "io.kubernetes.container.restartCount".to_string(),
            "0".to_string(),
        )]
        .into_iter()
        .collect(),
        log_path: format!("{name}/0.log"),
        linux: Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: pod
                    .linux
                    .as_ref()
                    .and_then(|l| l.security_context.as_ref())
                    .and_then(|s| s.namespace_options.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn write_saved(path: &Path, pod: &SavedPod) -> Result<()> {
    let text = serde_json::to_string_pretty(pod)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn read_saved(path: &Path) -> Result<SavedPod> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a pod saved by run-pod", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_or_name_what_is_wrong() {
        assert_eq!(key_value("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(key_value("=x").unwrap_err().contains("KEY=VALUE"));
        assert!(key_value("x").is_err());
        let m = mount("/h:/c:ro").unwrap();
        assert_eq!(
            (m.host_path.as_str(), m.container_path.as_str(), m.readonly),
            ("/h", "/c", true)
        );
        assert!(!mount("/h:/c").unwrap().readonly);
        assert!(mount("/h:/c:rw").unwrap_err().contains("HOST:CONTAINER"));
        assert!(mount("/h").is_err());
    }

    #[test]
    fn the_pod_runs_on_the_nodes_network_and_containers_carry_their_names() {
        let p = pod_config(
            "p",
            "ns",
            "u",
            vec![("vgpu.io/memory-limit".into(), "1Gi".into())],
            Path::new("/l"),
        );
        let ns = p
            .linux
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap()
            .namespace_options
            .as_ref()
            .unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Node as i32);
        assert_eq!(p.annotations["vgpu.io/memory-limit"], "1Gi");
        assert_eq!(p.labels["io.kubernetes.pod.name"], "p");
        let c = container_config(&p, "trainer", "img", vec![], vec![], vec!["true".into()]);
        assert_eq!(c.metadata.unwrap().name, "trainer");
        assert_eq!(c.labels["io.kubernetes.container.name"], "trainer");
        assert_eq!(c.log_path, "trainer/0.log");
        // The pod's annotations reach the container through the runtime's filter, not from the kubelet.
        assert!(!c.annotations.contains_key("vgpu.io/memory-limit"));
    }

    #[test]
    fn a_saved_pod_reads_back() {
        let dir = std::env::temp_dir().join(format!("cri-client-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pod.json");
        let config = pod_config("p", "ns", "u", vec![], Path::new("/l"));
        write_saved(
            &f,
            &SavedPod {
                id: "abc".into(),
                config: config.clone(),
            },
        )
        .unwrap();
        let back = read_saved(&f).unwrap();
        assert_eq!((back.id.as_str(), back.config), ("abc", config));
        std::fs::write(&f, "{").unwrap();
        assert!(format!("{:#}", read_saved(&f).unwrap_err()).contains("not a pod saved by run-pod"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
