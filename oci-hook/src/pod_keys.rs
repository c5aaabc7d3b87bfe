//! The forms of a per-GPU annotation and which of them decide this container: `<key>` (every GPU),
//! `<key>.<i>` (the container's i-th GPU) and, in a Kubernetes pod, `<key>.<container>` and
//! `<key>.<container>.<i>`, matched against the container name the CRI runtime writes into the spec. Shared
//! by the memory quota (`crate::memory_request`) and the compute share (`crate::compute_request`). Not here:
//! what a value means.
//!
//! Keys naming a container decide that container's setting entirely; a container no key names gets the
//! plain keys (the pod's default). Container names are DNS labels and a segment of digits is a GPU index, so
//! the two never mix up (a container whose name is all digits cannot be named).

use std::collections::BTreeMap;
use vgpu_ledger::envlimits;
use vgpu_ledger::keys::kube;

/// Annotations a CRI runtime writes with the container's name in its pod (containerd, CRI-O).
const CONTAINER_NAME_KEYS: [&str; 2] = [kube::CRI_CONTAINER_NAME, kube::CRIO_CONTAINER_NAME];

/// Where the container stands, for the container-keyed annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodMember<'a> {
    /// Not made by a CRI runtime: `<key>.<name>` is a mistake.
    NotInPod,
    /// In a pod without a container name (the sandbox): keys naming containers are not for it.
    Unnamed,
    /// The pod's container of this name.
    Named(&'a str),
}

impl<'a> PodMember<'a> {
    /// From the spec's annotations.
    pub fn of(annotations: &'a [(String, String)]) -> PodMember<'a> {
        let named = annotations
            .iter()
            .find(|(k, v)| CONTAINER_NAME_KEYS.contains(&k.as_str()) && !v.is_empty());
        if let Some((_, name)) = named {
            return PodMember::Named(name);
        }
        if annotations
            .iter()
            .any(|(k, _)| kube::POD_MARKERS.contains(&k.as_str()))
        {
            return PodMember::Unnamed;
        }
        PodMember::NotInPod
    }

    pub fn in_a_pod(self) -> bool {
        self != PodMember::NotInPod
    }
}

/// A key of a per-GPU annotation that no container or GPU can match. `Display` is one line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFormError {
    /// `<key>.<name>` outside a pod.
    #[error("annotation {key}: {name:?} is not a GPU index (expected {base}.<0..{max}>; {base}.<container>[.<i>] is for the containers of a Kubernetes pod)", max = envlimits::MAX_INDEX)]
    ContainerOutsidePod {
        key: String,
        name: String,
        base: String,
    },
    /// `<key>.<name>` where `name` is no DNS label.
    #[error("annotation {key}: {name:?} is neither a GPU index nor a container name (a DNS label: lowercase letters, digits, '-')")]
    NotAContainerName { key: String, name: String },
    /// `<key>[.<container>].<i>` where `i` is no index.
    #[error("annotation {key}: {index:?} is not a GPU index (expected {base}.<0..{max}>)", max = envlimits::MAX_INDEX)]
    NotAnIndex {
        key: String,
        index: String,
        base: String,
    },
}

/// Whether `s` can be a Kubernetes container name (a DNS label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most
/// 63 characters).
fn is_container_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// What the part of a key after `<base>.` addresses.
enum Target<'k> {
    /// `<i>`: the container's GPU i.
    Gpu(&'k str),
    /// `<container>` or `<container>.<i>`: a container of the pod, all its GPUs or GPU i.
    Container(&'k str, Option<&'k str>),
}

fn target(rest: &str) -> Target<'_> {
    if rest.bytes().all(|c| c.is_ascii_digit()) {
        return Target::Gpu(rest);
    }
    match rest.split_once('.') {
        Some((name, idx)) => Target::Container(name, Some(idx)),
        None => Target::Container(rest, None),
    }
}

/// One annotation of a per-GPU setting that decides this container: its key, its value, and the
/// container's GPU it is for (None: every GPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub gpu: Option<usize>,
}

