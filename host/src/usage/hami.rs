//! HAMi's containers as the monitor sees them: made from HAMi's per-container folders ([`from_hami`]) and
//! given the quota their containerd bundle holds ([`join_host_quotas`]).

use super::{from_snapshot, ContainerState, GpuState, Origin};
use vgpu_ledger::KubeNames;

/// A container of HAMi's per-container folders (`crate::hami`), one GPU per ledger: the quota the library
/// wrote in the ledger's header (none where it was given none), its usage as a state root's. Kubernetes'
/// names are the pod's UID for the pod (the folder names no namespace or pod name) and the container's
/// name. Each GPU's index is its rank among the folder's GPUs in `order` (NVML's UUIDs by index: CUDA's
/// order inside, for GPUs of one model), by UUID after those NVML does not list.
pub fn from_hami(f: &crate::hami::Folder, order: &[String]) -> ContainerState {
    let mut ledgers: Vec<&crate::hami::Ledger> = f.ledgers.iter().collect();
    let at = |u: &str| order.iter().position(|o| o == u).unwrap_or(usize::MAX);
    ledgers.sort_by(|a, b| (at(&a.uuid), &a.uuid).cmp(&(at(&b.uuid), &b.uuid)));
    ContainerState {
        id: format!("hami/{}", f.name),
        origin: Origin::Hami {
            pod_uid: f.pod_uid.clone(),
            container: f.container.clone(),
            dir: f.dir.clone(),
            bundle: None,
        },
        names: Some(KubeNames {
            namespace: String::new(),
            pod: f.pod_uid.clone(),
            container: f.container.clone(),
        }),
        gpus: ledgers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mut g = GpuState {
                    index: i as u32,
                    uuid: l.uuid.clone(),
                    // The library records "no quota" as the ledger's largest total.
                    limit: (l.snapshot.limit < vgpu_ledger::region::MAX_TOTAL)
                        .then_some(l.snapshot.limit),
                    ..Default::default()
                };
                from_snapshot(&mut g, &l.snapshot);
                g
            })
            .collect(),
        ..Default::default()
    }
}

/// A container of HAMi's folders given the quota its bundle's spec holds (`hami::bundle`), the host's
/// record: each of the spec's GPUs (in `order`, NVML's, as `from_hami` counts them: CUDA's index inside)
/// gets `CUDA_DEVICE_MEMORY_LIMIT[_<i>]` as its limit, whatever the ledger's header says (the tenant's
/// file), and `CUDA_DEVICE_SM_LIMIT[_<i>]` as its compute share's limit, a cap that is its own request
/// (HAMi has no floors; a request the spec names is not HAMi's scheduler's and is not taken) under the
/// spec's policy (`disable`: none) and pacing window, a GPU without a ledger included; a ledger's GPU the
/// spec does not give has no limit and no share. Its init,
/// namespace and cgroup are the init's the shim recorded, so the processes are matched as a state root
/// container's are (`attribution::owner_of`) and it is live while that init runs.
pub fn with_host_quota(
    c: &mut ContainerState,
    q: &crate::hami::bundle::HostQuota,
    order: &[String],
) {
    if let Origin::Hami { bundle, .. } = &mut c.origin {
        *bundle = Some(q.bundle.clone());
    }
    let at = |u: &str| order.iter().position(|o| o == u).unwrap_or(usize::MAX);
    let mut uuids: Vec<&String> = q.uuids.iter().collect();
    uuids.sort_by(|a, b| (at(a), a).cmp(&(at(b), b)));
    uuids.dedup();
    for g in &mut c.gpus {
        g.limit = None;
        (g.compute_limit, g.compute_request, g.compute_window_ms) = (None, None, None);
    }
    for (i, u) in uuids.iter().enumerate() {
        let at = match c.gpus.iter().position(|g| &g.uuid == *u) {
            Some(at) => at,
            None => {
                c.gpus.push(GpuState {
                    uuid: u.to_string(),
                    ..Default::default()
                });
                c.gpus.len() - 1
            }
        };
        let g = &mut c.gpus[at];
        g.limit = Some(q.limits.bytes_for(i as u32)).filter(|&b| b > 0);
        // HAMi's share is a cap: its own request (`request_limit`), no floor promised.
        g.compute_limit = q.compute.share_for(Some(i as u32));
        g.compute_window_ms = q.window_ms;
    }
    // Indexes: the spec's GPUs first in its order, then the ledgers' others.
    let rank = |g: &GpuState| {
        let pos = uuids
            .iter()
            .position(|u| **u == g.uuid)
            .unwrap_or(usize::MAX);
        (pos, at(&g.uuid), g.uuid.clone())
    };
    c.gpus.sort_by_key(rank);
    for (i, g) in c.gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    c.init_pid = Some(q.init.pid);
    c.pid_ns = Some(q.init.ns);
    c.init_start_time = Some(q.init.start_time);
    c.cgroup = q.init.unified_cgroup();
}

