//! The forms of a per-GPU annotation and which of them decide this container: `<key>` (every GPU),
//! `<key>.<i>` (the container's i-th GPU) and, in a Kubernetes pod, `<key>.<container>` and
//! `<key>.<container>.<i>`, matched against the container name the CRI runtime writes into the spec. Shared
//! by the memory quota (`crate::memory_request`) and the compute share (`crate::compute_request`). Not here:
//! what a value means.
//!
//! Also here: the Kubernetes names a container's annotations give (`check_names`), which vgpu records in the
//! limits file for the monitor's labels and logs, held to Kubernetes' own rules (namespace and container
//! name DNS labels, pod name a DNS subdomain, at most 253 bytes): what no kubelet writes (a name of
//! 128 KiB, quotes and newlines) is a hand-made spec, refused with one line naming the annotation.
//!
//! Keys naming a container decide that container's setting entirely; a container no key names gets the
//! plain keys (the pod's default). Container names are DNS labels and a segment of digits is a GPU index, so
//! the two never mix up (a container whose name is all digits cannot be named).

use std::collections::BTreeMap;
use vgpu_host::keys::kube;
use vgpu_ledger::envlimits;

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
    is_dns_label(s)
}

/// An RFC 1123 DNS label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 bytes.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label_text(s)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_text(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An RFC 1123 DNS subdomain as Kubernetes checks it: label text joined by '.', at most 253 bytes.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME && s.split('.').all(is_label_text)
}

/// Longest Kubernetes name (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// Which Kubernetes name an annotation gives, and its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Namespace,
    Pod,
    Container,
}

impl NameKind {
    fn rule(self) -> &'static str {
        match self {
            NameKind::Pod => {
                "a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 bytes"
            }
            _ => "a DNS label: lowercase letters, digits and '-', at most 63 bytes",
        }
    }
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Namespace => "namespace",
            NameKind::Pod => "pod name",
            NameKind::Container => "container name",
        })
    }
}

/// The annotations that give a container's Kubernetes names (CRI-O's and containerd's), and which name.
const NAME_KEYS: [(&str, NameKind); 6] = [
    (kube::CRIO_POD_NAMESPACE, NameKind::Namespace),
    (kube::CRI_SANDBOX_NAMESPACE, NameKind::Namespace),
    (kube::CRIO_POD_NAME, NameKind::Pod),
    (kube::CRI_SANDBOX_NAME, NameKind::Pod),
    (kube::CRIO_CONTAINER_NAME, NameKind::Container),
    (kube::CRI_CONTAINER_NAME, NameKind::Container),
];

/// A Kubernetes name annotation Kubernetes itself would refuse. `Display` is one line naming the
/// annotation, the value's start (escaped) and its length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("annotation {key}: {head:?}{} ({len} bytes) is not a Kubernetes {kind} ({})", if *.len > head.len() { "..." } else { "" }, kind.rule())]
    NotAName {
        key: String,
        /// The value's first characters.
        head: String,
        len: usize,
        kind: NameKind,
    },
}

/// Checks every Kubernetes name annotation (empty ones are not given); the first bad one is the error.
pub fn check_names(annotations: &[(String, String)]) -> Result<(), NameError> {
    for (k, v) in annotations {
        let Some(&(_, kind)) = NAME_KEYS.iter().find(|(key, _)| key == k) else {
            continue;
        };
        let ok = match kind {
            NameKind::Pod => is_dns_subdomain(v),
            _ => is_dns_label(v),
        };
        if !v.is_empty() && !ok {
            return Err(NameError::NotAName {
                key: k.clone(),
                head: v.chars().take(40).collect(),
                len: v.len(),
                kind,
            });
        }
    }
    Ok(())
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
    fn kubernetes_names_as_kubernetes_writes_them_and_no_other() {
        let ok = kv(&[
            ("io.kubernetes.pod.namespace", "ml-team"),
            ("io.kubernetes.pod.name", "trainer-0.v2"),
            ("io.kubernetes.container.name", "main"),
            ("io.kubernetes.cri.sandbox-name", &"a".repeat(MAX_NAME)),
            ("io.kubernetes.cri.container-name", ""),
        ]);
        assert_eq!(check_names(&ok), Ok(()));
        let bad = |k: &str, v: &str| check_names(&kv(&[(k, v)])).unwrap_err();
        let huge = "p".repeat(128 << 10);
        let e = bad("io.kubernetes.pod.name", &huge);
        assert!(
            matches!(&e, NameError::NotAName { kind: NameKind::Pod, len, .. } if *len == 128 << 10),
            "{e:?}"
        );
        let line = e.to_string();
        assert!(line.len() < 300 && !line.contains('\n'), "{line}");
        assert!(matches!(
            bad("io.kubernetes.cri.sandbox-name", &"a".repeat(MAX_NAME + 1)),
            NameError::NotAName {
                kind: NameKind::Pod,
                ..
            }
        ));
        let e = bad("io.kubernetes.pod.namespace", "x\"} 0\n# EOF");
        assert!(matches!(
            e,
            NameError::NotAName {
                kind: NameKind::Namespace,
                ..
            }
        ));
        assert!(!e.to_string().contains('\n'), "escaped: {e}");
        for (k, v) in [
            ("io.kubernetes.container.name", "Main"),
            ("io.kubernetes.cri.container-name", "a.b"),
            ("io.kubernetes.cri.sandbox-namespace", &"n".repeat(64)),
            ("io.kubernetes.pod.name", "-p"),
            ("io.kubernetes.pod.name", "p..q"),
        ] {
            assert!(check_names(&kv(&[(k, v)])).is_err(), "{k}={v}");
        }
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
