//! The compute-share environment grammar (HAMi-core's): `CUDA_DEVICE_SM_LIMIT[_<i>]` and
//! `GPU_CORE_UTILIZATION_POLICY`, and vgpu's request beside HAMi-core's limit, `CUDA_DEVICE_SM_REQUEST[_<i>]`,
//! for the library (and the hook). Not here: how a share is enforced, how requests and limits divide a
//! GPU (`vgpu_host::division`, host-only).
//!
//! - a limit is a whole percent `0..=100`, surrounding whitespace ignored; empty = not set;
//! - `0` or `100` is no limit for the GPUs the variable covers (HAMi-core reads 0 so; 100 throttles nothing);
//! - `CUDA_DEVICE_SM_LIMIT_<i>` is GPU `i` (the same indices as `CUDA_DEVICE_MEMORY_LIMIT_<i>`) and wins
//!   over `CUDA_DEVICE_SM_LIMIT`;
//! - a request (the floor) is a whole percent `1..=100` (0 is an error: leave it out for none), the same
//!   forms, at most the limit of its GPU ([`EnvCompute::check_requests`]); a limit alone is its own
//!   request, a request alone has the limit 100;
//! - `GPU_CORE_UTILIZATION_POLICY`: `force` (hard cap), `disable` (no throttling at all), or
//!   empty/`default`; case-insensitive.
//!
//! A malformed value is an error of one line naming the variable.
//!
//! The pacing window's grammar ([`parse_window`]) is written here rather than taken from `humantime`: it
//! is a strict subset (one whole number of `ms` or `s`, 10 ms to 10 s) whose each refusal says what was
//! wrong (no unit, unknown unit, not a whole number, out of range), while `humantime` accepts `1m`,
//! `1s 500ms` or `2h` and its errors do not name the setting; the library, which reads the same grammar,
//! would also take a dependency for a dozen lines.

use std::collections::BTreeMap;

use crate::envlimits::{gpu_of, EnvLimitError, EnvProblem};
use crate::keys::env;

/// The whole GPU, percent: the largest share and request, and the limit of a request alone.
pub const WHOLE: u32 = 100;

/// The share for every GPU; `<SM_LIMIT_VAR>_<i>` is the share of the i-th.
pub const SM_LIMIT_VAR: &str = env::SM_LIMIT;
pub const POLICY_VAR: &str = env::CORE_POLICY;
/// The request for every GPU; `<SM_REQUEST_VAR>_<i>` is the request of the i-th.
pub const SM_REQUEST_VAR: &str = env::SM_REQUEST;
/// The pacing window of a share (`parse_window`): the environment mode's variable.
pub const WINDOW_VAR: &str = env::COMPUTE_WINDOW;
/// The window when none is set, and the bounds of one that is (milliseconds). A capped workload that
/// keeps the GPU busy runs in bursts of `share × window` and waits out the rest: bursts of a few hundred
/// ms let a saturated GPU settle at the clock it runs at unlimited, so the share holds for throughput and
/// not only for GPU time (docs/libvgpu.md, "Pacing window").
pub const DEFAULT_WINDOW_MS: u32 = 1000;
pub const MIN_WINDOW_MS: u32 = 10;
pub const MAX_WINDOW_MS: u32 = 10_000;

/// How a share is applied (stored per device in limits.json as `compute_policy` when not the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// HAMi-core's default. Here the same hard cap as `Force`: lending idle time needs to know the GPU is
    /// idle without trusting other tenants' files, which a process cannot (docs/libvgpu.md).
    #[default]
    Default,
    /// A hard cap.
    Force,
    /// Shares are not enforced.
    Disable,
}

/// The shares the environment asks for, in percent (limits: 0 = no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvCompute {
    pub global: Option<u32>,
    pub per_index: BTreeMap<u32, u32>,
    pub policy: Policy,
    /// The requests: `CUDA_DEVICE_SM_REQUEST` and `CUDA_DEVICE_SM_REQUEST_<i>`, 1..=100.
    pub request_global: Option<u32>,
    pub request_per_index: BTreeMap<u32, u32>,
}

impl Policy {
    /// `force`, `disable` or `default`, any case, surrounding whitespace ignored.
    pub fn parse(v: &str) -> Option<Policy> {
        match v.trim().to_ascii_lowercase().as_str() {
            "default" => Some(Policy::Default),
            "force" => Some(Policy::Force),
            "disable" => Some(Policy::Disable),
            _ => None,
        }
    }

    pub fn is_default(&self) -> bool {
        *self == Policy::Default
    }
}

