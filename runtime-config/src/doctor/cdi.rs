//! The doctor's checks of the container device specs and the runtime they feed: NVIDIA's runtime and its
//! CDI spec, which give a container its GPU beside vgpu's quota, and vgpu's own CDI spec (`vgpuctl cdi
//! generate`) against the node's GPUs. Each pushes its lines onto the report; none changes anything. Not
//! here: the other checks of the node (`checks`), the engines' entries (`engines`).

use super::checks::{find_program, is_executable};
use super::host::Host;
use super::report::{Report, Verdict};
use std::path::{Path, PathBuf};
use vgpu_host::cdi;
use vgpu_host::config::Config;
use vgpu_host::nvml::HostGpu;

/// NVIDIA's runtime, as its toolkit installs it.
pub const NVIDIA_RUNTIME: &str = "nvidia-container-runtime";
/// Where NVIDIA's installers put the runtime besides `PATH`: the GPU Operator's toolkit folder, then the
/// packages' folders.
pub const NVIDIA_DIRS: &[&str] = &[
    "/usr/local/nvidia/toolkit",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
];
/// Largest CDI spec read (NVIDIA's list every driver file: tens of KiB).
const MAX_SPEC: u64 = 4 << 20;

/// NVIDIA's side: its runtime (`--gpus`, `--runtime=nvidia`, `lower_runtime`) and its CDI spec
/// (`--device nvidia.com/gpu=…`). vgpu gives quotas; the GPU and its driver come from one of these.
pub fn nvidia(h: &Host, cfg: &Config, r: &mut Report) {
    let runtime = find_program(NVIDIA_RUNTIME, &h.program_dirs);
    let specs = specs_of_kind(&h.cdi_dirs, vgpu_host::keys::cdi::NVIDIA_KIND);
    let lower = Path::new(&cfg.lower_runtime)
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(NVIDIA_RUNTIME));
    if lower && find_program(&cfg.lower_runtime, &h.program_dirs).is_none() {
        r.push(
            Verdict::Fail,
            "nvidia",
            format!(
                "lower_runtime = {:?} is not installed: every container with a quota fails at create",
                cfg.lower_runtime
            ),
        );
        return;
    }
    let runtime_text = match &runtime {
        Some(p) => format!("runtime {}", p.display()),
        None => "no runtime (--gpus and --runtime=nvidia need the NVIDIA Container Toolkit)".into(),
    };
    let spec_text = match specs.as_slice() {
        [] => format!(
            "no CDI spec (--device {}=… needs `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)",
            vgpu_host::keys::cdi::NVIDIA_KIND
        ),
        s => format!(
            "CDI spec {}",
            s.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    // NVIDIA's runtime installed but not under the shim: containers whose GPUs it injects (from
    // NVIDIA_VISIBLE_DEVICES, `--gpus`) get none through vgpu.
    if let (Some(p), false) = (&runtime, lower) {
        r.push(
            Verdict::Warn,
            "nvidia",
            format!(
                "runtime {} is installed but not used: lower_runtime = {:?}, so containers whose GPUs NVIDIA's runtime injects get none under vgpu; set lower_runtime = {:?} (vgpuctl runtime configure does), or keep it if their GPUs come from CDI; {spec_text}",
                p.display(),
                cfg.lower_runtime,
                p.display().to_string()
            ),
        );
        return;
    }
    let verdict = if runtime.is_none() && specs.is_empty() {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    r.push(verdict, "nvidia", format!("{runtime_text}; {spec_text}"));
}

/// vgpu's own CDI spec, when there is one: it loads, its hooks' program is there, its devices are NVML's
/// GPUs.
pub fn vgpu_cdi(h: &Host, gpus: Option<&[HostGpu]>, r: &mut Report) {
    let specs = specs_of_kind(&h.cdi_dirs, vgpu_host::keys::cdi::KIND);
    let path = match specs.as_slice() {
        [] => {
            r.push(
                Verdict::Info,
                "cdi",
                format!(
                    "no vgpu CDI spec (`vgpuctl cdi generate` writes one, for --device {}=…)",
                    vgpu_host::keys::cdi::KIND
                ),
            );
            return;
        }
        [one] => one,
        more => {
            let list: Vec<String> = more.iter().map(|p| p.display().to_string()).collect();
            r.push(
                Verdict::Warn,
                "cdi",
                format!(
                    "{} specs of kind {}: {} (keep one)",
                    more.len(),
                    vgpu_host::keys::cdi::KIND,
                    list.join(", ")
                ),
            );
            return;
        }
    };
    let spec = match read_spec(path).and_then(|t| cdi::parse(&t)).and_then(|s| {
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(e) => {
            r.push(Verdict::Fail, "cdi", format!("{}: {e}", path.display()));
            return;
        }
    };
    let again = "run `vgpuctl cdi generate` again";
    if let Some(h) = spec
        .container_edits
        .hooks
        .iter()
        .find(|h| !is_executable(Path::new(&h.path)))
    {
        r.push(
            Verdict::Fail,
            "cdi",
            format!(
                "{}: its {} hook runs {}, which is not there: {again}",
                path.display(),
                h.hook_name,
                h.path
            ),
        );
        return;
    }
    if let Some(gpus) = gpus {
        let mut want: Vec<String> = gpus
            .iter()
            .flat_map(|g| [g.index.to_string(), g.uuid.clone()])
            .chain(["all".to_string()])
            .collect();
        let mut have: Vec<String> = spec.devices.iter().map(|d| d.name.clone()).collect();
        want.sort();
        have.sort();
        if want != have {
            r.push(
                Verdict::Warn,
                "cdi",
                format!(
                    "{}: its devices are not NVML's GPUs now: {again}",
                    path.display()
                ),
            );
            return;
        }
    }
    r.push(
        Verdict::Ok,
        "cdi",
        format!(
            "{}: {} devices, {}",
            path.display(),
            spec.devices.len(),
            spec.device_names().join(", ")
        ),
    );
}

/// The spec files (`.yaml`, `.json`) in `dirs` whose `kind` is `kind`, in the engines' order.
pub fn specs_of_kind(dirs: &[PathBuf], kind: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
            .collect();
        files.sort();
        for f in files {
            let k = read_spec(&f).ok().and_then(|t| {
                serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&t)
                    .ok()?
                    .get("kind")?
                    .as_str()
                    .map(str::to_string)
            });
            if k.as_deref() == Some(kind) {
                out.push(f);
            }
        }
    }
    out
}

fn read_spec(p: &Path) -> Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
    let mut text = String::new();
    f.take(MAX_SPEC)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    Ok(text)
}
