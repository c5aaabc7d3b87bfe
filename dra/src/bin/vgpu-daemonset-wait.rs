//! `vgpu-daemonset-wait`: waits until a DaemonSet has a Ready pod on every node it should run on, then
//! exits 0; after `--timeout-seconds` it exits 1 with one line naming each node whose pod is not Ready and
//! why. The chart's `helm uninstall` pre-delete hook runs it as a Job after starting the uninstall
//! DaemonSet, so that Helm deletes the release only once every node's `install.sh uninstall` has run
//! (Helm waits for a hook Job, not for a hook DaemonSet). It only reads: the DaemonSet and its pods.

use anyhow::{bail, Context, Result};
use clap::Parser;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vgpu_dra::daemonset_wait::{not_ready, Progress};

#[derive(Parser)]
#[command(
    name = "vgpu-daemonset-wait",
    version,
    about = "Waits until a DaemonSet's pod is Ready on every node it should run on (the chart's uninstall hook)",
    after_help = "The API server comes from KUBECONFIG or the pod's service account. Exit status 0: ready everywhere (or no node to run on); 1: not in time, one line naming each node that is not."
)]
struct Cli {
    /// The DaemonSet's name.
    name: String,
    /// Its namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// How long to wait.
    #[arg(long, default_value_t = 240, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_seconds: u64,
    /// How often the DaemonSet is read.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    interval_seconds: u64,
}

/// One API call's bound, so a hung connection cannot outlast the wait.
const CALL: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let run = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
        .and_then(|rt| rt.block_on(wait(&cli)));
    match run {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-daemonset-wait: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn wait(cli: &Cli) -> Result<String> {
    let what = format!("daemonset {}/{}", cli.namespace, cli.name);
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the API server (KUBECONFIG or the pod's service account)")?;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &cli.namespace);
    let deadline = Instant::now() + Duration::from_secs(cli.timeout_seconds);
    let (mut last, mut seen, mut error) = (None, None, None);
    loop {
        match tokio::time::timeout(CALL, api.get(&cli.name)).await {
            Ok(Ok(ds)) => {
                let p = Progress::of(&ds);
                if p.done() {
                    return Ok(format!(
                        "{what}: ready on {} of {} nodes",
                        p.ready, p.desired
                    ));
                }
                if p.observed && last != Some(p) {
                    eprintln!("{what}: ready on {} of {} nodes", p.ready, p.desired);
                    last = Some(p);
                }
                seen = Some(ds);
            }
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => bail!("{what}: not found"),
            // Retried until the deadline: the last one is reported if nothing was read.
            Ok(Err(e)) => error = Some(e.to_string()),
            Err(_) => error = Some(format!("no answer in {} s", CALL.as_secs())),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(cli.interval_seconds)).await;
    }
    let Some(ds) = seen else {
        bail!(
            "{what}: not read in {} s: {}",
            cli.timeout_seconds,
            error.unwrap_or_default()
        );
    };
    let p = Progress::of(&ds);
    let why = match tokio::time::timeout(CALL, pods_of(client, &cli.namespace, &ds)).await {
        Ok(Ok(pods)) if !p.observed => format!(
            "its controller has not counted its pods ({} listed)",
            pods.len()
        ),
        Ok(Ok(pods)) => match not_ready(&pods) {
            lines if lines.is_empty() => "no pod of it is listed yet".to_string(),
            lines => lines.join("; "),
        },
        Ok(Err(e)) => format!("its pods not listed: {e}"),
        Err(_) => format!("its pods not listed in {} s", CALL.as_secs()),
    };
    bail!(
        "{what}: ready on {} of {} nodes after {} s; not ready: {why}",
        p.ready,
        p.desired,
        cli.timeout_seconds
    )
}

/// The DaemonSet's pods: its selector's labels, owned by it.
async fn pods_of(client: kube::Client, namespace: &str, ds: &DaemonSet) -> Result<Vec<Pod>> {
    let labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let list = api
        .list(&ListParams::default().labels(&selector.join(",")))
        .await?;
    let uid = ds.metadata.uid.clone();
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            let owners = p.metadata.owner_references.as_deref().unwrap_or_default();
            owners.iter().any(|o| Some(&o.uid) == uid.as_ref())
        })
        .collect())
}
