//! The monitor's log lines, on stderr: how a line names a container, and the line itself, escaped (a
//! tenant's names cannot forge a "killed pid" line or drive the operator's terminal).

use vgpu_host::usage;

/// One log line on stderr: a finding names the tenant's pod and container, so control characters are
/// escaped (a name cannot forge a "killed pid" line or drive the operator's terminal).
pub(crate) fn log(msg: &str) {
    eprintln!("vgpuctl monitor: {}", vgpu_host::printable::printable(msg));
}

/// "container ID (pod NS/POD, container NAME)".
pub(crate) fn who(c: &usage::ContainerState) -> String {
    match &c.names {
        Some(n) => format!(
            "container {} (pod {}/{}, container {})",
            c.id, n.namespace, n.pod, n.container
        ),
        None => format!("container {}", c.id),
    }
}
