//! The scrape's text: HAMi's and our series with their labels, and label values a tenant chose kept inside
//! their quotes.

use super::*;
use vgpu_host::attribution::TrueProc;
use vgpu_host::usage::GpuState;

#[test]
fn renders_hami_and_vgpu_series_with_labels() {
    let c = ContainerState {
        id: "c1".into(),
        names: Some(vgpu_ledger::KubeNames {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "main".into(),
        }),
        gpus: vec![GpuState {
            index: 0,
            uuid: "GPU-0".into(),
            limit: Some(1 << 30),
            compute_limit: Some(30),
            compute: vgpu_ledger::region::ComputeSnapshot {
                charged_ns: 1_500_000_000,
                held_ns: 250_000_000,
                launches: 42,
                ..Default::default()
            },
            total: 300 << 20,
            slots_sum: 300 << 20,
            by_kind: {
                let mut k = [0; vgpu_ledger::region::KINDS];
                k[Kind::Data.index()] = 300 << 20;
                k
            },
            owners: vec![(1, 1)],
            refusals: 3,
            spilled: 7 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut truth = Truth {
        listed: vec!["GPU-0".into()],
        ..Default::default()
    };
    truth.by_gpu.insert(
        (0, 0),
        vec![
            TrueProc {
                pid: 10,
                start_time: 1,
                used: 300 << 20,
                tracked: true,
            },
            TrueProc {
                pid: 11,
                start_time: 1,
                used: 5 << 20,
                tracked: false,
            },
        ],
    );
    let gpus = vec![GpuReading {
        index: 0,
        uuid: "GPU-0".into(),
        name: "NVIDIA H100".into(),
        total: 16 << 30,
        used: 1 << 30,
        utilization: Some(0.25),
        processes: Some(vec![]),
        process_utilization: Some(vec![(10, 0.5), (11, 0.125), (99, 1.0)]),
        ..Default::default()
    }];
    let wd = WatchdogView {
        events: vec![("over_quota", 2)],
        kills: 1,
        ..Default::default()
    };
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "n1",
        containers: &[c],
        gpus: Some(&gpus),
        truth: &truth,
        watchdog: &wd,
        share: &Default::default(),
        state_error: None,
        collection: Some(Collection {
            age: Duration::from_millis(1500),
            took: Duration::from_millis(20),
        }),
    });
    let l = r#"namespace="ns",pod="p",container="main",container_id="c1",vdevice_index="0",device_uuid="GPU-0""#;
    let h = r#"zone="vGPU",namespace="ns",pod="p",container="main",vdevice_index="0",device_uuid="GPU-0""#;
    let host = r#"zone="vGPU",node="n1",device_index="0",device_uuid="GPU-0",device_type="NVIDIA-NVIDIA H100""#;
    for want in [
        format!("hami_vgpu_memory_used_bytes{{{h}}} 314572800"),
        format!("hami_vgpu_memory_limit_bytes{{{h}}} 1073741824"),
        format!("vgpu_memory_used_bytes{{{l}}} 314572800"),
        format!("vgpu_memory_limit_bytes{{{l}}} 1073741824"),
        format!("vgpu_memory_used_by_kind_bytes{{{l},kind=\"data\"}} 314572800"),
        format!("vgpu_memory_spilled_bytes{{{l}}} 7340032"),
        format!("vgpu_container_gpu_memory_nvml_bytes{{{l}}} 319815680"),
        format!("vgpu_container_gpu_memory_untracked_bytes{{{l}}} 5242880"),
        format!("hami_host_gpu_memory_used_bytes{{{host}}} 1073741824"),
        format!("hami_host_gpu_utilization_ratio{{{host}}} 25.0"),
        r#"vgpu_watchdog_events_total{finding="over_quota"} 2"#.into(),
        "vgpu_nvml_unattributed_processes 0".into(),
        "vgpu_watchdog_kills_total 1".into(),
        "vgpu_nvml_up 1".into(),
        format!("hami_container_device_utilization_ratio{{{h}}} 62.5"),
        format!("vgpu_container_sm_utilization_ratio{{{l}}} 0.625"),
        format!("vgpu_memory_refusals_total{{{l}}} 3"),
        format!("vgpu_compute_limit_ratio{{{l}}} 0.3"),
        format!("vgpu_compute_request_ratio{{{l}}} 0.3"),
        format!("vgpu_compute_charged_seconds_total{{{l}}} 1.5"),
        format!("vgpu_compute_held_seconds_total{{{l}}} 0.25"),
        format!("vgpu_compute_launches_total{{{l}}} 42"),
        "vgpu_monitor_reading_age_seconds 1.5".into(),
        "vgpu_monitor_collection_seconds 0.02".into(),
        "# EOF".into(),
    ] {
        assert!(text.contains(&want), "missing {want}\n{text}");
    }
    assert!(!text.contains("kind=\"vmm\""), "kinds at zero are left out");
}

#[test]
fn a_gpu_with_a_share_alone_has_no_memory_limit_series_and_one_without_no_compute_series() {
    let gpu = |limit, compute_limit| GpuState {
        uuid: "GPU-0".into(),
        limit,
        compute_limit,
        ..Default::default()
    };
    let c = ContainerState {
        id: "c1".into(),
        gpus: vec![
            gpu(None, Some(70)),
            GpuState {
                index: 1,
                ..gpu(Some(1 << 30), None)
            },
        ],
        ..Default::default()
    };
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "n1",
        containers: &[c],
        gpus: None,
        truth: &Truth::default(),
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    });
    let series = |name: &str| text.lines().filter(|l| l.starts_with(name)).count();
    assert_eq!(series("hami_vgpu_memory_limit_bytes{"), 1, "{text}");
    assert_eq!(series("vgpu_compute_limit_ratio{"), 1, "{text}");
    assert!(
        text.contains("vdevice_index=\"0\",device_uuid=\"GPU-0\"} 0.7"),
        "{text}"
    );
    assert_eq!(series("vgpu_compute_launches_total{"), 1, "{text}");
}

