//! The quota a Kubernetes DRA claim fixes. vgpu-dra-plugin writes, per prepared claim, a CDI spec whose
//! hooks carry the claim's quota in the hook's own environment (`VGPU_CLAIM_QUOTA`, set by the spec, never
//! by the container); the hook then reads the container's request with the claim's settings in place of
//! every quota setting of the container's own (annotations and env alike), so a tenant cannot raise the
//! quota the scheduler counted. The claim's settings then take the container's own path: read by
//! `Request::read` and turned into each GPU's `vgpu_ledger::GpuSettings` by `Request::settings_for`, as
//! every quota is. Not here: reading and checking the settings (`crate::request`).
//!
//! The value is the quota annotations' own grammar, comma-separated: `vgpu.io/memory-limit=8Gi`,
//! `vgpu.io/compute-request=30` (a claim's compute capacity is its request, vgpu-dra-plugin's),
//! `vgpu.io/compute-limit=30`, or their per-GPU forms `.<i>`.
//!
//! A claim is bound to the pods it is reserved for: the same spec gives the hook their uids
//! (`VGPU_CLAIM_PODS`), and the hook refuses a container whose pod uid, as the CRI runtime itself wrote it
//! (containerd's `io.kubernetes.cri.sandbox-uid`, CRI-O's `io.kubernetes.pod.uid`), is not one of them.
//! Without it a tenant who may write `cdi.k8s.io/*` pod annotations could name another claim's CDI device
//! (its uid is in the name) and get that claim's quota a second time.

use crate::request::SpecFacts;
use vgpu_host::keys::kube;
use vgpu_ledger::keys::{annotation, env};

/// A claim's quota settings, as annotation key/value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimQuota {
    pub settings: Vec<(String, String)>,
    /// The uids of the pods the claim is reserved for (empty: none named, every container refused).
    pub pods: Vec<String>,
}

/// A `VGPU_CLAIM_QUOTA` that cannot be read. `Display` is one line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimQuotaError {
    #[error("{var}={value:?}: {entry:?} is not KEY=VALUE", var = vgpu_host::keys::host::CLAIM_QUOTA_VAR)]
    Malformed { value: String, entry: String },
    #[error("{var}: {key:?} is not a quota setting (vgpu.io/memory-limit, vgpu.io/compute-limit or vgpu.io/compute-request, or their .<i> forms)", var = vgpu_host::keys::host::CLAIM_QUOTA_VAR)]
    NotQuota { key: String },
    #[error("{var} is set but empty", var = vgpu_host::keys::host::CLAIM_QUOTA_VAR)]
    Empty,
    /// The shim provisioned the container from its own settings before this hook saw the claim.
    #[error("container {id} has a DRA claim's quota but ran under vgpu's runtime handler, which planned from its own annotations: run a claim's pod with the default handler")]
    UnderShim { id: String },
    /// The claim's spec names no pod (one vgpu-dra-plugin wrote before claims were bound to their pods).
    #[error("{quota} is set without {pods}: the DRA claim's CDI spec names no pod it is for (unprepare and prepare the claim again)", quota = vgpu_host::keys::host::CLAIM_QUOTA_VAR, pods = vgpu_host::keys::host::CLAIM_PODS_VAR)]
    Unbound,
    /// The container's spec carries no pod uid from a CRI runtime.
    #[error("container {id} uses a DRA claim's device but names no pod ({keys}): a claim's devices are for the pods it is reserved for", keys = kube::POD_UID_KEYS.join(" or "))]
    NoPod { id: String },
    /// The container is another pod's.
    #[error("container {id} is in pod {pod}, which the DRA claim is not reserved for (it is for {pods}): another pod's claim cannot be used")]
    NotConsumer {
        id: String,
        pod: String,
        pods: String,
    },
}

