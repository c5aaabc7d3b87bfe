//! Unified-memory modes a container opts into, and their one grammar, read by the hook (annotations, a
//! spec's environment) and the library (its environment). Stored per device in limits.json (`memory`).
//! Not here: what the library does in each mode (`libvgpu/src/hooks/memory.rs`), admission (the hook).
//!
//! * `plain` (the default): every device allocation is device memory; past the quota: out of memory.
//! * `spill`: allocations within the quota are device memory as in `plain`; a plain or pitch allocation
//!   that would pass the quota is served as managed memory preferring host residence, charged to the
//!   container's spill budget (`spill_limit`) instead of the quota, refused past that budget.
//! * `oversubscribe`: every plain or pitch allocation is managed memory; the quota caps the total, and the
//!   quotas of such containers may sum past the GPU; the free memory reported keeps `reserve` back.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::keys::{annotation, env};
use crate::quantity::{format_bytes, parse_quantity, QuantityError};

/// The headroom oversubscribe mode keeps below the quota in the free memory it reports (libnvshare's
/// figure), so the driver has room to page.
pub const DEFAULT_RESERVE: u64 = 1536 << 20;

/// Environment variables (environment mode, and a spec's env); the annotations' keys are the hook's
/// (`keys::annotation::MEMORY_*`, read through [`ModeSettings::from_pairs`]).
pub const MODE_VAR: &str = env::MEMORY_MODE;
pub const SPILL_VAR: &str = env::MEMORY_SPILL;
pub const RESERVE_VAR: &str = env::MEMORY_RESERVE;
/// HAMi's variable: `true`/`1` asks for oversubscribe mode.
pub const OVERSUBSCRIBE_VAR: &str = env::OVERSUBSCRIBE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum MemoryMode {
    #[default]
    Plain,
    Spill {
        /// Bytes the container may hold spilled (all its processes), never 0.
        spill_limit: u64,
    },
    Oversubscribe {
        /// Bytes kept back from the free memory reported.
        reserve: u64,
    },
}

/// The settings as written, each with the name it was read under (an annotation key or a variable).
#[derive(Debug, Default, Clone, Copy)]
pub struct ModeSettings<'a> {
    pub mode: Option<(&'a str, &'a str)>,
    pub spill: Option<(&'a str, &'a str)>,
    pub reserve: Option<(&'a str, &'a str)>,
    /// `CUDA_OVERSUBSCRIBE` (environment only).
    pub oversubscribe: Option<(&'a str, &'a str)>,
}

impl ModeSettings<'_> {
    /// The settings from (name, value) pairs: a spec's or process's environment (last one wins).
    pub fn from_env(vars: &[(String, String)]) -> ModeSettings<'_> {
        Self::from_pairs(
            vars,
            MODE_VAR,
            SPILL_VAR,
            RESERVE_VAR,
            Some(OVERSUBSCRIBE_VAR),
        )
    }

    /// The settings from (name, value) pairs under the names given for the mode, the spill budget, the
    /// reserve and (environment only) `CUDA_OVERSUBSCRIBE`: the last pair of a name wins, its value trimmed,
    /// empty as unset.
    pub fn from_pairs<'a>(
        kv: &'a [(String, String)],
        mode: &str,
        spill: &str,
        reserve: &str,
        over: Option<&str>,
    ) -> ModeSettings<'a> {
        let get = |key: &str| {
            kv.iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(k, v)| (k.as_str(), v.trim()))
                .filter(|(_, v)| !v.is_empty())
        };
        ModeSettings {
            mode: get(mode),
            spill: get(spill),
            reserve: get(reserve),
            oversubscribe: over.and_then(get),
        }
    }

    /// Whether anything is set at all.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.spill.is_none()
            && self.reserve.is_none()
            && self.oversubscribe.is_none()
    }

    /// The mode these settings ask for; an error naming the setting when they are wrong or contradict
    /// each other. A spill budget alone means spill mode; `CUDA_OVERSUBSCRIBE=true` alone, oversubscribe.
    pub fn parse(&self) -> Result<MemoryMode, ModeError> {
        let named = |(k, v): (&str, &str)| (k.to_string(), v.to_string());
        let size = |(k, v): (&str, &str)| -> Result<u64, ModeError> {
            match parse_quantity(v) {
                Ok(0) => Err(ModeError::ZeroBudget {
                    setting: k.into(),
                    value: v.into(),
                }),
                Ok(n) => Ok(n),
                Err(err) => Err(ModeError::Quantity {
                    setting: k.into(),
                    value: v.into(),
                    err,
                }),
            }
        };
        let over = match self.oversubscribe {
            None => false,
            Some((_, v)) if matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes") => true,
            Some((_, v)) if matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no") => {
                false
            }
            Some((k, v)) => {
                return Err(ModeError::NotABool {
                    setting: k.into(),
                    value: v.into(),
                })
            }
        };
        let asked = match self.mode {
            Some((_, "plain")) => "plain",
            Some((_, "spill")) => "spill",
            Some((_, "oversubscribe")) => "oversubscribe",
            Some((k, v)) => {
                return Err(ModeError::UnknownMode {
                    setting: k.into(),
                    value: v.into(),
                })
            }
            None if over => "oversubscribe",
            None if self.spill.is_some() => "spill",
            None => "plain",
        };
        if over && asked != "oversubscribe" {
            let (setting, value) = named(self.mode.unwrap_or(("", "")));
            return Err(ModeError::OversubscribeContradicts { setting, value });
        }
        if let (Some(s), false) = (self.spill, asked == "spill") {
            let (setting, value) = named(s);
            return Err(ModeError::BudgetOutsideSpill {
                setting,
                value,
                mode: asked,
            });
        }
        if let (Some(r), false) = (self.reserve, asked == "oversubscribe") {
            let (setting, value) = named(r);
            return Err(ModeError::ReserveOutsideOversubscribe {
                setting,
                value,
                mode: asked,
            });
        }
        Ok(match asked {
            "spill" => match self.spill {
                Some(s) => MemoryMode::Spill {
                    spill_limit: size(s)?,
                },
                None => {
                    let (k, _) = self.mode.unwrap_or_default();
                    return Err(ModeError::SpillWithoutBudget { setting: k.into() });
                }
            },
            "oversubscribe" => MemoryMode::Oversubscribe {
                reserve: match self.reserve {
                    Some((k, v)) => parse_quantity(v).map_err(|err| ModeError::Quantity {
                        setting: k.into(),
                        value: v.into(),
                        err,
                    })?,
                    None => DEFAULT_RESERVE,
                },
            },
            _ => MemoryMode::Plain,
        })
    }
}