// Issue 42: a share's request beside its limit; a request alone has the limit 1 (the whole GPU).
#[test]
fn a_shares_request_and_limit_are_exported() {
    let gpu = |index, request, limit| GpuState {
        index,
        uuid: format!("GPU-{index}"),
        compute_limit: limit,
        compute_request: request,
        ..Default::default()
    };
    let c = ContainerState {
        id: "c1".into(),
        gpus: vec![gpu(0, Some(20), Some(60)), gpu(1, Some(30), None)],
        ..Default::default()
    };
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "n1",
        containers: &[c],
        gpus: None,
        truth: &Truth::default(),
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    });
    let value = |name: &str, gpu: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("device_uuid=\"{gpu}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(
        value("vgpu_compute_request_ratio{", "GPU-0").as_deref(),
        Some("0.2"),
        "{text}"
    );
    assert_eq!(
        value("vgpu_compute_limit_ratio{", "GPU-0").as_deref(),
        Some("0.6"),
        "{text}"
    );
    assert_eq!(
        value("vgpu_compute_request_ratio{", "GPU-1").as_deref(),
        Some("0.3"),
        "{text}"
    );
    assert_eq!(
        value("vgpu_compute_limit_ratio{", "GPU-1").as_deref(),
        Some("1.0"),
        "{text}"
    );
}

// Issue 27: the monitor exports each container's updates, the last one's time and a pending shrink.
#[test]
fn updates_their_time_and_a_pending_shrink_are_exported() {
    let c = ContainerState {
        id: "c1".into(),
        updates: 3,
        updated_at: Some(1_790_000_000),
        gpus: vec![GpuState {
            uuid: "GPU-0".into(),
            limit: Some(1 << 30),
            shrunk_from: Some(2 << 30),
            total: 1536 << 20,
            slots_sum: 1536 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "n1",
        containers: &[c],
        gpus: None,
        truth: &Truth::default(),
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    });
    let l = r#"namespace="",pod="",container="c1",container_id="c1",vdevice_index="0",device_uuid="GPU-0""#;
    for want in [
        format!("vgpu_container_updates_total{{{l}}} 3"),
        format!("vgpu_container_last_update_timestamp_seconds{{{l}}} 1790000000"),
        format!("vgpu_memory_pending_shrink_bytes{{{l}}} 536870912"),
    ] {
        assert!(text.contains(&want), "missing {want}\n{text}");
    }
}

/// The label pairs of one sample line, decoded as OpenMetrics reads them (`\\`, `\"`, `\n`); `None`
/// where the line is not one well-formed sample.
/// A sample's name, its label pairs and its value.
pub(super) type Sample = (String, Vec<(String, String)>, String);

pub(super) fn sample(line: &str) -> Option<Sample> {
    let (name, rest) = line.split_once('{')?;
    let mut labels = vec![];
    let mut chars = rest.chars();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => value.push(match chars.next()? {
                    'n' => '\n',
                    c @ ('\\' | '"') => c,
                    _ => return None,
                }),
                '"' => break,
                '\n' => return None,
                c => value.push(c),
            }
        }
        labels.push((key, value));
        match chars.next()? {
            ',' => continue,
            '}' => break,
            _ => return None,
        }
    }
    let value: String = chars.collect();
    let value = value.strip_prefix(' ')?;
    value.parse::<f64>().ok()?;
    Some((name.to_string(), labels, value.to_string()))
}

