//! Reading the node's GPUs from NVML, and the versions as DRA's `version` attributes take them.

use super::*;
use vgpu_host::nvml::Fake;

#[test]
fn each_gpu_comes_with_its_model_and_the_drivers_versions() {
    let nvml = Fake::gpus(2, 16 << 30);
    let gpus = read(&nvml).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[1].gpu.index, 1);
    assert_eq!(gpus[1].model.name.as_deref(), Some("Fake GPU"));
    assert_eq!(gpus[1].model.architecture.as_deref(), Some("Hopper"));
    assert_eq!(gpus[1].model.compute_capability, Some((9, 0)));
    assert_eq!(gpus[0].driver_version.as_deref(), Some("580.65.06"));
    assert_eq!(gpus[0].cuda_driver_version, Some(13000));
    assert_eq!(host_gpus(&gpus), nvml.devices().unwrap());
}

#[test]
fn a_driver_that_cannot_answer_is_an_error() {
    let nvml = Fake {
        fail: Some("GPU is lost (error 15)".into()),
        ..Fake::gpus(1, 16 << 30)
    };
    assert!(read(&nvml).is_err());
}

#[test]
fn versions_as_dra_takes_them() {
    assert_eq!(semver("580.65.06").as_deref(), Some("580.65.6"));
    assert_eq!(semver("535.104.05").as_deref(), Some("535.104.5"));
    assert_eq!(semver("550.54").as_deref(), Some("550.54.0"));
    for bad in [
        "",
        "580",
        "580.65.06.1",
        "580.x.1",
        "580..1",
        "r580.65",
        "-1.2.3",
    ] {
        assert_eq!(semver(bad), None, "{bad}");
    }
    assert_eq!(cuda_semver(13000), "13.0.0");
    assert_eq!(cuda_semver(12080), "12.8.0");
}