/// Memory-mode settings that are wrong or contradict each other. `Display` is one line naming the setting
/// (an annotation key or a variable) and its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error("{setting}={value:?}: expected plain, spill or oversubscribe")]
    UnknownMode { setting: String, value: String },
    /// `CUDA_OVERSUBSCRIBE` that is neither true nor false.
    #[error("{setting}={value:?}: expected true or false")]
    NotABool { setting: String, value: String },
    /// A spill budget or reserve that is no quantity.
    #[error("{setting}={value:?}: {err}")]
    Quantity {
        setting: String,
        value: String,
        err: QuantityError,
    },
    #[error("{setting}={value:?}: must be more than 0")]
    ZeroBudget { setting: String, value: String },
    /// `CUDA_OVERSUBSCRIBE=true` with another mode asked for (`setting`).
    #[error("{OVERSUBSCRIBE_VAR}=true contradicts {setting}={value:?}")]
    OversubscribeContradicts { setting: String, value: String },
    #[error("{setting}={value:?}: a spill budget needs spill mode, not {mode}")]
    BudgetOutsideSpill {
        setting: String,
        value: String,
        mode: &'static str,
    },
    #[error("{setting}={value:?}: a reserve needs oversubscribe mode, not {mode}")]
    ReserveOutsideOversubscribe {
        setting: String,
        value: String,
        mode: &'static str,
    },
    #[error("{setting}=spill needs a spill budget ({spill} or {SPILL_VAR})", spill = annotation::MEMORY_SPILL)]
    SpillWithoutBudget { setting: String },
}

impl MemoryMode {
    pub fn is_plain(&self) -> bool {
        *self == MemoryMode::Plain
    }

    /// The spill budget in spill mode.
    pub fn spill_limit(&self) -> Option<u64> {
        match *self {
            MemoryMode::Spill { spill_limit } => Some(spill_limit),
            _ => None,
        }
    }

