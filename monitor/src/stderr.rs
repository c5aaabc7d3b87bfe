//! The monitor's log lines, on stderr: how a line names a container, and the line itself, escaped (a
//! tenant's names cannot forge a "killed pid" line or drive the operator's terminal).

use vgpu_host::usage;

/// One log line on stderr: a finding names the tenant's pod and container, so control characters are
/// escaped (a name cannot forge a "killed pid" line or drive the operator's terminal).
pub(crate) fn log(msg: &str) {
    eprintln!("vgpuctl monitor: {}", vgpu_host::printable::printable(msg));
}

/// "container ID (pod NS/POD, container NAME)"; "container hami/UID_NAME (HAMi: pod UID, container
/// NAME)" for one of HAMi's folders.
pub(crate) fn who(c: &usage::ContainerState) -> String {
    if let usage::Origin::Hami {
        pod_uid, container, ..
    } = &c.origin
    {
        return format!(
            "container {} (HAMi: pod UID {pod_uid}, container {container})",
            c.id
        );
    }
    match &c.names {
        Some(n) => format!(
            "container {} (pod {}/{}, container {})",
            c.id, n.namespace, n.pod, n.container
        ),
        None => format!("container {}", c.id),
    }
}
