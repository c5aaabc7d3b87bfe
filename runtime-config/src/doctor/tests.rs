//! The doctor's checks on a fake NVML and temporary folders (`Scene`), each line and the exit status.

use super::checks::{self, fs_name, FsFacts};
use super::*;
use crate::engines::files::MemFiles;
use crate::engines::registry::find;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use vgpu_host::nvml::Fake;
use vgpu_host::nvml::{Nvml, NvmlError};

/// A host of temporary folders: a config, program and CDI folders, and NVML answering `fake`.
struct Scene {
    dir: tempfile::TempDir,
    files: MemFiles,
    /// Makes the NVML each run opens (`None`: it does not load).
    fake: std::sync::Mutex<MakeFake>,
}

type MakeFake = Box<dyn Fn() -> Option<Fake> + Send>;

fn fake(f: impl Fn() -> Option<Fake> + Send + 'static) -> MakeFake {
    Box::new(f)
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        for d in ["bin", "cdi", "lib", "state"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        Scene {
            dir,
            files: MemFiles::default(),
            fake: std::sync::Mutex::new(fake(|| Some(Fake::gpus(2, 16 << 30)))),
        }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.p(rel);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn program(&self, name: &str) -> PathBuf {
        let p = self.write(&format!("bin/{name}"), "#!/bin/sh\n");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }
    /// A config whose files are all in the scene: library, its engine, hook, lower runtime.
    fn installed(&self, extra: &str) -> PathBuf {
        self.write("lib/libvgpu.so", "");
        self.write("lib/libvgpu_core.so", "");
        let hook = self.program("vgpu-hook");
        self.program("runc");
        self.write(
            "config.toml",
            &format!(
                "library = {:?}\nhook_path = {:?}\nstate_root = {:?}\nnvml_library = \"fake\"\n{extra}",
                self.p("lib/libvgpu.so"),
                hook,
                self.p("state")
            ),
        )
    }
    fn run_with(&self, engines: &[(&str, &[&str])]) -> Report {
        let open = |_: &str| -> Result<Box<dyn Nvml>, NvmlError> {
            match (self.fake.lock().unwrap())() {
                Some(f) => Ok(Box::new(f)),
                None => Err(NvmlError::Load {
                    lib: "fake".into(),
                    error: "dlopen failed".into(),
                }),
            }
        };
        let engines = engines
            .iter()
            .map(|(name, args)| {
                let e = find(name).unwrap();
                let cmd = e
                    .args(false)
                    .into_iter()
                    .fold(clap::Command::new("doctor"), |c, a| c.arg(a));
                let m = cmd
                    .try_get_matches_from(std::iter::once("doctor").chain(args.iter().copied()))
                    .unwrap();
                (e, m)
            })
            .collect();
        let host = Host {
            config_path: self.p("config.toml"),
            config_must_exist: true,
            open_nvml: &open,
            nvml_library: None,
            engines,
            files: &self.files,
            record: self.p("engines.json"),
            program_dirs: vec![self.p("bin")],
            cdi_dirs: vec![self.p("cdi")],
        };
        run(&host)
    }
    fn run(&self) -> Report {
        self.run_with(&[])
    }
}

fn only<'a>(r: &'a Report, check: &str) -> &'a Line {
    let l = r.of(check);
    assert_eq!(l.len(), 1, "{check}: {:?}", r.lines);
    l[0]
}

#[test]
fn exit_status_is_the_worst_line() {
    let mut r = Report::default();
    assert_eq!(r.exit_status(), 0);
    r.push(Verdict::Info, "a", "x");
    r.push(Verdict::Ok, "a", "x");
    assert_eq!(r.exit_status(), 0);
    r.push(Verdict::Warn, "a", "x");
    assert_eq!(r.exit_status(), report::EXIT_WARN);
    r.push(Verdict::Fail, "a", "x");
    assert_eq!(r.exit_status(), report::EXIT_FAIL);
}

#[test]
fn one_line_per_check_whatever_the_error_text() {
    let mut r = Report::default();
    r.push(Verdict::Fail, "config", "two\n  lines");
    r.push(Verdict::Ok, "nvml", "fine");
    let mut out = Vec::new();
    r.print(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text,
        "FAIL  config    two lines\nok    nvml      fine\nvgpuctl doctor: 1 failed, 0 warnings\n"
    );
}

