//! The human view of `vgpuctl status`: one line per container and GPU, then one per GPU with its totals,
//! as borderless tables whose lines start with their first cell (scripts match `^<id> `). Not here: what
//! is shown (`model`). Every cell goes through `vgpu_host::printable`: names and error texts come from a
//! tenant's annotations and files, and must neither forge a row nor drive the operator's terminal.
use comfy_table::{CellAlignment, ContentArrangement, Table};
use std::io::Result;
use std::io::Write;
use vgpu_host::printable::printable;
use vgpu_ledger::format_bytes;

use super::model::{Compute, Container, Process, Status, Unattributed};

/// A container id's first 12 characters; the whole of a container of HAMi's folders
/// (`hami/<pod UID>_<container>`).
fn short(id: &str) -> &str {
    match id.starts_with("hami/") {
        true => id,
        false => &id[..id.len().min(12)],
    }
}

/// `host/inside` per process (`?` where unknown), `(dead)` for a slot whose owner is gone.
fn processes(ps: &[Process]) -> String {
    if ps.is_empty() {
        return "-".into();
    }
    let known = |v: u32| match v {
        0 => "?".to_string(),
        v => v.to_string(),
    };
    ps.iter()
        .map(|p| {
            format!(
                "{}/{}{}",
                p.host_pid.map_or("?".into(), known),
                known(p.pid),
                if p.alive { "" } else { "(dead)" }
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Kubernetes' `namespace/pod/container`, else Docker's or Podman's name (neither has a `/`), else `-`;
/// `HAMi pod UID <uid>, container <name>` for a container of HAMi's folders.
fn names(c: &Container) -> String {
    if let Some(h) = &c.hami {
        return format!(
            "HAMi pod UID {}, container {}{}",
            printable(&h.pod_uid),
            printable(&h.container),
            if h.spec.is_some() {
                ", quota of its OCI spec"
            } else {
                ""
            }
        );
    }
    match (
        &c.kubernetes,
        c.docker_name.as_ref().or(c.podman_name.as_ref()),
    ) {
        (Some(k), _) => format!(
            "{}/{}/{}",
            printable(&k.namespace),
            printable(&k.pod),
            printable(&k.container)
        ),
        (None, Some(d)) => printable(d).into_owned(),
        (None, None) => "-".into(),
    }
}

/// `30% (1.9 s charged, 4.1 s held, 512 launches)` for a limit alone (its own request), `request 20%,
/// limit 60% (...)` beside a request, or `-` without a share.
fn compute(c: &Option<Compute>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let s = |ns: u64| format!("{:.1} s", ns as f64 / 1e9);
    let share = if c.request_percent == c.limit_percent {
        format!("{}%", c.limit_percent)
    } else {
        format!("request {}%, limit {}%", c.request_percent, c.limit_percent)
    };
    format!(
        "{share} ({} charged, {} held, {} launches)",
        s(c.charged_ns),
        s(c.held_ns),
        c.launches
    )
}

fn kinds(m: &serde_json::Map<String, serde_json::Value>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={}", format_bytes(v.as_u64().unwrap_or(0))))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table without borders, columns two spaces apart, so that lines start with their first cell.
fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    t
}

/// The human view: one line per container and GPU, then one per GPU with its totals, then one per GPU
/// NVML lists with its memory no process's figure shows.
pub fn print_table(s: &Status, out: &mut dyn Write) -> Result<()> {
    if s.containers.is_empty() {
        writeln!(
            out,
            "no containers with a GPU memory quota or compute share (state root {})",
            printable(&s.state_root)
        )?;
    } else {
        containers(s, out)?;
    }
    if !s.unattributed.is_empty() {
        writeln!(out)?;
        unattributed(s, out)?;
    }
    Ok(())
}

/// The containers' rows, the per-GPU totals and the arbiter's turns.
fn containers(s: &Status, out: &mut dyn Write) -> Result<()> {
    let mut t = table(&[
        "CONTAINER",
        "GPU",
        "UUID",
        "QUOTA",
        "USED",
        "BY KIND",
        "COMPUTE",
        "PIDS (HOST/INSIDE)",
        "NAME (DOCKER, PODMAN, OR K8S NS/POD/CONTAINER)",
    ]);
    for c in &s.containers {
        if let Some(e) = &c.error {
            row(
                &mut t,
                vec![
                    short(&c.id).to_string(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    format!("error: {e}"),
                    "-".into(),
                    "-".into(),
                    names(c),
                ],
            );
        }
        for g in &c.gpus {
            let kinds = match &g.error {
                Some(e) => format!("error: {e}"),
                None => kinds(&g.by_kind),
            };
            row(
                &mut t,
                vec![
                    short(&c.id).to_string(),
                    g.index.to_string(),
                    g.uuid.clone(),
                    g.quota.map_or("-".into(), format_bytes),
                    format!(
                        "{}{}{}{}",
                        format_bytes(g.used),
                        match g.quota {
                            Some(q) => format!(" ({}%)", g.used.saturating_mul(100) / q.max(1)),
                            None => String::new(),
                        },
                        match (g.over_quota, g.pending_shrink) {
                            (Some(x), true) =>
                                format!(", over quota by {} (pending shrink)", format_bytes(x)),
                            (Some(x), false) => format!(", over quota by {}", format_bytes(x)),
                            _ => String::new(),
                        },
                        match (g.spill_limit, g.memory_mode) {
                            (Some(b), _) => format!(
                                " + {} spilled of {}",
                                format_bytes(g.spilled),
                                format_bytes(b)
                            ),
                            (None, "oversubscribe") => " (oversubscribe)".into(),
                            _ => String::new(),
                        }
                    ),
                    kinds,
                    compute(&g.compute),
                    processes(&g.processes),
                    names(c),
                ],
            );
        }
    }
    write_table(&t, out)?;
    if !s.gpus.is_empty() {
        writeln!(out)?;
        let mut t = table(&[
            "GPU",
            "CONTAINERS",
            "COMMITTED",
            "PHYSICAL",
            "USED",
            "COMPUTE SHARES",
            "COMPUTE REQUESTS",
            "HMM/ATS",
        ]);
        for g in &s.gpus {
            let physical = g.physical.map_or("?".into(), format_bytes);
            let committed = match g.physical {
                Some(p) => format!(
                    "{} ({}%)",
                    format_bytes(g.committed),
                    g.committed.saturating_mul(100) / p.max(1)
                ),
                None => format_bytes(g.committed),
            };
            row(
                &mut t,
                vec![
                    g.uuid.clone(),
                    g.containers.to_string(),
                    committed,
                    physical,
                    format_bytes(g.used),
                    format!("{}%", g.compute_shares),
                    format!("{}%", g.compute_requests),
                    // on: pageable host memory can reach the GPU unseen (docs/libvgpu.md)
                    match g.addressing {
                        Some("none") => "off".into(),
                        Some(m) => format!("on ({m})"),
                        None => "?".into(),
                    },
                ],
            );
        }
        if let Some(c) = t.column_mut(1) {
            c.set_cell_alignment(CellAlignment::Right);
        }
        write_table(&t, out)?;
    }
    if !s.turns.is_empty() {
        writeln!(out)?;
        turns(s, out)?;
    }
    Ok(())
}

/// Per GPU NVML lists: its used memory, the driver's reserve, the processes' figures and what none of them
/// shows, with the containers that likely hold it (past the threshold; `unknown` when no ledger explains
/// it).
fn unattributed(s: &Status, out: &mut dyn Write) -> Result<()> {
    let mut t = table(&[
        "GPU",
        "USED (NVML)",
        "DRIVER RESERVE",
        "PROCESSES",
        "UNATTRIBUTED",
        "LIKELY HOLDER (ITS LEDGER PAST ITS PROCESSES' NVML FIGURES)",
    ]);
    for g in &s.unattributed {
        row(
            &mut t,
            vec![
                g.uuid.clone(),
                format_bytes(g.used),
                format_bytes(g.reserved),
                format_bytes(g.processes),
                match g.past_threshold {
                    true => format!("{} (past the threshold)", format_bytes(g.unattributed)),
                    false => format_bytes(g.unattributed),
                },
                holders(s, g),
            ],
        );
    }
    write_table(&t, out)
}

/// `container ID (NAME): 1.00 GiB charged past NVML`, each likely holder; `unknown` past the threshold
/// with none, else `-`.
fn holders(s: &Status, g: &Unattributed) -> String {
    if g.likely_holders.is_empty() {
        return if g.past_threshold { "unknown" } else { "-" }.into();
    }
    g.likely_holders
        .iter()
        .map(|h| {
            let name = s
                .containers
                .iter()
                .find(|c| c.id == h.container_id)
                .map_or("-".into(), names);
            format!(
                "container {} ({}): {} charged past NVML",
                short(&h.container_id),
                name,
                format_bytes(h.charged.saturating_sub(h.nvml))
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The time-quanta arbiter's view per oversubscribed GPU (`vgpuctl monitor`'s status files).
fn turns(s: &Status, out: &mut dyn Write) -> Result<()> {
    let mut t = table(&[
        "GPU",
        "TURNS",
        "HOLDER",
        "QUEUE",
        "GRANTS",
        "REVOCATIONS",
        "OUT OF TURN",
        "RAN FROZEN",
    ]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    for g in &s.turns {
        let holder = match (&g.holder, g.held_since_unix_ms) {
            (Some(h), Some(at)) => format!(
                "{} (for {:.0} s)",
                short(h),
                now_ms.saturating_sub(at) as f64 / 1000.0
            ),
            (Some(h), None) => short(h).to_string(),
            _ => "-".into(),
        };
        let queue = match g.queue.is_empty() {
            true => "-".to_string(),
            false => g
                .queue
                .iter()
                .map(|q| short(q))
                .collect::<Vec<_>>()
                .join(","),
        };
        row(
            &mut t,
            vec![
                g.uuid.clone(),
                if g.contended { "taking turns" } else { "free" }.into(),
                holder,
                queue,
                g.grants.to_string(),
                g.revocations.to_string(),
                g.out_of_turn.to_string(),
                g.busy_while_frozen.to_string(),
            ],
        );
    }
    write_table(&t, out)
}

/// Adds a row, each cell made printable (the names are, already; the ids, UUIDs and error texts here).
fn row(t: &mut Table, cells: Vec<String>) {
    t.add_row(
        cells
            .into_iter()
            .map(|c| printable(&c).into_owned())
            .collect::<Vec<_>>(),
    );
}

fn write_table(t: &Table, out: &mut dyn Write) -> Result<()> {
    for line in t.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}