/// A request above the limit of its GPU. `Display` is one line naming both settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{request}={value}: a compute request is at most its limit, and {limit} is {limit_value} on the same GPU")]
pub struct RequestAboveLimit {
    /// Where the request was read ("annotation vgpu.io/compute-request.1", "env CUDA_DEVICE_SM_REQUEST").
    pub request: String,
    pub value: u32,
    /// Where the limit was read.
    pub limit: String,
    pub limit_value: u32,
}

/// A malformed pacing window. `Display` is one line naming the setting, the problem and the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={value:?}: {problem}; a compute window is a whole number of ms or s, {MIN_WINDOW_MS}ms to {}s", MAX_WINDOW_MS / 1000)]
pub struct WindowError {
    /// Where the value was read ("annotation vgpu.io/compute-window", "VGPU_COMPUTE_WINDOW").
    pub setting: String,
    pub value: String,
    pub problem: WindowProblem,
}

/// What is wrong with a pacing window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WindowProblem {
    #[error("no unit")]
    NoUnit,
    #[error("unknown unit")]
    UnknownUnit,
    #[error("not a whole number")]
    NotWhole,
    #[error("out of range")]
    OutOfRange,
}

/// A pacing window: a whole number of `ms` or `s` (`250ms`, `2s`), 10 ms to 10 s; anything else is an
/// error of one line naming `source`. Returns milliseconds.
pub fn parse_window(value: &str, source: &str) -> Result<u32, WindowError> {
    let v = value.trim();
    let err = |problem| {
        Err(WindowError {
            setting: source.to_string(),
            value: value.to_string(),
            problem,
        })
    };
    let (digits, scale) = if let Some(d) = v.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = v.strip_suffix('s') {
        (d, 1000)
    } else if v.chars().all(|c| c.is_ascii_digit()) && !v.is_empty() {
        return err(WindowProblem::NoUnit);
    } else {
        return err(WindowProblem::UnknownUnit);
    };
    let Some(ms) = digits
        .trim()
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
    else {
        return err(WindowProblem::NotWhole);
    };
    if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&ms) {
        return err(WindowProblem::OutOfRange);
    }
    Ok(ms)
}

impl EnvCompute {
    pub fn parse(vars: &[(String, String)]) -> Result<EnvCompute, EnvLimitError> {
        let mut latest: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in vars {
            let form =
                |base: &str| k == base || k.strip_prefix(base).is_some_and(|r| r.starts_with('_'));
            let ours = k == POLICY_VAR || form(SM_LIMIT_VAR) || form(SM_REQUEST_VAR);
            if ours {
                latest.insert(k, v);
            }
        }
        let mut out = EnvCompute::default();
        for (var, value) in latest {
            let v = value.trim();
            if v.is_empty() {
                continue;
            }
            let err = |problem: EnvProblem| EnvLimitError {
                var: var.to_string(),
                problem,
            };
            let value = value.to_string();
            if var == POLICY_VAR {
                out.policy = Policy::parse(v).ok_or_else(|| err(EnvProblem::Policy { value }))?;
                continue;
            }
            if var.starts_with(SM_REQUEST_VAR) {
                let pct = match v.parse::<u32>() {
                    Ok(p) if (1..=100).contains(&p) => p,
                    _ => return Err(err(EnvProblem::Request { value })),
                };
                match gpu_of(var, SM_REQUEST_VAR).map_err(err)? {
                    None => out.request_global = Some(pct),
                    Some(i) => {
                        out.request_per_index.insert(i, pct);
                    }
                }
                continue;
            }
            let pct = match v.parse::<u32>() {
                Ok(p) if p <= 100 => p,
                _ => return Err(err(EnvProblem::Percent { value })),
            };
            match gpu_of(var, SM_LIMIT_VAR).map_err(err)? {
                None => out.global = Some(pct),
                Some(i) => {
                    out.per_index.insert(i, pct);
                }
            }
        }
        Ok(out)
    }

    /// The share of GPU `i` in percent, 1..=99, or None when it is not throttled.
    pub fn share_for(&self, i: Option<u32>) -> Option<u32> {
        if self.policy == Policy::Disable {
            return None;
        }
        let pct = i
            .and_then(|i| self.per_index.get(&i).copied())
            .or(self.global)?;
        (1..100).contains(&pct).then_some(pct)
    }

    /// The request of GPU `i` in percent, 1..=100, or None when it has none (or the policy is
    /// `disable`). A limit alone is its own request: that is the division's reading
    /// (`crate::settings::GpuSettings::request_limit`), not this one's.
    pub fn request_for(&self, i: Option<u32>) -> Option<u32> {
        if self.policy == Policy::Disable {
            return None;
        }
        i.and_then(|i| self.request_per_index.get(&i).copied())
            .or(self.request_global)
    }