#[test]
fn a_good_node_is_all_ok() {
    let s = Scene::new();
    s.installed("lower_runtime = \"nvidia-container-runtime\"\n");
    s.program("nvidia-container-runtime");
    let r = s.run();
    let state = only(&r, "state");
    // A temporary folder is not a filesystem of its own: the one warning.
    assert_eq!(state.verdict, Verdict::Warn, "{state:?}");
    assert!(
        r.lines
            .iter()
            .filter(|l| l.check != "state")
            .all(|l| l.verdict <= Verdict::Ok),
        "{:?}",
        r.lines
    );
    assert!(only(&r, "config").text.ends_with("parses, every key known"));
    assert!(only(&r, "nvml")
        .text
        .contains("2 GPUs: 0 GPU-fa4ec0de-0000-4000-8000-000000000000 16.0 GiB, 1 GPU-"));
    assert!(only(&r, "driver")
        .text
        .starts_with("driver 580.65.06; per-cgroup GPU memory limits (r615+): no"));
    assert_eq!(only(&r, "cdi").verdict, Verdict::Info);
    assert_eq!(only(&r, "files").verdict, Verdict::Ok);
}

#[test]
fn an_unknown_config_key_fails_naming_it_and_the_rest_still_runs() {
    let s = Scene::new();
    s.installed("lower_runtim = \"crun\"\n");
    let r = s.run();
    let l = only(&r, "config");
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(
        l.text
            .contains("config.toml:5:1: unknown field `lower_runtim`"),
        "{}",
        l.text
    );
    assert_eq!(r.exit_status(), 1);
    assert_eq!(only(&r, "nvml").verdict, Verdict::Ok);
    // A named file that is not there fails too; the default file may be absent.
    let s = Scene::new();
    assert_eq!(only(&s.run(), "config").verdict, Verdict::Fail);
}

#[test]
fn a_bad_monitor_table_is_a_warning() {
    let s = Scene::new();
    s.installed("[monitor]\ninterval_seconds = 0\n");
    let r = s.run();
    let l = r.of("config");
    assert_eq!(l.len(), 2, "{l:?}");
    assert_eq!(l[1].verdict, Verdict::Warn);
    assert!(l[1].text.contains("only `vgpuctl monitor` stops on it"));
}

#[test]
fn nvml_failing_or_empty() {
    let s = Scene::new();
    s.installed("");
    *s.fake.lock().unwrap() = fake(|| None);
    let r = s.run();
    let l = only(&r, "nvml");
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(
        l.text.contains("cannot load NVML (fake): dlopen failed"),
        "{}",
        l.text
    );
    assert!(r.of("driver").is_empty());

    let s = Scene::new();
    s.installed("");
    *s.fake.lock().unwrap() = fake(|| {
        Some(Fake {
            fail: Some("Unknown Error".into()),
            ..Fake::gpus(1, 1 << 30)
        })
    });
    assert_eq!(only(&s.run(), "nvml").verdict, Verdict::Fail);

    let s = Scene::new();
    s.installed("");
    *s.fake.lock().unwrap() = fake(|| Some(Fake::default()));
    assert_eq!(only(&s.run(), "nvml").verdict, Verdict::Warn);
}

#[test]
fn the_drivers_per_cgroup_limits() {
    let with = |limits: bool, extra: &str| {
        let s = Scene::new();
        s.installed(extra);
        *s.fake.lock().unwrap() = fake(move || {
            Some(Fake {
                memory_limits: limits,
                ..Fake::gpus(1, 1 << 30)
            })
        });
        only(&s.run(), "driver").clone()
    };
    let l = with(true, "");
    assert_eq!(l.verdict, Verdict::Ok);
    assert!(l.text.contains("(r615+): yes"), "{}", l.text);
    assert!(with(true, "driver_memory_limit = true\n")
        .text
        .contains("driver_memory_limit on"));
    assert_eq!(with(false, "").verdict, Verdict::Ok);
    let l = with(false, "driver_memory_limit = true\n");
    assert_eq!(l.verdict, Verdict::Warn);
    assert!(l
        .text
        .contains("driver_memory_limit = true does nothing here"));
}