/// Whether `key` is `base` or `base.<something>` (the per-GPU and per-container forms).
fn is_form(key: &str, base: &str) -> bool {
    key.strip_prefix(base)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Whether `name` is `base` or `base_<something>`.
fn is_env_form(name: &str, base: &str) -> bool {
    name.strip_prefix(base)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
}

impl ClaimQuota {
    /// Parses the variable's value.
    pub fn parse(value: &str) -> Result<ClaimQuota, ClaimQuotaError> {
        let mut settings = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((k, v)) = entry.split_once('=') else {
                return Err(ClaimQuotaError::Malformed {
                    value: value.to_string(),
                    entry: entry.to_string(),
                });
            };
            let per_gpu = |base: &str| {
                k.strip_prefix(base).is_some_and(|rest| {
                    rest.is_empty()
                        || rest
                            .strip_prefix('.')
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                })
            };
            if !per_gpu(annotation::MEMORY_LIMIT)
                && !per_gpu(annotation::COMPUTE_LIMIT)
                && !per_gpu(annotation::COMPUTE_REQUEST)
            {
                return Err(ClaimQuotaError::NotQuota { key: k.to_string() });
            }
            settings.push((k.to_string(), v.to_string()));
        }
        if settings.is_empty() {
            return Err(ClaimQuotaError::Empty);
        }
        Ok(ClaimQuota {
            settings,
            pods: Vec::new(),
        })
    }

    /// With the pods of `value` (`VGPU_CLAIM_PODS`: uids, comma-separated) as the claim's consumers.
    pub fn for_pods(mut self, value: &str) -> ClaimQuota {
        self.pods = value
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        self
    }

    /// The claim of the hook's own environment, if its CDI spec gave one, with the pods it is for.
    pub fn from_env() -> Result<Option<ClaimQuota>, ClaimQuotaError> {
        ClaimQuota::from_vars(
            std::env::var(vgpu_host::keys::host::CLAIM_QUOTA_VAR)
                .ok()
                .as_deref(),
            std::env::var(vgpu_host::keys::host::CLAIM_PODS_VAR)
                .ok()
                .as_deref(),
        )
    }

    /// The claim of the two variables' values (`VGPU_CLAIM_QUOTA`, `VGPU_CLAIM_PODS`): none without a
    /// quota; a quota without pods is a spec that binds the claim to no pod, refused.
    pub fn from_vars(
        quota: Option<&str>,
        pods: Option<&str>,
    ) -> Result<Option<ClaimQuota>, ClaimQuotaError> {
        let Some(quota) = quota else {
            return Ok(None);
        };
        let pods = pods.ok_or(ClaimQuotaError::Unbound)?;
        Ok(Some(ClaimQuota::parse(quota)?.for_pods(pods)))
    }

    /// Refuses a container that is not in one of the claim's pods. Its pod uid is read from every key the
    /// CRI runtimes write it under (`annotations`: the spec's, as the runtime made them); each one present
    /// must name a pod of the claim, so a second key a tenant slipped in cannot vouch for it.
    pub fn check_consumer(
        &self,
        annotations: &[(String, String)],
        id: &str,
    ) -> Result<(), ClaimQuotaError> {
        let uids: Vec<&str> = annotations
            .iter()
            .filter(|(k, _)| kube::POD_UID_KEYS.contains(&k.as_str()))
            .map(|(_, v)| v.as_str())
            .collect();
        if uids.is_empty() {
            return Err(ClaimQuotaError::NoPod { id: id.to_string() });
        }
        match uids.iter().find(|u| !self.pods.iter().any(|p| p == *u)) {
            Some(pod) => Err(ClaimQuotaError::NotConsumer {
                id: id.to_string(),
                pod: pod.to_string(),
                pods: if self.pods.is_empty() {
                    "no pod".to_string()
                } else {
                    self.pods.join(", ")
                },
            }),
            None => Ok(()),
        }
    }
}

/// Refuses a claim's container that vgpu's shim already provisioned (`shim_ran`): the shim planned from
/// the container's own settings, which the claim must replace, so its quota is no claim's.
pub fn check_not_under_shim(
    claim: Option<&ClaimQuota>,
    shim_ran: bool,
    id: &str,
) -> Result<(), ClaimQuotaError> {
    match (claim, shim_ran) {
        (Some(_), true) => Err(ClaimQuotaError::UnderShim { id: id.to_string() }),
        _ => Ok(()),
    }
}

