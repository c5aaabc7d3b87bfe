//! One GPU's settings: every value vgpu enforces per GPU of a container (the memory quota and its
//! unified-memory mode, the compute share's limit and request with its policy and pacing window), as one
//! struct. The hook's request gives one per GPU, read once from the spec; its plan carries it whole (`PlannedGpu`); the
//! limits file stores it flattened into each device (`crate::limits::DeviceLimit`: the struct's fields
//! are the device's keys on disk, as they were before the struct existed); `vgpuctl update` changes its
//! values; the library and the host tools read it from there. Not here: the names a user writes
//! (`crate::keys`), each value's grammar (`crate::quantity`, `crate::memmode`, `crate::envcompute`),
//! reading a spec (the hook's `request`).
//!
//! Adding a per-GPU value is a field here (absent on disk when unset: `#[serde(default,
//! skip_serializing_if)]`, so files of older and newer builds still read), its rule in
//! [`GpuSettings::validate`] and in [`GpuSettings::tied`] if it goes with another value, plus its key
//! (`crate::keys`) and its parser.

use serde::{Deserialize, Serialize};

use crate::envcompute::{Policy, MAX_WINDOW_MS, MIN_WINDOW_MS};
use crate::memmode::MemoryMode;

/// The settings of one GPU of a container. `Default`: no limit at all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSettings {
    /// Bytes; never 0 in a valid file. Absent: no memory quota on this GPU (it is listed for its
    /// compute share alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// The unified-memory mode (`crate::memmode`); absent (plain) in files written before it existed.
    #[serde(default, skip_serializing_if = "MemoryMode::is_plain")]
    pub memory: MemoryMode,
    /// The compute share, a percent of the GPU's time 1..=99 (`crate::envcompute`); absent: none (and
    /// in files written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_limit: Option<u32>,
    /// The compute request, the floor: a percent of the GPU's time 1..=100, at most the limit (100
    /// without one); absent: the limit is the request (a hard cap, as in files written before it
    /// existed). A request alone has the limit 100. How a GPU's time is divided by requests and limits:
    /// `vgpu_host::division`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_request: Option<u32>,
    /// How the share is applied; absent: the default (today the same hard cap as `force`).
    #[serde(default, skip_serializing_if = "Policy::is_default")]
    pub compute_policy: Policy,
    /// The share's pacing window in ms (`crate::envcompute::parse_window`'s bounds); absent: the default
    /// (`DEFAULT_WINDOW_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_window_ms: Option<u32>,
}

/// Settings of one GPU that [`GpuSettings::validate`] refuses. `Display` is one line, without the GPU
/// (the limits file's error names it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSettings {
    #[error("memory_limit is 0")]
    ZeroMemoryLimit,
    #[error("has no memory_limit, compute_limit or compute_request")]
    NoLimit,
    #[error("memory mode {mode} needs a memory_limit")]
    ModeWithoutMemoryLimit { mode: &'static str },
    #[error("compute_limit {percent} is not a percent 1..=99")]
    ComputeLimit { percent: u32 },
    #[error("compute_request {percent} is not a percent 1..=100")]
    ComputeRequest { percent: u32 },
    #[error("compute_request {request} is above compute_limit {limit}")]
    RequestAboveLimit { request: u32, limit: u32 },
    #[error("compute_window_ms {window_ms} is not within {MIN_WINDOW_MS}..={MAX_WINDOW_MS}")]
    ComputeWindow { window_ms: u32 },
    #[error("spill_limit is 0")]
    ZeroSpillLimit,
}

impl GpuSettings {
    /// The compute share's cap the library enforces on this GPU: the limit, unless the policy is
    /// `disable`. None also for a request alone (its limit is the whole GPU).
    pub fn compute_share(&self) -> Option<u32> {
        self.compute_limit
            .filter(|_| self.compute_policy != Policy::Disable)
    }

    /// The GPU has a compute share: a limit, a request, or both (whatever the policy).
    pub fn has_compute_share(&self) -> bool {
        self.compute_limit.is_some() || self.compute_request.is_some()
    }