#[test]
fn engines_by_their_own_ownership() {
    let mut s = Scene::new();
    s.installed("");
    let cfg = s.p("daemon.json");
    let c = cfg.to_str().unwrap();
    let run = |s: &Scene| only(&s.run_with(&[("docker", &["--config", c])]), "engine").clone();
    s.files = MemFiles::with(&[(
        c,
        r#"{"runtimes": {"vgpu": {"path": "/usr/bin/vgpu-container-runtime"}}}"#,
    )]);
    let l = run(&s);
    assert_eq!(
        (l.verdict, l.text.as_str()),
        (Verdict::Ok, &*format!("docker: vgpu's entry in {c}"))
    );
    s.files = MemFiles::with(&[(
        c,
        r#"{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}"#,
    )]);
    let l = run(&s);
    assert_eq!(l.verdict, Verdict::Warn);
    assert_eq!(
        l.text,
        format!("docker: no vgpu entry in {c} (vgpuctl runtime configure --runtime=docker)")
    );
    s.files = MemFiles::with(&[(
        c,
        r#"{"runtimes": {"vgpu": {"path": "/usr/bin/kata-runtime"}}}"#,
    )]);
    let l = run(&s);
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(l.text.contains("not vgpu's"), "{}", l.text);
    s.files = MemFiles::with(&[(c, "{ not json")]);
    assert_eq!(run(&s).verdict, Verdict::Fail);
    // At its default files, an engine whose files and program are not there is not installed.
    s.files = MemFiles::default();
    let r = s.run_with(&[("crio", &[])]);
    assert_eq!(only(&r, "engine").verdict, Verdict::Info);
    assert_eq!(only(&r, "engine").text, "crio: not installed");
    // Podman's hooks in the administrator's folder count (the vendor's is the default).
    let hook = |stage: &str| {
        format!(
            r#"{{"version": "1.0.0", "hook": {{"path": "/usr/bin/vgpu-hook", "args": ["vgpu-hook", "{stage}"]}}, "when": {{"annotations": {{"^vgpu\\.io/": ".*"}}}}, "stages": ["{stage}"]}}"#
        )
    };
    s.files = MemFiles::with(&[
        (
            "/etc/containers/oci/hooks.d/vgpu-createruntime.json",
            &hook("createRuntime"),
        ),
        (
            "/etc/containers/oci/hooks.d/vgpu-poststop.json",
            &hook("poststop"),
        ),
    ]);
    let l = only(&s.run_with(&[("podman", &[])]), "engine").clone();
    assert_eq!(l.verdict, Verdict::Ok, "{l:?}");
    assert_eq!(
        l.text,
        "podman: vgpu's entry in /etc/containers/oci/hooks.d"
    );
    s.files = MemFiles::default();
    // Podman with vgpu's CDI spec needs no hooks.
    s.program("podman");
    assert_eq!(
        only(&s.run_with(&[("podman", &[])]), "engine").verdict,
        Verdict::Warn
    );
    vgpu_spec(&s, &Fake::gpus(2, 16 << 30));
    let l = only(&s.run_with(&[("podman", &[])]), "engine").clone();
    assert_eq!(l.verdict, Verdict::Ok);
    assert!(
        l.text
            .contains("vgpu's CDI spec serves --device vgpu.io/gpu="),
        "{}",
        l.text
    );
}

/// vgpu's spec of `gpus`, its hooks running the scene's vgpu-hook.
fn vgpu_spec(s: &Scene, gpus: &Fake) -> PathBuf {
    let g = gpus.devices().unwrap();
    let hook = s.p("bin/vgpu-hook");
    let spec = vgpu_host::cdi::build(&vgpu_host::cdi::Inputs {
        gpus: &g,
        hook_path: &hook,
        hook_stage: "createRuntime",
        hook_env: vec![],
    })
    .unwrap();
    let p = s.p("cdi/vgpu.yaml");
    vgpu_host::cdi::write(
        &p,
        &vgpu_host::cdi::render(&spec, vgpu_host::cdi::Format::Yaml).unwrap(),
    )
    .unwrap();
    p
}