    /// True when some GPU has a request (the policy aside).
    pub fn has_requests(&self) -> bool {
        self.request_global.is_some() || !self.request_per_index.is_empty()
    }

    /// Every request is at most the limit of its GPU (no limit, 0 or 100: the whole GPU); the first that
    /// is not is the error, naming both variables. Checked for every GPU a variable names and for the
    /// GPUs that only the variables for every GPU cover.
    pub fn check_requests(&self) -> Result<(), RequestAboveLimit> {
        let named = self.per_index.keys().chain(self.request_per_index.keys());
        for i in std::iter::once(None).chain(named.map(|&i| Some(i))) {
            let Some(request) = i
                .and_then(|i| self.request_per_index.get(&i).map(|&p| (p, Some(i))))
                .or(self.request_global.map(|p| (p, None)))
            else {
                continue;
            };
            let Some(limit) = i
                .and_then(|i| self.per_index.get(&i).map(|&p| (p, Some(i))))
                .or(self.global.map(|p| (p, None)))
                .filter(|(p, _)| (1..100).contains(p))
            else {
                continue;
            };
            if request.0 > limit.0 {
                let name = |base: &str, i: Option<u32>| match i {
                    Some(i) => format!("env {}", crate::keys::per_gpu_var(base, i)),
                    None => format!("env {base}"),
                };
                return Err(RequestAboveLimit {
                    request: name(SM_REQUEST_VAR, request.1),
                    value: request.0,
                    limit: name(SM_LIMIT_VAR, limit.1),
                    limit_value: limit.0,
                });
            }
        }
        Ok(())
    }

    /// True when no GPU is throttled.
    pub fn is_unlimited(&self) -> bool {
        self.policy == Policy::Disable
            || self
                .global
                .iter()
                .chain(self.per_index.values())
                .all(|&p| p == 0 || p >= 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shares_per_gpu_override_the_global_one() {
        let c = EnvCompute::parse(&env(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
            ("CUDA_DEVICE_SM_LIMIT_2", " 70 "),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ]))
        .unwrap();
        assert_eq!(c.share_for(Some(0)), Some(30));
        assert_eq!(c.share_for(Some(1)), None, "0 is no limit");
        assert_eq!(c.share_for(Some(2)), Some(70));
        assert_eq!(c.share_for(None), Some(30));
        assert!(!c.is_unlimited());
    }

    #[test]
    fn nothing_zero_or_full_is_unlimited() {
        assert!(EnvCompute::parse(&[]).unwrap().is_unlimited());
        let c = EnvCompute::parse(&env(&[("CUDA_DEVICE_SM_LIMIT", "100")])).unwrap();
        assert!(c.is_unlimited());
        assert_eq!(c.share_for(Some(0)), None);
        let c = EnvCompute::parse(&env(&[("CUDA_DEVICE_SM_LIMIT", "")])).unwrap();
        assert!(c.is_unlimited());
    }

    #[test]
    fn policy_disable_switches_every_share_off() {
        let c = EnvCompute::parse(&env(&[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "DISABLE"),
        ]))
        .unwrap();
        assert_eq!(c.policy, Policy::Disable);
        assert!(c.is_unlimited());
        assert_eq!(c.share_for(Some(0)), None);
        let c = EnvCompute::parse(&env(&[("GPU_CORE_UTILIZATION_POLICY", "force")])).unwrap();
        assert_eq!(c.policy, Policy::Force);
    }

    #[test]
    fn policies() {
        assert_eq!(Policy::parse(" Force"), Some(Policy::Force));
        assert_eq!(Policy::parse("sometimes"), None);
        assert_eq!(serde_json::to_string(&Policy::Force).unwrap(), "\"force\"");
    }