/// The annotations `base`, `base.<i>` and, in a pod, `base.<container>[.<i>]` that decide this
/// container, and whether they name it. The last occurrence of a key wins (as for env). Keys naming this
/// container and the pod's plain keys are gathered apart: the first decide alone when present. A key no
/// container name can match, or one naming a container outside a pod, or a GPU index out of range, is an
/// error.
pub fn keyed<'a>(
    pairs: &'a [(String, String)],
    member: PodMember,
    base: &str,
) -> Result<(Vec<Keyed<'a>>, bool), KeyFormError> {
    let mut pod: BTreeMap<&str, &str> = BTreeMap::new();
    let mut mine: BTreeMap<&str, &str> = BTreeMap::new();
    for (k, v) in pairs {
        let rest = if k == base {
            None
        } else if let Some(r) = k.strip_prefix(base).and_then(|r| r.strip_prefix('.')) {
            Some(r)
        } else {
            continue;
        };
        let Some(Target::Container(name, _)) = rest.map(target) else {
            pod.insert(k, v);
            continue;
        };
        if member == PodMember::NotInPod {
            return Err(KeyFormError::ContainerOutsidePod {
                key: k.clone(),
                name: name.to_string(),
                base: base.to_string(),
            });
        }
        if !is_container_name(name) {
            return Err(KeyFormError::NotAContainerName {
                key: k.clone(),
                name: name.to_string(),
            });
        }
        if member == PodMember::Named(name) {
            mine.insert(k, v);
        }
    }
    let (chosen, for_container) = if mine.is_empty() {
        (pod, false)
    } else {
        (mine, true)
    };
    let mut out = Vec::new();
    for (key, value) in chosen {
        let idx = match key
            .strip_prefix(base)
            .and_then(|r| r.strip_prefix('.'))
            .map(target)
        {
            None | Some(Target::Container(_, None)) => None,
            Some(Target::Gpu(i)) | Some(Target::Container(_, Some(i))) => Some(i),
        };
        let gpu = match idx.map(|i| (i, envlimits::parse_index(i))) {
            None => None,
            Some((_, Some(i))) => Some(i as usize),
            Some((i, None)) => {
                return Err(KeyFormError::NotAnIndex {
                    key: key.to_string(),
                    index: i.to_string(),
                    base: base.to_string(),
                })
            }
        };
        out.push(Keyed { key, value, gpu });
    }
    Ok((out, for_container))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::kv;

    const BASE: &str = "vgpu.io/memory-limit";

    #[test]
    fn where_a_container_stands() {
        let a = kv(&[("io.kubernetes.container.name", "web")]);
        assert_eq!(PodMember::of(&a), PodMember::Named("web"));
        let a = kv(&[("io.kubernetes.cri.container-type", "sandbox")]);
        assert_eq!(PodMember::of(&a), PodMember::Unnamed);
        assert!(!PodMember::of(&kv(&[("x", "y")])).in_a_pod());
    }

    #[test]
    fn keys_naming_this_container_decide_alone() {
        let a = kv(&[
            (BASE, "1"),
            ("vgpu.io/memory-limit.1", "2"),
            ("vgpu.io/memory-limit.web.1", "3"),
            ("vgpu.io/memory-limit.db", "4"),
        ]);
        let (k, mine) = keyed(&a, PodMember::Named("web"), BASE).unwrap();
        assert!(mine);
        assert_eq!(
            k,
            vec![Keyed {
                key: "vgpu.io/memory-limit.web.1",
                value: "3",
                gpu: Some(1)
            }]
        );
        let (k, mine) = keyed(&a, PodMember::Unnamed, BASE).unwrap();
        assert!(!mine);
        assert_eq!(
            k.iter().map(|k| k.gpu).collect::<Vec<_>>(),
            vec![None, Some(1)]
        );
    }

    #[test]
    fn keys_that_cannot_match() {
        let err = |k: &str, m| keyed(&kv(&[(k, "1")]), m, BASE).unwrap_err();
        assert!(matches!(
            err("vgpu.io/memory-limit.web", PodMember::NotInPod),
            KeyFormError::ContainerOutsidePod { name, .. } if name == "web"
        ));
        assert!(matches!(
            err("vgpu.io/memory-limit.Web", PodMember::Unnamed),
            KeyFormError::NotAContainerName { .. }
        ));
        assert!(matches!(
            err("vgpu.io/memory-limit.web.x", PodMember::Named("web")),
            KeyFormError::NotAnIndex { index, .. } if index == "x"
        ));
        assert!(matches!(
            err("vgpu.io/memory-limit.1024", PodMember::NotInPod),
            KeyFormError::NotAnIndex { .. }
        ));
    }
}