#[test]
fn vgpus_cdi_spec_loads_runs_a_hook_that_is_there_and_has_nvmls_gpus() {
    let s = Scene::new();
    s.installed("");
    vgpu_spec(&s, &Fake::gpus(2, 16 << 30));
    let l = only(&s.run(), "cdi").clone();
    assert_eq!(l.verdict, Verdict::Ok, "{l:?}");
    assert!(
        l.text
            .contains("5 devices, vgpu.io/gpu=0, vgpu.io/gpu=GPU-"),
        "{}",
        l.text
    );
    // Written for one GPU, the node now has two.
    vgpu_spec(&s, &Fake::gpus(1, 16 << 30));
    let l = only(&s.run(), "cdi").clone();
    assert_eq!(l.verdict, Verdict::Warn);
    assert!(l
        .text
        .ends_with("its devices are not NVML's GPUs now: run `vgpuctl cdi generate` again"));
    // Its hook gone.
    std::fs::remove_file(s.p("bin/vgpu-hook")).unwrap();
    let l = only(&s.run(), "cdi").clone();
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(l.text.contains("its createRuntime hook runs"), "{}", l.text);
    // A spec of its kind an engine would refuse.
    s.write(
        "cdi/vgpu.yaml",
        "cdiVersion: 9.9.9\nkind: vgpu.io/gpu\ndevices: []\n",
    );
    let l = only(&s.run(), "cdi").clone();
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(l.text.contains("CDI spec version \"9.9.9\""), "{}", l.text);
    // Two of them.
    s.write("cdi/other.json", r#"{"kind": "vgpu.io/gpu"}"#);
    assert_eq!(only(&s.run(), "cdi").verdict, Verdict::Warn);
}

#[test]
fn nvidias_runtime_or_cdi_spec() {
    let s = Scene::new();
    s.installed("");
    let l = only(&s.run(), "nvidia").clone();
    assert_eq!(l.verdict, Verdict::Warn);
    assert!(
        l.text.contains("no runtime") && l.text.contains("nvidia-ctk cdi generate"),
        "{}",
        l.text
    );
    s.write(
        "cdi/nvidia.yaml",
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n",
    );
    let l = only(&s.run(), "nvidia").clone();
    assert_eq!(l.verdict, Verdict::Ok);
    assert!(
        l.text.contains("CDI spec") && l.text.contains("nvidia.yaml"),
        "{}",
        l.text
    );
    // lower_runtime names NVIDIA's runtime, which is not installed: every create would fail.
    s.installed("lower_runtime = \"nvidia-container-runtime\"\n");
    let r = s.run();
    assert_eq!(only(&r, "nvidia").verdict, Verdict::Fail);
    assert_eq!(only(&r, "files").verdict, Verdict::Fail);
    s.program("nvidia-container-runtime");
    let r = s.run();
    assert_eq!(only(&r, "nvidia").verdict, Verdict::Ok);
    assert!(only(&r, "nvidia").text.starts_with("runtime "));
    assert_eq!(only(&r, "files").verdict, Verdict::Ok);
    // Issue 46: NVIDIA's runtime installed, lower_runtime still runc: a warning naming both.
    s.installed("");
    let l = only(&s.run(), "nvidia").clone();
    assert_eq!(l.verdict, Verdict::Warn);
    assert!(
        l.text.contains(
            "nvidia-container-runtime is installed but not used: lower_runtime = \"runc\""
        ),
        "{}",
        l.text
    );
}

#[test]
fn the_state_root() {
    let s = Scene::new();
    s.installed("");
    // Made by the first container, on a filesystem shared with its parent.
    std::fs::remove_dir(s.p("state")).unwrap();
    let l = only(&s.run(), "state").clone();
    assert_eq!(l.verdict, Verdict::Warn);
    assert!(
        l.text.contains("(made by the first container): on "),
        "{}",
        l.text
    );
    assert!(
        l.text.contains("shared): a tenant growing its ledger"),
        "{}",
        l.text
    );
    // Not a folder.
    s.write("state", "");
    assert_eq!(only(&s.run(), "state").verdict, Verdict::Fail);
    // Someone else's containers/ folder: every create would fail.
    std::fs::remove_file(s.p("state")).unwrap();
    std::fs::create_dir_all(s.p("state/containers")).unwrap();
    let l = only(&s.run(), "state").clone();
    assert_eq!(l.verdict, Verdict::Fail);
    assert!(l.text.contains("is not vgpu's"), "{}", l.text);
    std::fs::write(s.p("state/containers/.vgpu-state"), "").unwrap();
    assert_eq!(only(&s.run(), "state").verdict, Verdict::Warn);
}

#[test]
fn the_filesystem_facts() {
    let d = tempfile::tempdir().unwrap();
    let f = FsFacts::of(d.path()).unwrap();
    assert!(d.path().starts_with(&f.mount_point));
    assert!(f.size > 0);
    // `/` is its own mount point.
    assert_eq!(
        FsFacts::of(Path::new("/")).unwrap().mount_point,
        Path::new("/")
    );
    assert_eq!(fs_name(0x0102_1994), "tmpfs");
    assert_eq!(fs_name(0xEF53), "ext4");
    assert_eq!(fs_name(0x1234), "filesystem 0x1234");
}

#[test]
fn missing_files_fail_naming_the_config_key() {
    let s = Scene::new();
    s.installed("");
    std::fs::remove_file(s.p("lib/libvgpu_core.so")).unwrap();
    std::fs::remove_file(s.p("bin/runc")).unwrap();
    let l = only(&s.run(), "files").clone();
    assert_eq!(l.verdict, Verdict::Fail);
    assert_eq!(
        l.text,
        "not found: libvgpu_core.so beside the library; lower runtime \"runc\" (config key lower_runtime)"
    );
    assert!(checks::find_program("runc", &[s.p("bin")]).is_none());
}

#[test]
fn hmm_or_ats_on_a_gpu_is_a_warning_naming_the_node_setting() {
    use vgpu_host::nvml::AddressingMode;
    let s = Scene::new();
    s.installed("");
    let r = s.run();
    assert!(
        r.of("hmm/ats").iter().all(|l| l.verdict == Verdict::Info),
        "a driver that does not say"
    );
    for (mode, verdict, text) in [
        (AddressingMode::None, Verdict::Ok, "GPU 1: off"),
        (AddressingMode::Hmm, Verdict::Warn, "GPU 1: HMM on"),
        (AddressingMode::Ats, Verdict::Warn, "GPU 1: ATS on"),
    ] {
        *s.fake.lock().unwrap() = fake(move || {
            let mut f = Fake::gpus(2, 16 << 30);
            f.addressing = Some(mode);
            Some(f)
        });
        let r = s.run();
        let l = r.of("hmm/ats");
        assert_eq!(l.len(), 2, "one line per GPU: {l:?}");
        assert_eq!(l[1].verdict, verdict);
        assert!(l[1].text.starts_with(text), "{}", l[1].text);
        if verdict == Verdict::Warn {
            assert!(l[1].text.contains("uvm_disable_hmm=1"));
        }
    }
}

/// doctor's own refusals, before it looks at the node: an engine's option without `--runtime`, and
/// another engine's option with it.
#[test]
fn options_that_name_no_engine_or_another_are_refused() {
    use crate::engines::error::EngineError;
    use clap::{Args, FromArgMatches};
    let run = |args: &[&str]| {
        let m = cli::DoctorArgs::augment_args(clap::Command::new("doctor"))
            .try_get_matches_from(std::iter::once("doctor").chain(args.iter().copied()))
            .unwrap();
        cli::DoctorArgs::from_arg_matches(&m).unwrap().run()
    };
    let e = run(&["--config", "/x.json"]).unwrap_err();
    assert!(
        matches!(&e, cli::DoctorError::NeedsRuntime(o) if o == "--config"),
        "{e}"
    );
    let e = run(&["--runtime", "docker", "--drop-in", "/x.toml"]).unwrap_err();
    assert!(
        matches!(&e, cli::DoctorError::Engine(EngineError::OtherEnginesOption { long, .. }) if long == "drop-in"),
        "{e}"
    );
}
