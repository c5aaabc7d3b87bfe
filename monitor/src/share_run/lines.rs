//! The share wall's log lines: a finding over a share or an entitlement (`describe`) and a container
//! busy while frozen (`describe_runaway`), each naming where it is and what is done. Not here: when a line
//! is logged (once, when the finding begins: the parent).

use crate::share_wall::{Over, Runaway, Why};
use crate::stderr::who;
use std::path::PathBuf;
use vgpu_host::usage::ContainerState;

/// "container ID (pod …) GPU INDEX (UUID)": where a finding is.
fn at(c: &ContainerState, uuid: &str) -> String {
    let index = c
        .gpus
        .iter()
        .find(|g| g.uuid == uuid)
        .map_or(0, |g| g.index);
    format!("{} GPU {index} ({uuid})", who(c))
}

/// The finding's log line.
pub(super) fn describe(
    c: &ContainerState,
    o: &Over,
    dir: &Option<Result<PathBuf, String>>,
    tol: f64,
) -> String {
    let at = at(c, &o.gpu);
    let action = match dir {
        None => "reporting only".to_string(),
        Some(Ok(d)) => format!(
            "freezing {} for {:.1} s",
            d.display(),
            o.freeze_for.as_secs_f64()
        ),
        Some(Err(e)) => format!("cannot freeze it: {e}"),
    };
    let pct = |r: f64| (r * 100.0).round();
    match &o.why {
        Why::Limit => format!(
            "over its compute share: {at}: its processes used {:.2} s of GPU time in the last {:.1} s (NVML), share {}% + {} points: {action}",
            o.used,
            o.span,
            pct(o.share),
            tol * 100.0
        ),
        Why::Floor { entitled, starved } => format!(
            "over its compute entitlement while a floor is starved: {at}: its processes used {:.2} s of GPU time in the last {:.1} s (NVML), entitled to {}% + {} points (request {}%, limit {}%) while container {} got {}% of its floor of {}% of the saturated GPU: {action}",
            o.used,
            o.span,
            pct(*entitled),
            tol * 100.0,
            pct(o.request),
            pct(o.share),
            starved.container,
            pct(starved.got),
            pct(starved.floor),
        ),
    }
}

/// The `busy_while_frozen` finding's log line.
pub(super) fn describe_runaway(c: &ContainerState, r: &Runaway, kill: bool, tol: f64) -> String {
    let at = at(c, &r.gpu);
    let action = match kill {
        true => "killing its busy processes under the kill policy",
        false => "reporting only (no kill policy), the freezes go on",
    };
    format!(
        "busy while frozen: {at}: its processes used {:.2} s of GPU time in the last {:.1} s while it was frozen {:.1} s of it (NVML), share {}% + {} points: work queued on the GPU runs on through a freeze: {action}",
        r.used,
        r.span,
        r.frozen,
        (r.share * 100.0).round(),
        tol * 100.0
    )
}
