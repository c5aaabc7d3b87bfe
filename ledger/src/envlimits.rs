//! The limit environment grammar (HAMi-core's): `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, for the hook and library.
//! Not here: where the variables come from (a spec, the process) or what a limit is applied to.
//!
//! Grammar (docs/oci.md, docs/libvgpu.md):
//! - a value is a quantity ([`crate::quantity`]), surrounding whitespace ignored;
//! - an empty value is the same as no variable;
//! - any other value below [`crate::MIN_QUOTA`] (64 MiB; no CUDA context fits in less) is an error;
//! - `0` means "no limit" for the GPUs the variable covers — as HAMi-core reads it — so
//!   `CUDA_DEVICE_MEMORY_LIMIT=0` is no quota at all, and `CUDA_DEVICE_MEMORY_LIMIT_1=0` leaves GPU 1
//!   unlimited whatever `CUDA_DEVICE_MEMORY_LIMIT` says;
//! - `<i>` is a decimal index `0..=1023` (no sign);
//! - a name given twice: the last one counts (what a process would see);
//! - other names, `CUDA_DEVICE_MEMORY_LIMITX` included, are not limits.
//!
//! A malformed value or index is an error of one line naming the variable.

use std::collections::BTreeMap;

use crate::keys;
use crate::quantity::{check_min_quota, parse_quantity, BelowFloor, QuantityError};

/// The limit for every GPU; `<LIMIT_VAR>_<i>` is the limit for the i-th.
pub const LIMIT_VAR: &str = keys::env::MEMORY_LIMIT;
/// The container's limits file, which wins over the limit variables (set by the hook to
/// [`crate::layout::CONTAINER_LIMITS_PATH`]).
pub const LIMITS_FILE_VAR: &str = keys::env::LIMITS_FILE;
/// Largest GPU index a per-GPU variable may name.
pub const MAX_INDEX: u32 = keys::MAX_GPU_INDEX;

/// The name of the per-GPU variable of GPU `i`.
pub fn per_index_var(i: u32) -> String {
    keys::per_gpu_var(LIMIT_VAR, i)
}

/// Parses the `<i>` of a per-GPU setting: decimal digits, `0..=MAX_INDEX`. Shared with the hook's
/// `vgpu.io/memory-limit.<i>` annotations, so both count GPUs the same way.
pub fn parse_index(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|&i| i <= MAX_INDEX)
}

/// Which GPU a variable `base` or `base_<i>` names: None for `base` itself (every GPU), `Some(i)` for
/// `base_<i>`; an `<i>` that is no index is an error.
pub fn gpu_of(var: &str, base: &str) -> Result<Option<u32>, EnvProblem> {
    if var == base {
        return Ok(None);
    }
    let idx = var
        .strip_prefix(base)
        .and_then(|r| r.strip_prefix('_'))
        .unwrap_or(var);
    parse_index(idx).map(Some).ok_or_else(|| EnvProblem::Index {
        index: idx.to_string(),
        base: base.to_string(),
    })
}

/// One limit variable that was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLimit {
    /// The variable's name, for messages.
    pub var: String,
    /// Bytes; 0 is "no limit".
    pub bytes: u64,
}