    pub fn is_oversubscribe(&self) -> bool {
        matches!(self, MemoryMode::Oversubscribe { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            MemoryMode::Plain => "plain",
            MemoryMode::Spill { .. } => "spill",
            MemoryMode::Oversubscribe { .. } => "oversubscribe",
        }
    }
}

impl fmt::Display for MemoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryMode::Plain => f.write_str("plain"),
            MemoryMode::Spill { spill_limit } => {
                write!(f, "spill (budget {})", format_bytes(spill_limit))
            }
            MemoryMode::Oversubscribe { reserve } => {
                write!(f, "oversubscribe (reserve {})", format_bytes(reserve))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn env(pairs: &[(&str, &str)]) -> Result<MemoryMode, ModeError> {
        ModeSettings::from_env(&kv(pairs)).parse()
    }

    #[test]
    fn modes_from_the_environment() {
        assert_eq!(env(&[]), Ok(MemoryMode::Plain));
        assert!(ModeSettings::from_env(&kv(&[("VGPU_MEMORY_MODE", " ")])).is_empty());
        assert_eq!(
            env(&[("VGPU_MEMORY_SPILL", "8Gi")]),
            Ok(MemoryMode::Spill {
                spill_limit: 8 << 30
            })
        );
        assert_eq!(
            env(&[("VGPU_MEMORY_MODE", "spill"), ("VGPU_MEMORY_SPILL", "1g")]),
            Ok(MemoryMode::Spill {
                spill_limit: 1 << 30
            })
        );
        // HAMi's variable alone, or with our own saying the same
        for pairs in [
            &[("CUDA_OVERSUBSCRIBE", "true")][..],
            &[
                ("CUDA_OVERSUBSCRIBE", "1"),
                ("VGPU_MEMORY_MODE", "oversubscribe"),
            ],
        ] {
            assert_eq!(
                env(pairs),
                Ok(MemoryMode::Oversubscribe {
                    reserve: DEFAULT_RESERVE
                })
            );
        }
        assert_eq!(
            env(&[("CUDA_OVERSUBSCRIBE", "false")]),
            Ok(MemoryMode::Plain)
        );
        assert_eq!(
            env(&[
                ("VGPU_MEMORY_MODE", "oversubscribe"),
                ("VGPU_MEMORY_RESERVE", "0")
            ]),
            Ok(MemoryMode::Oversubscribe { reserve: 0 })
        );
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        use ModeError::*;
        let err = |pairs: &[(&str, &str)]| env(pairs).unwrap_err();
        assert!(matches!(
            err(&[("VGPU_MEMORY_MODE", "swap")]),
            UnknownMode { ref value, .. } if value == "swap"
        ));
        assert!(matches!(
            err(&[("VGPU_MEMORY_MODE", "spill")]),
            SpillWithoutBudget { ref setting } if setting == "VGPU_MEMORY_MODE"
        ));
        assert!(matches!(
            err(&[("VGPU_MEMORY_SPILL", "0")]),
            ZeroBudget { .. }
        ));
        assert!(matches!(
            err(&[("VGPU_MEMORY_SPILL", "4Qi")]),
            Quantity { ref setting, .. } if setting == "VGPU_MEMORY_SPILL"
        ));
        assert!(matches!(
            err(&[("VGPU_MEMORY_MODE", "plain"), ("VGPU_MEMORY_SPILL", "1g")]),
            BudgetOutsideSpill { mode: "plain", .. }
        ));
        assert!(matches!(
            err(&[
                ("VGPU_MEMORY_MODE", "spill"),
                ("VGPU_MEMORY_SPILL", "1g"),
                ("CUDA_OVERSUBSCRIBE", "true"),
            ]),
            OversubscribeContradicts { ref value, .. } if value == "spill"
        ));
        assert!(matches!(
            err(&[("CUDA_OVERSUBSCRIBE", "maybe")]),
            NotABool { .. }
        ));
        assert!(matches!(
            err(&[("VGPU_MEMORY_RESERVE", "1g")]),
            ReserveOutsideOversubscribe { mode: "plain", .. }
        ));
    }

    /// The messages are the contract (the hook refuses a container with them, the library logs them).
    #[test]
    fn bad_settings_are_one_line_naming_the_setting() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("VGPU_MEMORY_MODE", "swap")],
                "VGPU_MEMORY_MODE=\"swap\": expected plain, spill or oversubscribe",
            ),
            (
                &[("VGPU_MEMORY_MODE", "spill")],
                "VGPU_MEMORY_MODE=spill needs a spill budget (vgpu.io/memory-spill or VGPU_MEMORY_SPILL)",
            ),
            (
                &[("VGPU_MEMORY_SPILL", "0")],
                "VGPU_MEMORY_SPILL=\"0\": must be more than 0",
            ),
            (
                &[
                    ("VGPU_MEMORY_MODE", "spill"),
                    ("VGPU_MEMORY_SPILL", "1g"),
                    ("CUDA_OVERSUBSCRIBE", "true"),
                ],
                "CUDA_OVERSUBSCRIBE=true contradicts VGPU_MEMORY_MODE=\"spill\"",
            ),
            (
                &[("VGPU_MEMORY_RESERVE", "1g")],
                "VGPU_MEMORY_RESERVE=\"1g\": a reserve needs oversubscribe mode, not plain",
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(env(pairs).unwrap_err().to_string(), *want, "{pairs:?}");
        }
    }

    #[test]
    fn json_form() {
        let m = MemoryMode::Spill { spill_limit: 5 };
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, r#"{"mode":"spill","spill_limit":5}"#);
        assert_eq!(serde_json::from_str::<MemoryMode>(&j).unwrap(), m);
        assert!(serde_json::from_str::<MemoryMode>(r#"{"mode":"swap"}"#).is_err());
        assert!(serde_json::from_str::<MemoryMode>(r#"{"mode":"spill"}"#).is_err());
    }
}