/// A tenant's names carrying quotes, a backslash, newlines and a forged `# EOF` stay inside their
/// label values: every line is a comment or one well-formed sample, the text ends at its one `# EOF`,
/// and each value reads back as written.
#[test]
fn hostile_names_stay_inside_their_label_values() {
    let pod = "p\"} 0\n# EOF\nhami_vgpu_memory_used_bytes{pod=\"victim\"} 1e18\n";
    let namespace = "ns\\\"";
    let container = "c\r\x1b[2Jx";
    let c = ContainerState {
        id: "c1".into(),
        names: Some(vgpu_ledger::KubeNames {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
        }),
        gpus: vec![GpuState {
            uuid: "GPU-0".into(),
            limit: Some(1 << 30),
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "n1",
        containers: &[c],
        gpus: None,
        truth: &Truth::default(),
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    assert_eq!(lines.iter().filter(|l| **l == "# EOF").count(), 1, "{text}");
    let mut limits = 0;
    for l in &lines[..lines.len() - 1] {
        if l.starts_with("# HELP ") || l.starts_with("# TYPE ") || !l.contains('{') {
            continue;
        }
        let (name, labels, value) = sample(l).unwrap_or_else(|| panic!("not a sample: {l:?}"));
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if name == "vgpu_build_info" {
            continue;
        }
        assert_eq!(get("pod"), Some(pod), "{l}");
        assert_eq!(get("namespace"), Some(namespace), "{l}");
        assert_eq!(get("container"), Some(container), "{l}");
        if name == "hami_vgpu_memory_limit_bytes" {
            limits += 1;
            assert_eq!(value, "1073741824");
        }
    }
    assert_eq!(limits, 1, "{text}");
}

/// Issue 26 item 2: every `hami_*` series carries exactly the labels HAMi's vGPU monitor gives it
/// (cmd/vGPUmonitor/metrics.go, registered under `zone="vGPU"`) and HAMi's scale (utilisation 0-100);
/// two containers that HAMi's labels cannot tell apart make one series, the live one's.
#[test]
fn hami_series_carry_hamis_labels_and_scale() {
    let ctr = &[
        "zone",
        "namespace",
        "pod",
        "container",
        "vdevice_index",
        "device_uuid",
    ][..];
    let host = &["zone", "node", "device_index", "device_uuid", "device_type"][..];
    let hami: &[(&str, &[&str])] = &[
        ("hami_vgpu_memory_used_bytes", ctr),
        ("hami_vgpu_memory_limit_bytes", ctr),
        ("hami_container_device_utilization_ratio", ctr),
        ("hami_host_gpu_memory_used_bytes", host),
        ("hami_host_gpu_utilization_ratio", host),
    ];
    let names = |pod: &str| {
        Some(vgpu_ledger::KubeNames {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
        })
    };
    let gpu = |owners: Vec<(u32, u64)>, total| GpuState {
        uuid: "GPU-0".into(),
        limit: Some(1 << 30),
        total,
        owners,
        ..Default::default()
    };
    // "old" exited (no live slot) beside its restart "new", which holds a slot: one HAMi series, new's.
    let cs = [
        ContainerState {
            id: "old".into(),
            names: names("p"),
            gpus: vec![gpu(vec![], 5 << 20)],
            ..Default::default()
        },
        ContainerState {
            id: "new".into(),
            names: names("p"),
            gpus: vec![gpu(vec![(1, 1)], 3 << 20)],
            ..Default::default()
        },
    ];
    let mut truth = Truth {
        listed: vec!["GPU-0".into()],
        ..Default::default()
    };
    truth.by_gpu.insert(
        (1, 0),
        vec![TrueProc {
            pid: 10,
            start_time: 1,
            used: 3 << 20,
            tracked: true,
        }],
    );
    let gpus = vec![GpuReading {
        index: 3,
        uuid: "GPU-0".into(),
        name: "A100-SXM4-40GB".into(),
        total: 40 << 30,
        used: 1 << 30,
        utilization: Some(0.37),
        processes: Some(vec![]),
        process_utilization: Some(vec![(10, 0.5)]),
        ..Default::default()
    }];
    let text = render(&Scrape {
        build: BuildInfo::default(),
        node: "gpu-node-7",
        containers: &cs,
        gpus: Some(&gpus),
        truth: &truth,
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    });
    for (series, want) in hami {
        let lines: Vec<Sample> = text
            .lines()
            .filter_map(sample)
            .filter(|(n, _, _)| n == series)
            .collect();
        assert_eq!(lines.len(), 1, "{series}\n{text}");
        let (_, labels, value) = &lines[0];
        let keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(&keys, want, "{series}");
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).unwrap().1.as_str();
        assert_eq!(get("zone"), "vGPU");
        let v: f64 = value.parse().unwrap();
        let want_value = match *series {
            "hami_vgpu_memory_used_bytes" => Some(3145728.0), // the live container's
            "hami_container_device_utilization_ratio" => Some(50.0), // 0-100
            "hami_host_gpu_utilization_ratio" => Some(37.0),  // 0-100
            _ => None,
        };
        if let Some(w) = want_value {
            assert!((v - w).abs() < 1e-9, "{series}: {v}, wanted {w}");
        }
        if want == &host {
            assert_eq!(get("node"), "gpu-node-7");
            assert_eq!(get("device_type"), "NVIDIA-A100-SXM4-40GB");
            assert_eq!(get("device_index"), "3");
        }
    }
    // Our own series keep both containers apart.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("vgpu_memory_used_bytes{"))
            .count(),
        2,
        "{text}"
    );
}

// Issue 26 item 6: outside Kubernetes, a Docker container's `container` label is its Docker name (was its
// id); Kubernetes' names win; with neither, the id.
#[test]
fn outside_kubernetes_the_container_label_is_dockers_name() {
    let gpu = GpuState {
        uuid: "GPU-0".into(),
        ..Default::default()
    };
    let label = |c: &ContainerState| {
        container_labels(c, 0)
            .into_iter()
            .find(|(k, _)| *k == "container")
            .map(|(_, v)| v.0)
            .unwrap()
    };
    let docker = ContainerState {
        id: "3f2a".into(),
        docker_name: Some("web".into()),
        gpus: vec![gpu.clone()],
        ..Default::default()
    };
    assert_eq!(label(&docker), "web");
    let bare = ContainerState {
        docker_name: None,
        ..docker.clone()
    };
    assert_eq!(label(&bare), "3f2a");
    let kube = ContainerState {
        names: Some(vgpu_ledger::KubeNames {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "main".into(),
        }),
        ..docker
    };
    assert_eq!(label(&kube), "main");
}

/// Each GPU's unattributed memory with the host GPUs' labels, the figures it is made of (the reserve only
/// where NVML told it), and the likely holder with its container's labels.
#[test]
fn unattributed_memory_per_gpu_and_its_likely_holder() {
    use crate::unattributed::{remainders, Settings};
    let c = ContainerState {
        id: "c1".into(),
        live: true,
        gpus: vec![GpuState {
            uuid: "GPU-0".into(),
            limit: Some(2 << 30),
            total: 768 << 20,
            slots_sum: 768 << 20,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut truth = Truth {
        listed: vec!["GPU-0".into(), "GPU-1".into()],
        ..Default::default()
    };
    truth.by_gpu.insert(
        (0, 0),
        vec![TrueProc {
            pid: 10,
            start_time: 1,
            used: 256 << 20,
            tracked: true,
        }],
    );
    let gpus = vec![
        GpuReading {
            index: 0,
            uuid: "GPU-0".into(),
            name: "H".into(),
            used: 868 << 20,
            reserved: Some(100 << 20),
            processes: Some(vec![(10, 256 << 20)]),
            ..Default::default()
        },
        GpuReading {
            index: 1,
            uuid: "GPU-1".into(),
            name: "H".into(),
            used: 0,
            processes: Some(vec![]),
            ..Default::default()
        },
    ];
    let cs = [c];
    let rs = remainders(&cs, &gpus, &truth, Settings::default());
    let mut reg = Registry::default();
    unattributed::register("n1", &gpus, &cs, &rs, &mut reg);
    let mut text = String::new();
    encode(&mut text, &reg).unwrap();
    let host = |i: u32| {
        format!(
            r#"zone="vGPU",node="n1",device_index="{i}",device_uuid="GPU-{i}",device_type="NVIDIA-H""#
        )
    };
    for want in [
        format!(
            "vgpu_host_gpu_memory_unattributed_bytes{{{}}} {}",
            host(0),
            512u64 << 20
        ),
        format!(
            "vgpu_host_gpu_memory_processes_bytes{{{}}} {}",
            host(0),
            256u64 << 20
        ),
        format!(
            "vgpu_host_gpu_memory_reserved_bytes{{{}}} {}",
            host(0),
            100u64 << 20
        ),
        format!("vgpu_host_gpu_memory_unattributed_bytes{{{}}} 0", host(1)),
        format!(
            r#"vgpu_container_gpu_memory_unattributed_likely_bytes{{namespace="",pod="",container="c1",container_id="c1",vdevice_index="0",device_uuid="GPU-0"}} {}"#,
            512u64 << 20
        ),
    ] {
        assert!(text.lines().any(|l| l == want), "{want}\n{text}");
    }
    assert!(
        !text.contains(&format!(
            "vgpu_host_gpu_memory_reserved_bytes{{{}}}",
            host(1)
        )),
        "no reserve where NVML could not tell: {text}"
    );
}
