//! HAMi's scheduler series from what admission counts: their labels, HAMi's scale and the sums.

use super::super::tests::{sample, Sample};
use super::super::*;
use vgpu_host::usage::GpuState;

fn gpu(uuid: &str, limit: Option<u64>, share: Option<u32>) -> GpuState {
    GpuState {
        uuid: uuid.into(),
        limit,
        compute_limit: share,
        ..Default::default()
    }
}

fn reading(index: u32, uuid: &str, name: &str) -> GpuReading {
    GpuReading {
        index,
        uuid: uuid.into(),
        name: name.into(),
        total: 80 << 30,
        used: 1 << 30,
        utilization: Some(0.1),
        processes: Some(vec![]),
        process_utilization: None,
        ..Default::default()
    }
}

fn scrape(cs: &[ContainerState], gpus: Option<&[GpuReading]>) -> String {
    render(&Scrape {
        build: BuildInfo::default(),
        node: "gpu-node-7",
        containers: cs,
        gpus,
        truth: &Truth::default(),
        watchdog: &WatchdogView::default(),
        share: &Default::default(),
        state_error: None,
        collection: None,
    })
}

fn samples(text: &str, series: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(sample)
        .filter(|(n, _, _)| n == series)
        .collect()
}

/// Issue 46 item 1: every series HAMi's dashboard reads from HAMi's scheduler, with HAMi's labels
/// (cmd/scheduler/metrics.go) and the sums of what the node's containers commit on each GPU.
#[test]
fn hamis_scheduler_series_sum_the_committed_quotas_and_shares_per_gpu() {
    let cs = [
        ContainerState {
            id: "a".into(),
            gpus: vec![
                gpu("GPU-0", Some(4 << 30), Some(30)),
                gpu("GPU-1", Some(1 << 30), None),
            ],
            ..Default::default()
        },
        ContainerState {
            id: "b".into(),
            gpus: vec![gpu("GPU-0", Some(12 << 30), None)],
            ..Default::default()
        },
        // A share alone commits no memory, as in admission, but it shares the GPU.
        ContainerState {
            id: "c".into(),
            gpus: vec![gpu("GPU-0", None, Some(50))],
            ..Default::default()
        },
    ];
    let gpus = [
        reading(0, "GPU-0", "NVIDIA H100 80GB HBM3"),
        reading(1, "GPU-1", "A100-SXM4-80GB"),
        reading(2, "GPU-2", "NVIDIA H100 80GB HBM3"),
    ];
    let text = scrape(&cs, Some(&gpus));
    let base = ["zone", "node", "device_uuid", "device_index", "device_type"];
    let with_cores = [
        "zone",
        "node",
        "device_uuid",
        "device_index",
        "device_cores",
        "device_type",
    ];
    let overview = [
        "zone",
        "node",
        "device_uuid",
        "device_index",
        "device_cores",
        "device_memory_limit",
        "device_type",
    ];
    let gib = (1u64 << 30) as f64;
    // (series, its label keys, its value on GPU-0, GPU-1, GPU-2)
    let want: &[(&str, &[&str], [f64; 3])] = &[
        ("hami_gpu_memory_limit_bytes", &base, [80.0 * gib; 3]),
        ("hami_gpu_core_limit_ratio", &base, [100.0; 3]),
        (
            "hami_gpu_memory_allocated_bytes",
            &with_cores,
            [16.0 * gib, gib, 0.0],
        ),
        ("hami_gpu_shared_count", &base, [3.0, 1.0, 0.0]),
        ("hami_gpu_core_allocated_ratio", &base, [80.0, 0.0, 0.0]),
        ("hami_node_gpu_overview", &overview, [16.0 * gib, gib, 0.0]),
        (
            "hami_node_gpu_memory_allocated_ratio",
            &base,
            [0.2, 1.0 / 80.0, 0.0],
        ),
    ];
    for (series, keys, values) in want {
        let got = samples(&text, series);
        assert_eq!(got.len(), 3, "{series}: one sample a GPU\n{text}");
        for (i, uuid) in ["GPU-0", "GPU-1", "GPU-2"].iter().enumerate() {
            let (_, labels, value) = got
                .iter()
                .find(|(_, l, _)| l.iter().any(|(k, v)| k == "device_uuid" && v == uuid))
                .unwrap_or_else(|| panic!("{series}: no {uuid}\n{text}"));
            let names: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(&names, keys, "{series}");
            let get = |k: &str| labels.iter().find(|(n, _)| n == k).unwrap().1.as_str();
            assert_eq!((get("zone"), get("node")), ("vGPU", "gpu-node-7"));
            assert_eq!(get("device_index"), i.to_string());
            let v: f64 = value.parse().unwrap();
            assert!(
                (v - values[i]).abs() < 1e-9,
                "{series} {uuid}: {v}, wanted {}",
                values[i]
            );
        }
    }
    // HAMi's device plugin writes NVML's name, `NVIDIA-` before it only when it lacks one.
    let types: Vec<String> = samples(&text, "hami_gpu_shared_count")
        .into_iter()
        .map(|(_, l, _)| l.into_iter().find(|(k, _)| k == "device_type").unwrap().1)
        .collect();
    assert!(
        types.contains(&"NVIDIA H100 80GB HBM3".to_string()),
        "{types:?}"
    );
    assert!(
        types.contains(&"NVIDIA-A100-SXM4-80GB".to_string()),
        "{types:?}"
    );
    let memory_limit = samples(&text, "hami_node_gpu_overview")[0].1.clone();
    assert!(memory_limit.contains(&("device_memory_limit".into(), "81920".into())));
}

/// Without NVML a GPU's memory, index and name are unknown: none of these series is served.
#[test]
fn without_nvml_no_scheduler_series() {
    let cs = [ContainerState {
        id: "a".into(),
        gpus: vec![gpu("GPU-0", Some(1 << 30), Some(10))],
        ..Default::default()
    }];
    let text = scrape(&cs, None);
    assert!(!text.contains("hami_gpu_"), "{text}");
    assert!(!text.contains("hami_node_gpu_"), "{text}");
}