    /// The compute share's request and limit, percent, as the division (`vgpu_host::division`) takes
    /// them: `(request, limit)`. A limit alone is its own request (a hard cap, lending nothing it does
    /// not leave idle); a request alone has the limit 100. None: no share, or the policy `disable`.
    pub fn request_limit(&self) -> Option<(u32, u32)> {
        if self.compute_policy == Policy::Disable || !self.has_compute_share() {
            return None;
        }
        let limit = self.compute_limit.unwrap_or(crate::envcompute::WHOLE);
        Some((self.compute_request.unwrap_or(limit).min(limit), limit))
    }

    /// Whether the GPU has neither a memory quota nor a compute share (nothing for vgpu to enforce).
    pub fn is_unlimited(&self) -> bool {
        self.memory_limit.is_none() && !self.has_compute_share()
    }

    /// These settings as one GPU gets them from a container's request, whose container-wide values
    /// reach every GPU: the memory mode goes with a memory quota, the policy and window with a share
    /// (a GPU with a compute share alone is plain; one without a share has no policy or window).
    pub fn tied(self) -> GpuSettings {
        let quota = self.memory_limit.is_some();
        let share = self.has_compute_share();
        GpuSettings {
            memory: if quota {
                self.memory
            } else {
                MemoryMode::Plain
            },
            compute_policy: if share {
                self.compute_policy
            } else {
                Policy::Default
            },
            compute_window_ms: self.compute_window_ms.filter(|_| share),
            ..self
        }
    }

