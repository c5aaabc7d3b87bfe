//! Whether a DaemonSet's pods are ready on every node it runs on, and why not where they are not: what
//! `vgpu-daemonset-wait` (the chart's `helm uninstall` pre-delete hook Job) decides from. The uninstall
//! hook's pods do the work in their init container (`install.sh uninstall`) and then idle, so a pod Ready
//! is a node whose uninstall has finished; the DaemonSet's status counts them. Read from the API server
//! only (the DaemonSet controller's status and the kubelet's pod status), never from the node.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// What the DaemonSet's status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Nodes that should run a pod.
    pub desired: i32,
    /// Of them, nodes whose pod is Ready with the DaemonSet's current template.
    pub ready: i32,
    /// The controller has seen the DaemonSet's current spec (its counts are about it, not stale or unset).
    pub observed: bool,
}

impl Progress {
    pub fn of(ds: &DaemonSet) -> Progress {
        let generation = ds.metadata.generation.unwrap_or(0);
        let Some(s) = &ds.status else {
            return Progress {
                desired: 0,
                ready: 0,
                observed: false,
            };
        };
        Progress {
            desired: s.desired_number_scheduled,
            // A pod counts once it is both Ready and of the current template.
            ready: s.number_ready.min(s.updated_number_scheduled.unwrap_or(0)),
            observed: s.observed_generation.is_some_and(|g| g >= generation),
        }
    }

    /// Every node that should run a pod has a Ready one (none that should: nothing to wait for).
    pub fn done(&self) -> bool {
        self.observed && self.ready >= self.desired
    }
}

/// For each of `pods` that is not Ready, "node: why" (the node, or "unscheduled"), in node order.
pub fn not_ready(pods: &[Pod]) -> Vec<String> {
    let mut lines: Vec<String> = pods
        .iter()
        .filter(|p| !is_ready(p))
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            format!("{}: {}", node.as_deref().unwrap_or("unscheduled"), why(p))
        })
        .collect();
    lines.sort();
    lines
}

fn is_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why a pod is not Ready: the first init container, then container, that is not done or running, else
/// the pod's phase and its unmet condition's reason (e.g. Pending, Unschedulable).
fn why(p: &Pod) -> String {
    let status = p.status.clone().unwrap_or_default();
    let init = status.init_container_statuses.unwrap_or_default();
    let main = status.container_statuses.unwrap_or_default();
    let stuck = |kind: &str, c: &ContainerStatus| {
        container_state(c).map(|s| format!("{kind} {}: {s}", c.name))
    };
    if let Some(line) = init.iter().find_map(|c| stuck("init container", c)) {
        return line;
    }
    if let Some(line) = main.iter().find_map(|c| stuck("container", c)) {
        return line;
    }
    let phase = status.phase.unwrap_or_else(|| "Pending".into());
    let unmet = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.status != "True" && c.reason.is_some());
    match unmet {
        Some(c) => format!("{phase}, {}: {}", c.type_, c.reason.unwrap_or_default()),
        None => phase,
    }
}

/// A container's state when it holds its pod back (waiting, or exited with an error): the reason, and the
/// last exit status when it ran before. None when it is running or exited 0.
fn container_state(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    let last_exit = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| format!(", last exit status {}", t.exit_code))
        .unwrap_or_default();
    if let Some(w) = &state.waiting {
        return Some(format!(
            "{}{last_exit}",
            w.reason.as_deref().unwrap_or("waiting")
        ));
    }
    match &state.terminated {
        Some(t) if t.exit_code != 0 => Some(format!(
            "{}, exit status {}",
            t.reason.as_deref().unwrap_or("terminated"),
            t.exit_code
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