impl SpecFacts {
    /// With the claim's quota in place of the container's: every memory and compute quota setting of the
    /// container (annotations in every form, HAMi's env variables) goes, the claim's come in.
    pub fn with_claim(mut self, claim: &ClaimQuota) -> SpecFacts {
        self.annotations.retain(|(k, _)| {
            ![
                annotation::MEMORY_LIMIT,
                annotation::COMPUTE_LIMIT,
                annotation::COMPUTE_REQUEST,
            ]
            .iter()
            .any(|base| is_form(k, base))
        });
        self.env.retain(|(k, _)| {
            ![env::MEMORY_LIMIT, env::SM_LIMIT, env::SM_REQUEST]
                .iter()
                .any(|base| is_env_form(k, base))
        });
        self.annotations.extend(claim.settings.iter().cloned());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Request;
    use crate::testing::kv;

    #[test]
    fn the_claim_replaces_every_quota_setting_of_the_container() {
        let facts = SpecFacts {
            env: kv(&[
                ("CUDA_DEVICE_MEMORY_LIMIT", "30g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "31g"),
                ("CUDA_DEVICE_SM_LIMIT", "90"),
            ]),
            annotations: kv(&[
                ("vgpu.io/memory-limit", "16Gi"),
                ("vgpu.io/memory-limit.0", "20Gi"),
                ("vgpu.io/memory-limit.main", "24Gi"),
                ("vgpu.io/compute-limit", "90"),
                ("io.kubernetes.cri.container-name", "main"),
            ]),
            ..Default::default()
        };
        // Without the claim, the tenant's own figures decide.
        let own = Request::read(&facts).unwrap();
        assert_eq!(own.memory.limit_for(0).unwrap().bytes, 24 << 30);
        let claim =
            ClaimQuota::parse("vgpu.io/memory-limit=8Gi, vgpu.io/compute-limit=30").unwrap();
        let r = Request::read(&facts.with_claim(&claim)).unwrap();
        assert_eq!(r.memory.limit_for(0).unwrap().bytes, 8 << 30);
        assert_eq!(r.memory.limit_for(1).unwrap().bytes, 8 << 30);
        assert_eq!(r.compute.share_for(0).unwrap().percent, Some(30));
        // The tenant's own requests (annotations in every form, env) go too: a claim's compute is its
        // request, and the tenant cannot raise its floor.
        let facts = SpecFacts {
            env: kv(&[
                ("CUDA_DEVICE_SM_REQUEST", "100"),
                ("CUDA_DEVICE_SM_REQUEST_0", "100"),
            ]),
            annotations: kv(&[
                ("vgpu.io/compute-request", "100"),
                ("vgpu.io/compute-request.0", "100"),
                ("vgpu.io/compute-request.main", "100"),
                ("io.kubernetes.cri.container-name", "main"),
            ]),
            ..Default::default()
        };
        let claim =
            ClaimQuota::parse("vgpu.io/memory-limit=8Gi,vgpu.io/compute-request=30").unwrap();
        let r = Request::read(&facts.with_claim(&claim)).unwrap();
        let s = r.settings_for(0);
        assert_eq!((s.compute_request, s.compute_limit), (Some(30), None));
        assert_eq!(r.settings_for(1).compute_request, Some(30));
    }

    #[test]
    fn a_claims_container_provisioned_by_the_shim_is_refused() {
        let c = ClaimQuota::parse("vgpu.io/memory-limit=8Gi").unwrap();
        assert_eq!(
            check_not_under_shim(Some(&c), true, "c1"),
            Err(ClaimQuotaError::UnderShim { id: "c1".into() })
        );
        assert_eq!(check_not_under_shim(Some(&c), false, "c1"), Ok(()));
        assert_eq!(check_not_under_shim(None, true, "c1"), Ok(()));
    }

    #[test]
    fn a_claims_device_serves_only_the_pods_it_is_reserved_for() {
        let c = ClaimQuota::parse("vgpu.io/memory-limit=8Gi")
            .unwrap()
            .for_pods("pod-a, pod-b,");
        assert_eq!(c.pods, vec!["pod-a".to_string(), "pod-b".into()]);
        // containerd's and CRI-O's keys, each alone.
        let ok = kv(&[("io.kubernetes.cri.sandbox-uid", "pod-b")]);
        assert_eq!(c.check_consumer(&ok, "c1"), Ok(()));
        let ok = kv(&[("io.kubernetes.pod.uid", "pod-a")]);
        assert_eq!(c.check_consumer(&ok, "c1"), Ok(()));
        // Another pod's container (a tenant naming this claim's CDI device).
        let foreign = kv(&[("io.kubernetes.cri.sandbox-uid", "pod-x")]);
        assert!(matches!(
            c.check_consumer(&foreign, "c1"),
            Err(ClaimQuotaError::NotConsumer { pod, .. }) if pod == "pod-x"
        ));
        // A second key cannot vouch for a foreign pod: every key present must name one of the claim's.
        let mixed = kv(&[
            ("io.kubernetes.cri.sandbox-uid", "pod-x"),
            ("io.kubernetes.pod.uid", "pod-a"),
        ]);
        assert!(matches!(
            c.check_consumer(&mixed, "c1"),
            Err(ClaimQuotaError::NotConsumer { .. })
        ));
        // No pod at all (a container outside Kubernetes given the device).
        assert_eq!(
            c.check_consumer(&kv(&[("vgpu.io/memory-limit", "1Gi")]), "c1"),
            Err(ClaimQuotaError::NoPod { id: "c1".into() })
        );
        // From the hook's variables: no quota, no claim; a quota without its pods (a spec that binds the
        // claim to none) is refused.
        assert_eq!(ClaimQuota::from_vars(None, Some("pod-a")), Ok(None));
        assert_eq!(
            ClaimQuota::from_vars(Some("vgpu.io/memory-limit=8Gi"), None),
            Err(ClaimQuotaError::Unbound)
        );
        assert_eq!(
            ClaimQuota::from_vars(Some("vgpu.io/memory-limit=8Gi"), Some("pod-a"))
                .unwrap()
                .unwrap()
                .pods,
            vec!["pod-a".to_string()]
        );
        // A claim that names no pod serves none.
        let none = ClaimQuota::parse("vgpu.io/memory-limit=8Gi")
            .unwrap()
            .for_pods(" ");
        assert!(matches!(
            none.check_consumer(&kv(&[("io.kubernetes.pod.uid", "")]), "c1"),
            Err(ClaimQuotaError::NotConsumer { .. })
        ));
    }

    #[test]
    fn per_gpu_claims_and_bad_values() {
        let c = ClaimQuota::parse("vgpu.io/memory-limit.1=2Gi,vgpu.io/memory-limit.0=4Gi").unwrap();
        let r = Request::read(&SpecFacts::default().with_claim(&c)).unwrap();
        assert_eq!(r.memory.limit_for(0).unwrap().bytes, 4 << 30);
        assert_eq!(r.memory.limit_for(1).unwrap().bytes, 2 << 30);
        assert!(matches!(
            ClaimQuota::parse("vgpu.io/memory-mode=spill"),
            Err(ClaimQuotaError::NotQuota { .. })
        ));
        let c =
            ClaimQuota::parse("vgpu.io/compute-request.1=20,vgpu.io/compute-request.0=40").unwrap();
        let r = Request::read(&SpecFacts::default().with_claim(&c)).unwrap();
        assert_eq!(r.settings_for(0).compute_request, Some(40));
        assert_eq!(r.settings_for(1).compute_request, Some(20));
        assert!(matches!(
            ClaimQuota::parse("vgpu.io/compute-request.main=30"),
            Err(ClaimQuotaError::NotQuota { .. })
        ));
        assert!(matches!(
            ClaimQuota::parse("vgpu.io/memory-limit.main=1Gi"),
            Err(ClaimQuotaError::NotQuota { .. })
        ));
        assert!(matches!(
            ClaimQuota::parse("8Gi"),
            Err(ClaimQuotaError::Malformed { .. })
        ));
        assert_eq!(ClaimQuota::parse(" , "), Err(ClaimQuotaError::Empty));
        // A bad figure is the request's error, as an annotation's would be.
        let c = ClaimQuota::parse("vgpu.io/memory-limit=8Qi").unwrap();
        assert!(Request::read(&SpecFacts::default().with_claim(&c)).is_err());
    }
}