/// Gives the containers of HAMi's folders `cs` (from [`from_hami`]) the quotas their bundles hold
/// ([`with_host_quota`]); a bundle whose folder has no ledger (yet, or the tenant removed it) is a container
/// too, of the folder `containers_dir/<name>`. Where two bundles name one folder, the one whose init
/// started last counts.
pub fn join_host_quotas(
    cs: &mut Vec<ContainerState>,
    quotas: &[crate::hami::bundle::HostQuota],
    containers_dir: &std::path::Path,
    order: &[String],
) {
    let mut quotas: Vec<&crate::hami::bundle::HostQuota> = quotas.iter().collect();
    quotas.sort_by_key(|q| q.init.start_time);
    for q in quotas {
        let id = format!("hami/{}", q.folder);
        let at = match cs.iter().position(|c| c.id == id) {
            Some(at) => at,
            None => {
                let Some((pod_uid, container)) = crate::hami::split_name(&q.folder) else {
                    continue;
                };
                cs.push(from_hami(
                    &crate::hami::Folder {
                        name: q.folder.clone(),
                        pod_uid: pod_uid.to_string(),
                        container: container.to_string(),
                        dir: containers_dir.join(&q.folder),
                        ledgers: vec![],
                    },
                    order,
                ));
                cs.len() - 1
            }
        };
        with_host_quota(&mut cs[at], q, order);
    }
    cs.sort_by(|a, b| a.id.cmp(&b.id));
}

#[cfg(test)]
mod tests {
    use crate::usage::hami::*;
    use crate::usage::tests::own_ns;
    use crate::usage::*;
    use vgpu_ledger::{Kind, Ledger};