    /// Checks what serde cannot, the first broken rule the error (in the order the fields are listed).
    pub fn validate(&self) -> Result<(), InvalidSettings> {
        match (self.memory_limit, self.has_compute_share()) {
            (Some(0), _) => return Err(InvalidSettings::ZeroMemoryLimit),
            (None, false) => return Err(InvalidSettings::NoLimit),
            (None, true) if !self.memory.is_plain() => {
                return Err(InvalidSettings::ModeWithoutMemoryLimit {
                    mode: self.memory.name(),
                })
            }
            _ => {}
        }
        if let Some(percent) = self.compute_limit.filter(|p| !(1..100).contains(p)) {
            return Err(InvalidSettings::ComputeLimit { percent });
        }
        if let Some(request) = self.compute_request {
            if !(1..=crate::envcompute::WHOLE).contains(&request) {
                return Err(InvalidSettings::ComputeRequest { percent: request });
            }
            let limit = self.compute_limit.unwrap_or(crate::envcompute::WHOLE);
            if request > limit {
                return Err(InvalidSettings::RequestAboveLimit { request, limit });
            }
        }
        if let Some(window_ms) = self
            .compute_window_ms
            .filter(|w| !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(w))
        {
            return Err(InvalidSettings::ComputeWindow { window_ms });
        }
        if self.memory.spill_limit() == Some(0) {
            return Err(InvalidSettings::ZeroSpillLimit);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(bytes: u64) -> GpuSettings {
        GpuSettings {
            memory_limit: Some(bytes),
            ..Default::default()
        }
    }

    #[test]
    fn the_mode_goes_with_the_quota_and_policy_and_window_with_the_share() {
        let asked = GpuSettings {
            memory_limit: None,
            memory: MemoryMode::Oversubscribe { reserve: 1 },
            compute_limit: Some(30),
            compute_request: Some(20),
            compute_policy: Policy::Force,
            compute_window_ms: Some(250),
        };
        let share_alone = asked.tied();
        assert_eq!(share_alone.memory, MemoryMode::Plain);
        assert_eq!(
            (share_alone.compute_policy, share_alone.compute_window_ms),
            (Policy::Force, Some(250))
        );
        let quota_alone = GpuSettings {
            memory_limit: Some(1 << 30),
            compute_limit: None,
            compute_request: None,
            ..asked
        }
        .tied();
        assert_eq!(quota_alone.memory, MemoryMode::Oversubscribe { reserve: 1 });
        assert_eq!(
            (quota_alone.compute_policy, quota_alone.compute_window_ms),
            (Policy::Default, None)
        );
        assert!(GpuSettings::default().tied().is_unlimited());
        // A request alone is a share: the policy and window go with it.
        let request_alone = GpuSettings {
            compute_limit: None,
            ..asked
        }
        .tied();
        assert_eq!(
            (
                request_alone.compute_policy,
                request_alone.compute_window_ms
            ),
            (Policy::Force, Some(250))
        );
        assert!(!request_alone.is_unlimited());
    }

    #[test]
    fn each_rule_is_its_variant() {
        let broken = |edit: fn(&mut GpuSettings)| {
            let mut s = memory(1 << 30);
            edit(&mut s);
            s.validate().unwrap_err()
        };
        assert_eq!(
            broken(|s| s.memory_limit = Some(0)),
            InvalidSettings::ZeroMemoryLimit
        );
        assert_eq!(broken(|s| s.memory_limit = None), InvalidSettings::NoLimit);
        assert_eq!(
            broken(|s| {
                s.memory_limit = None;
                s.compute_limit = Some(5);
                s.memory = MemoryMode::Spill { spill_limit: 5 };
            }),
            InvalidSettings::ModeWithoutMemoryLimit { mode: "spill" }
        );
        assert_eq!(
            broken(|s| s.compute_limit = Some(100)),
            InvalidSettings::ComputeLimit { percent: 100 }
        );
        assert_eq!(
            broken(|s| s.compute_request = Some(0)),
            InvalidSettings::ComputeRequest { percent: 0 }
        );
        assert_eq!(
            broken(|s| s.compute_request = Some(101)),
            InvalidSettings::ComputeRequest { percent: 101 }
        );
        assert_eq!(
            broken(|s| {
                s.compute_limit = Some(30);
                s.compute_request = Some(40);
            }),
            InvalidSettings::RequestAboveLimit {
                request: 40,
                limit: 30
            }
        );
        assert_eq!(
            broken(|s| {
                s.memory_limit = None;
                s.compute_request = Some(5);
                s.memory = MemoryMode::Spill { spill_limit: 5 };
            }),
            InvalidSettings::ModeWithoutMemoryLimit { mode: "spill" }
        );
        assert_eq!(
            broken(|s| {
                s.compute_limit = Some(5);
                s.compute_window_ms = Some(5);
            }),
            InvalidSettings::ComputeWindow { window_ms: 5 }
        );
        assert_eq!(
            broken(|s| s.memory = MemoryMode::Spill { spill_limit: 0 }),
            InvalidSettings::ZeroSpillLimit
        );
        assert_eq!(memory(1).validate(), Ok(()));
        // A request alone (up to the whole GPU), or at most the limit, is valid.
        for (request, limit) in [(Some(100), None), (Some(30), None), (Some(30), Some(30))] {
            let s = GpuSettings {
                compute_request: request,
                compute_limit: limit,
                ..Default::default()
            };
            assert_eq!(s.validate(), Ok(()), "{s:?}");
        }
    }

    #[test]
    fn request_and_limit_as_the_division_reads_them() {
        let share = |request, limit| GpuSettings {
            compute_request: request,
            compute_limit: limit,
            ..Default::default()
        };
        // A limit alone is its own request: a hard cap.
        assert_eq!(share(None, Some(30)).request_limit(), Some((30, 30)));
        // A request alone may use the whole GPU.
        assert_eq!(share(Some(30), None).request_limit(), Some((30, 100)));
        assert_eq!(share(Some(20), Some(60)).request_limit(), Some((20, 60)));
        assert_eq!(share(None, None).request_limit(), None);
        let mut s = share(Some(20), Some(60));
        s.compute_policy = Policy::Disable;
        assert_eq!(s.request_limit(), None);
        // The library's cap: the limit alone (none for a request alone).
        assert_eq!(share(Some(30), None).compute_share(), None);
        assert!(share(Some(30), None).has_compute_share());
    }

    #[test]
    fn the_share_is_off_under_disable() {
        let mut s = GpuSettings {
            compute_limit: Some(30),
            ..Default::default()
        };
        assert_eq!(s.compute_share(), Some(30));
        s.compute_policy = Policy::Disable;
        assert_eq!(s.compute_share(), None);
    }
}