    #[test]
    fn requests_per_gpu_override_the_global_one_and_stay_within_their_limits() {
        let c = EnvCompute::parse(&env(&[
            ("CUDA_DEVICE_SM_REQUEST", "20"),
            ("CUDA_DEVICE_SM_REQUEST_1", " 100 "),
            ("CUDA_DEVICE_SM_LIMIT", "60"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
        ]))
        .unwrap();
        assert_eq!(c.request_for(Some(0)), Some(20));
        assert_eq!(c.request_for(Some(1)), Some(100));
        assert_eq!(c.request_for(None), Some(20));
        assert!(c.has_requests());
        // GPU 1 has no limit (0): its request may be the whole GPU.
        assert_eq!(c.check_requests(), Ok(()));
        // A request alone: not throttled (its limit is the whole GPU), but a request all the same.
        let c = EnvCompute::parse(&env(&[("CUDA_DEVICE_SM_REQUEST", "30")])).unwrap();
        assert!(c.is_unlimited() && c.has_requests());
        assert_eq!(c.check_requests(), Ok(()));
        // Above its limit: one line naming both variables, per GPU or for every GPU.
        let above = |pairs: &[(&str, &str)]| {
            EnvCompute::parse(&env(pairs))
                .unwrap()
                .check_requests()
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            above(&[("CUDA_DEVICE_SM_REQUEST", "40"), ("CUDA_DEVICE_SM_LIMIT", "30")]),
            "env CUDA_DEVICE_SM_REQUEST=40: a compute request is at most its limit, and env CUDA_DEVICE_SM_LIMIT is 30 on the same GPU"
        );
        assert_eq!(
            above(&[("CUDA_DEVICE_SM_REQUEST", "40"), ("CUDA_DEVICE_SM_LIMIT_2", "30")]),
            "env CUDA_DEVICE_SM_REQUEST=40: a compute request is at most its limit, and env CUDA_DEVICE_SM_LIMIT_2 is 30 on the same GPU"
        );
        assert_eq!(
            above(&[("CUDA_DEVICE_SM_REQUEST_1", "40"), ("CUDA_DEVICE_SM_LIMIT", "30")]),
            "env CUDA_DEVICE_SM_REQUEST_1=40: a compute request is at most its limit, and env CUDA_DEVICE_SM_LIMIT is 30 on the same GPU"
        );
        // Under disable there is no request at all.
        let c = EnvCompute::parse(&env(&[
            ("CUDA_DEVICE_SM_REQUEST", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "disable"),
        ]))
        .unwrap();
        assert_eq!(c.request_for(Some(0)), None);
    }

    #[test]
    fn bad_requests_in_the_environment() {
        for (k, v) in [
            ("CUDA_DEVICE_SM_REQUEST", "0"),
            ("CUDA_DEVICE_SM_REQUEST", "101"),
            ("CUDA_DEVICE_SM_REQUEST_1", "x"),
        ] {
            let e = EnvCompute::parse(&env(&[(k, v)])).unwrap_err();
            assert_eq!(e.var, k);
            assert!(matches!(e.problem, EnvProblem::Request { .. }), "{e}");
            assert!(
                e.to_string()
                    .contains("a compute request is a whole percent 1..=100"),
                "{e}"
            );
        }
        let e = EnvCompute::parse(&env(&[("CUDA_DEVICE_SM_REQUEST_x", "30")])).unwrap_err();
        assert!(matches!(e.problem, EnvProblem::Index { .. }), "{e}");
    }

    #[test]
    fn windows() {
        assert_eq!(parse_window("250ms", "k"), Ok(250));
        assert_eq!(parse_window(" 2s ", "k"), Ok(2000));
        assert_eq!(parse_window("10ms", "k"), Ok(10));
        assert_eq!(parse_window("10s", "k"), Ok(10_000));
        use WindowProblem::*;
        for (v, why) in [
            ("250", NoUnit),
            ("1m", UnknownUnit),
            ("1.5s", NotWhole),
            ("ms", NotWhole),
            ("9ms", OutOfRange),
            ("11s", OutOfRange),
            ("4294967296s", NotWhole),
            ("", UnknownUnit),
        ] {
            let e = parse_window(v, "annotation vgpu.io/compute-window").unwrap_err();
            assert_eq!((e.problem, e.value.as_str()), (why, v));
        }
        // The message is the contract: one line naming the setting, the problem and the grammar.
        assert_eq!(
            parse_window("250", "annotation vgpu.io/compute-window")
                .unwrap_err()
                .to_string(),
            "annotation vgpu.io/compute-window=\"250\": no unit; a compute window is a whole number of ms or s, 10ms to 10s"
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("CUDA_DEVICE_SM_LIMIT", "101"),
            ("CUDA_DEVICE_SM_LIMIT", "30%"),
            ("CUDA_DEVICE_SM_LIMIT", "-1"),
            ("CUDA_DEVICE_SM_LIMIT_x", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
        ] {
            let e = EnvCompute::parse(&env(&[(k, v)])).unwrap_err();
            assert_eq!(e.var, k);
            assert!(!e.to_string().contains('\n'));
        }
        let problem = |k: &str, v: &str| EnvCompute::parse(&env(&[(k, v)])).unwrap_err().problem;
        assert!(matches!(
            problem("CUDA_DEVICE_SM_LIMIT", "101"),
            EnvProblem::Percent { .. }
        ));
        assert!(matches!(
            problem("CUDA_DEVICE_SM_LIMIT_x", "30"),
            EnvProblem::Index { .. }
        ));
        assert!(matches!(
            problem("GPU_CORE_UTILIZATION_POLICY", "sometimes"),
            EnvProblem::Policy { .. }
        ));
    }
}