    /// A folder of HAMi's: one container, its GPUs in NVML's order, the quota and usage its library
    /// recorded, live while a slot is held, named by the pod's UID and the container's name.
    #[test]
    fn a_hami_folder_is_a_container_reported_from_its_ledgers() {
        let d = tempfile::tempdir().unwrap();
        let pod = "7c0e3d1a-0000-4000-8000-000000000002";
        let dir = d.path().join(format!("{pod}_main"));
        std::fs::create_dir(&dir).unwrap();
        let (u0, u1) = ("GPU-a", "GPU-b");
        let l0 = Ledger::open_or_create(&dir.join(format!("x.cache.{u0}")), u0, 1 << 30).unwrap();
        let l1 = Ledger::open_or_create(&dir.join(format!("x.cache.{u1}")), u1, u64::MAX).unwrap();
        let slot = l1.attach().unwrap();
        l1.charge(&slot, Kind::Data, 5 << 20, u64::MAX).unwrap();
        let scan = crate::hami::scan(d.path()).unwrap();
        // NVML lists GPU-b first: it is the container's GPU 0.
        let order = vec![u1.to_string(), u0.to_string()];
        let mut cs = vec![from_hami(&scan.folders[0], &order)];
        let c = &cs[0];
        assert_eq!(c.id, format!("hami/{pod}_main"));
        assert!(
            matches!(&c.origin, Origin::Hami { pod_uid, container, .. } if pod_uid == pod && container == "main")
        );
        let n = c.names.as_ref().unwrap();
        assert_eq!(
            (n.namespace.as_str(), n.pod.as_str(), n.container.as_str()),
            ("", pod, "main")
        );
        let g: Vec<(u32, &str, Option<u64>, u64)> = c
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_str(), g.limit, g.total))
            .collect();
        assert_eq!(g, [(0, u1, None, 5 << 20), (1, u0, Some(1 << 30), 0)]);
        assert_eq!(c.gpus[0].owners, vec![(std::process::id(), own_ns())]);
        assert_eq!(
            (c.pid_ns, c.init_pid, c.cgroup.as_deref()),
            (None, None, None)
        );
        mark_live(&mut cs, |_, _, _| panic!("no init to ask about"));
        assert!(cs[0].live);
        drop(slot);
        let scan = crate::hami::scan(d.path()).unwrap();
        let mut cs = vec![from_hami(&scan.folders[0], &[])];
        mark_live(&mut cs, |_, _, _| true);
        assert!(!cs[0].live, "no slot held");
        drop((l0, l1));
    }

    /// A folder's ledger claiming 64 GiB and a bundle's spec giving 1 GiB: the spec's quota counts, the
    /// init the shim recorded names the processes and says whether it lives, a GPU the spec gives without
    /// a ledger is there, and a bundle whose folder has no ledger is a container too.
    #[test]
    fn a_bundles_quota_is_the_hami_containers_whatever_its_ledger_says() {
        use crate::hami::bundle::HostQuota;
        use vgpu_ledger::envcompute::EnvCompute;
        use vgpu_ledger::envlimits::EnvLimits;
        let d = tempfile::tempdir().unwrap();
        let pod = "7c0e3d1a-0000-4000-8000-000000000002";
        let dir = d.path().join(format!("{pod}_main"));
        std::fs::create_dir(&dir).unwrap();
        let (u0, u1) = ("GPU-a", "GPU-b");
        let l0 = Ledger::open_or_create(&dir.join(format!("x.cache.{u0}")), u0, 64 << 30).unwrap();
        let scan = crate::hami::scan(d.path()).unwrap();
        let order = vec![u0.to_string(), u1.to_string()];
        let mut cs = vec![from_hami(&scan.folders[0], &order)];
        assert_eq!(cs[0].gpus[0].limit, Some(64 << 30), "the ledger's claim");
        let env = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let quota = |folder: &str, limits: &[(&str, &str)], start: u64| HostQuota {
            bundle: d.path().join("tasks/k8s.io").join(folder),
            folder: folder.to_string(),
            uuids: vec![u1.to_string(), u0.to_string()],
            limits: EnvLimits::parse(&env(limits)).unwrap(),
            compute: EnvCompute::parse(&env(limits)).unwrap(),
            window_ms: Some(250),
            init: crate::procs::HostProc {
                pid: 77,
                ns: 4026532001,
                inner_pid: 1,
                start_time: start,
                cgroup: Some(format!("0::/kubepods/pod{pod}/c1\n")),
            },
        };
        let main = format!("{pod}_main");
        let quotas = [
            quota(
                &main,
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
                    ("CUDA_DEVICE_SM_LIMIT_0", "10"),
                ],
                5,
            ),
            quota(
                &format!("{pod}_side"),
                &[
                    ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
                    ("CUDA_DEVICE_SM_LIMIT", "30"),
                    ("GPU_CORE_UTILIZATION_POLICY", "disable"),
                ],
                6,
            ),
        ];
        // A share the ledger's side claimed (none is read from a ledger: this stands for any) is replaced.
        (cs[0].gpus[0].compute_limit, cs[0].gpus[0].compute_request) = (Some(90), Some(90));
        join_host_quotas(&mut cs, &quotas, d.path(), &order);
        assert_eq!(cs.len(), 2);
        let c = &cs[0];
        assert!(c.enforced());
        assert!(matches!(&c.origin, Origin::Hami { bundle: Some(b), .. } if b.ends_with(&main)));
        let g: Vec<(u32, &str, Option<u64>)> = c
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_str(), g.limit))
            .collect();
        assert_eq!(g, [(0, u0, Some(1 << 30)), (1, u1, None)]);
        let share: Vec<_> = c
            .gpus
            .iter()
            .map(|g| (g.request_limit(), g.compute_window_ms))
            .collect();
        assert_eq!(
            share,
            [(Some((10, 10)), Some(250)), (None, Some(250))],
            "the spec's cap, its own request, on its GPU 0 only"
        );
        assert_eq!(
            (c.init_pid, c.pid_ns, c.init_start_time, c.cgroup.as_deref()),
            (
                Some(77),
                Some(4026532001),
                Some(5),
                Some(&*format!("/kubepods/pod{pod}/c1"))
            )
        );
        let side = &cs[1];
        assert_eq!(side.id, format!("hami/{pod}_side"));
        assert_eq!(
            side.gpus.iter().map(|g| g.limit).collect::<Vec<_>>(),
            [Some(2 << 30); 2]
        );
        assert!(
            side.gpus.iter().all(|g| g.request_limit().is_none()),
            "disable: no share"
        );
        mark_live(&mut cs, |pid, ns, start| {
            (pid, ns, start) == (77, 4026532001, Some(5))
        });
        assert_eq!(
            (cs[0].live, cs[1].live),
            (true, false),
            "live by the recorded init"
        );
        drop(l0);
    }
}