/// The limits the environment asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvLimits {
    /// `CUDA_DEVICE_MEMORY_LIMIT`, when set (and not empty).
    pub global: Option<EnvLimit>,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>` by index, when set (and not empty); they override `global`.
    pub per_index: BTreeMap<u32, EnvLimit>,
}

/// A malformed limit (or share) variable. `Display` is one line starting with the variable's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}{problem}")]
pub struct EnvLimitError {
    pub var: String,
    pub problem: EnvProblem,
}

/// What is wrong with a variable; `Display` continues the line after the variable's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvProblem {
    /// The value is no quantity.
    #[error("={value:?}: {err}")]
    Quantity { value: String, err: QuantityError },
    /// A limit below `MIN_QUOTA` (and not 0).
    #[error("={value:?}: {err}")]
    BelowFloor { value: String, err: BelowFloor },
    /// The `<i>` of `base_<i>` is no GPU index.
    #[error(": {index:?} is not a GPU index (expected {base}_<0..{MAX_INDEX}>)")]
    Index { index: String, base: String },
    /// A compute share that is no whole percent 0..=100.
    #[error("={value:?}: not a whole percent 0..=100")]
    Percent { value: String },
    /// A compute request that is no whole percent 1..=100.
    #[error("={value:?}: a compute request is a whole percent 1..=100")]
    Request { value: String },
    /// A policy that is not force, disable or default.
    #[error("={value:?}: expected force, disable or default")]
    Policy { value: String },
}

impl EnvLimits {
    /// Reads the limit variables out of `vars` (name, value), ignoring every other name.
    pub fn parse(vars: &[(String, String)]) -> Result<EnvLimits, EnvLimitError> {
        // The last occurrence wins; sorted so the first error reported does not depend on the order.
        let mut latest: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in vars {
            if k == LIMIT_VAR
                || k.strip_prefix(LIMIT_VAR)
                    .is_some_and(|r| r.starts_with('_'))
            {
                latest.insert(k, v);
            }
        }
        let mut out = EnvLimits::default();
        for (var, value) in latest {
            if value.trim().is_empty() {
                continue;
            }
            let err = |problem: EnvProblem| EnvLimitError {
                var: var.to_string(),
                problem,
            };
            let value = value.to_string();
            let bytes = parse_quantity(value.trim()).map_err(|e| {
                err(EnvProblem::Quantity {
                    value: value.clone(),
                    err: e,
                })
            })?;
            if bytes != 0 {
                check_min_quota(bytes).map_err(|e| {
                    err(EnvProblem::BelowFloor {
                        value: value.clone(),
                        err: e,
                    })
                })?;
            }
            let limit = EnvLimit {
                var: var.to_string(),
                bytes,
            };
            match gpu_of(var, LIMIT_VAR).map_err(err)? {
                None => out.global = Some(limit),
                Some(i) => {
                    out.per_index.insert(i, limit);
                }
            }
        }
        Ok(out)
    }

    /// The setting that decides GPU `i`'s limit, if any (its `bytes` may be 0: no limit).
    pub fn setting_for(&self, i: u32) -> Option<&EnvLimit> {
        self.per_index.get(&i).or(self.global.as_ref())
    }

    /// The limit of GPU `i` in bytes; 0 is no limit.
    pub fn bytes_for(&self, i: u32) -> u64 {
        self.setting_for(i).map_or(0, |l| l.bytes)
    }

    /// True when no GPU gets a limit (nothing set, or only zeros).
    pub fn is_unlimited(&self) -> bool {
        self.global
            .iter()
            .chain(self.per_index.values())
            .all(|l| l.bytes == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::MIN_QUOTA;

    fn parse(pairs: &[(&str, &str)]) -> Result<EnvLimits, EnvLimitError> {
        EnvLimits::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn global_and_per_index_with_units() {
        let l = parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4G"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", " 512m "),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x"),
            ("PATH", "/bin"),
        ])
        .unwrap();
        assert_eq!(l.bytes_for(0), 4 << 30);
        assert_eq!(l.bytes_for(1), 512 << 20);
        assert_eq!(l.setting_for(1).unwrap().var, "CUDA_DEVICE_MEMORY_LIMIT_1");
        assert_eq!(l.per_index.len(), 1);
        assert!(!l.is_unlimited());
    }

    #[test]
    fn zero_is_no_limit_and_empty_is_unset() {
        assert!(parse(&[]).unwrap().is_unlimited());
        assert!(parse(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")])
            .unwrap()
            .is_unlimited());
        assert!(parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", ""),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0")
        ])
        .unwrap()
        .is_unlimited());
        // Zero for one GPU overrides the global limit for that GPU only.
        let l = parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1Gi"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
        ])
        .unwrap();
        assert_eq!((l.bytes_for(0), l.bytes_for(1)), (0, 1 << 30));
        assert!(!l.is_unlimited());
        // An empty per-GPU value is no setting: the global limit applies.
        let l = parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1Gi"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", " "),
        ])
        .unwrap();
        assert_eq!(l.bytes_for(0), 1 << 30);
        assert!(l.per_index.is_empty());
    }

    #[test]
    fn the_floor_itself_is_accepted() {
        let l = parse(&[("CUDA_DEVICE_MEMORY_LIMIT", "64m")]).unwrap();
        assert_eq!(l.bytes_for(0), MIN_QUOTA);
    }

    #[test]
    fn last_occurrence_wins_and_lookalike_names_are_not_limits() {
        let l = parse(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "1G"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "2G"),
        ])
        .unwrap();
        assert_eq!(l.bytes_for(0), 2 << 30);
        assert!(parse(&[("CUDA_DEVICE_MEMORY_LIMITX", "5")])
            .unwrap()
            .is_unlimited());
    }

    #[test]
    fn malformed_values_and_indexes_say_what_is_wrong() {
        let problem = |k: &str, v: &str| parse(&[(k, v)]).unwrap_err().problem;
        assert!(matches!(
            problem("CUDA_DEVICE_MEMORY_LIMIT", "4Qi"),
            EnvProblem::Quantity { ref value, .. } if value == "4Qi"
        ));
        assert!(matches!(
            problem("CUDA_DEVICE_MEMORY_LIMIT", "63m"),
            EnvProblem::BelowFloor { err: BelowFloor { bytes }, .. } if bytes == 63 << 20
        ));
        assert!(matches!(
            problem("CUDA_DEVICE_MEMORY_LIMIT_x", "1G"),
            EnvProblem::Index { ref index, .. } if index == "x"
        ));
        assert!(matches!(
            problem("CUDA_DEVICE_MEMORY_LIMIT_1024", "1G"),
            EnvProblem::Index { .. }
        ));
    }

    /// The message is the contract (the hook and the library print it as is): one line naming the variable.
    #[test]
    fn malformed_values_and_indexes_are_one_line_naming_the_variable() {
        for (k, v, want) in [
            ("CUDA_DEVICE_MEMORY_LIMIT", "4Qi", "unknown unit"),
            (
                "CUDA_DEVICE_MEMORY_LIMIT",
                "lots",
                "CUDA_DEVICE_MEMORY_LIMIT=\"lots\"",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT", "4GB", "decimal"),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_2",
                "-5",
                "CUDA_DEVICE_MEMORY_LIMIT_2=\"-5\"",
            ),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_x",
                "1G",
                "\"x\" is not a GPU index",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT_+1", "1G", "not a GPU index"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1024", "1G", "<0..1023>"),
            ("CUDA_DEVICE_MEMORY_LIMIT_", "1G", "\"\" is not a GPU index"),
            // Below the floor (0 alone is "no limit").
            (
                "CUDA_DEVICE_MEMORY_LIMIT",
                "1",
                "1 B is below the smallest quota",
            ),
            (
                "CUDA_DEVICE_MEMORY_LIMIT_0",
                "0.0000001Gi",
                "107 B is below the smallest quota vgpu accepts, 64.0 MiB",
            ),
            ("CUDA_DEVICE_MEMORY_LIMIT", "63m", "63.0 MiB is below"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.var, k);
            assert!(
                msg.starts_with(k) && msg.contains(want),
                "{msg} (wanted {want})"
            );
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[test]
    fn indexes() {
        assert_eq!(parse_index("0"), Some(0));
        assert_eq!(parse_index("007"), Some(7));
        assert_eq!(parse_index("1023"), Some(1023));
        for bad in ["", "1024", "+1", "-1", "x", "1 ", "99999999999999999999"] {
            assert_eq!(parse_index(bad), None, "{bad:?}");
        }
        assert_eq!(per_index_var(3), "CUDA_DEVICE_MEMORY_LIMIT_3");
    }
}
