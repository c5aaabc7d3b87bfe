//! The doctor's checks of the node beside the engines: the vgpu config, NVML and the driver, NVIDIA's
//! runtime and CDI spec, vgpu's own CDI spec, the state root's filesystem, the installed files. Each
//! pushes its lines onto the report; none changes anything. Not here: the engines' entries (`engines`).

use super::host::Host;
use super::report::{Report, Verdict};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use vgpu_host::cdi;
use vgpu_host::config::Config;
use vgpu_host::nvml::{HostGpu, Nvml};
use vgpu_ledger::{format_bytes, layout};

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

/// The vgpu config: it parses and every key is known (the parser refuses unknown keys). The checks that
/// follow use the defaults when it does not load.
pub fn config(h: &Host, r: &mut Report) -> Config {
    let p = &h.config_path;
    match Config::load_from(p, h.config_must_exist) {
        Ok(cfg) => {
            let text = if p.exists() {
                format!("{}: parses, every key known", p.display())
            } else {
                format!("{}: none, every key at its default", p.display())
            };
            r.push(Verdict::Ok, "config", text);
            if let Err(e) = cfg.monitor() {
                r.push(
                    Verdict::Warn,
                    "config",
                    format!("{e} (only `vgpuctl monitor` stops on it)"),
                );
            }
            cfg
        }
        Err(e) => {
            r.push(
                Verdict::Fail,
                "config",
                format!("{e} (the checks below use the defaults)"),
            );
            Config::default()
        }
    }
}

/// NVML loads and lists the GPUs; the driver's version and whether it limits a cgroup's GPU memory.
/// Returns the GPUs when NVML listed them.
pub fn nvml(h: &Host, cfg: &Config, r: &mut Report) -> Option<Vec<HostGpu>> {
    let lib = h.nvml_library.as_deref().unwrap_or(&cfg.nvml_library);
    let nvml = match (h.open_nvml)(lib) {
        Ok(n) => n,
        Err(e) => {
            r.push(
                Verdict::Fail,
                "nvml",
                format!("{e} (config key nvml_library)"),
            );
            return None;
        }
    };
    let gpus = match nvml.devices() {
        Ok(g) => g,
        Err(e) => {
            r.push(Verdict::Fail, "nvml", format!("{lib}: {e}"));
            return None;
        }
    };
    if gpus.is_empty() {
        r.push(Verdict::Warn, "nvml", format!("{lib}: loads, lists no GPU"));
    } else {
        let list: Vec<String> = gpus
            .iter()
            .map(|g| format!("{} {} {}", g.index, g.uuid, format_bytes(g.total_memory)))
            .collect();
        let n = gpus.len();
        let s = if n == 1 { "" } else { "s" };
        r.push(
            Verdict::Ok,
            "nvml",
            format!("{lib}: {n} GPU{s}: {}", list.join(", ")),
        );
    }
    driver(nvml.as_ref(), cfg, r);
    addressing(nvml.as_ref(), &gpus, r);
    Some(gpus)
}

fn driver(nvml: &dyn Nvml, cfg: &Config, r: &mut Report) {
    let version = match nvml.driver_version() {
        Ok(Some(v)) => format!("driver {v}"),
        Ok(None) => "driver version unknown (no nvmlSystemGetDriverVersion)".into(),
        Err(e) => format!("driver version unknown ({e})"),
    };
    match (nvml.has_memory_limits(), cfg.driver_memory_limit) {
        (true, on) => r.push(
            Verdict::Ok,
            "driver",
            format!(
                "{version}; per-cgroup GPU memory limits (r615+): yes{}",
                if on { ", driver_memory_limit on" } else { " (driver_memory_limit = true sets each quota there too)" }
            ),
        ),
        (false, true) => r.push(
            Verdict::Warn,
            "driver",
            format!("{version}; per-cgroup GPU memory limits (r615+): no, so driver_memory_limit = true does nothing here"),
        ),
        (false, false) => r.push(
            Verdict::Ok,
            "driver",
            format!("{version}; per-cgroup GPU memory limits (r615+): no (the interposer's quota only)"),
        ),
    }
}

/// HMM/ATS per GPU: whether the driver lets a CUDA process use plain host memory as GPU memory, which the
/// interposer does not see.
fn addressing(nvml: &dyn Nvml, gpus: &[HostGpu], r: &mut Report) {
    use vgpu_host::nvml::AddressingMode;
    for g in gpus {
        match nvml.addressing_mode(g.index) {
            Ok(Some(AddressingMode::None)) => {
                r.push(Verdict::Ok, "hmm/ats", format!("GPU {}: off", g.index))
            }
            Ok(Some(m)) => r.push(
                Verdict::Warn,
                "hmm/ats",
                format!(
                    "GPU {}: {} on: kernels can reach plain host memory and the driver may move it into \
                     the GPU's memory without a cuMem call, past the quota (turn HMM off with the \
                     nvidia_uvm option uvm_disable_hmm=1; docs/libvgpu.md)",
                    g.index,
                    if m == AddressingMode::Hmm { "HMM" } else { "ATS" }
                ),
            ),
            Ok(None) => r.push(
                Verdict::Info,
                "hmm/ats",
                format!("GPU {}: unknown (the driver does not say)", g.index),
            ),
            Err(e) => r.push(Verdict::Warn, "hmm/ats", format!("GPU {}: {e}", g.index)),
        }
    }
}

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

/// The state root: a folder vgpu can use, and the filesystem it is (or will be) on.
pub fn state_root(cfg: &Config, r: &mut Report) {
    let root = &cfg.state_root;
    let md = std::fs::symlink_metadata(root);
    if let Ok(m) = &md {
        if !m.is_dir() {
            r.push(
                Verdict::Fail,
                "state",
                format!("state_root {} is not a folder", root.display()),
            );
            return;
        }
        let containers = vgpu_host::state_root::StateRoot::new(root.clone()).containers_dir();
        if containers.is_dir()
            && !containers
                .join(vgpu_host::state_root::MARKER_FILE_NAME)
                .exists()
        {
            r.push(
                Verdict::Fail,
                "state",
                format!(
                    "{} is not vgpu's (no {} in it): every create fails; check state_root",
                    containers.display(),
                    vgpu_host::state_root::MARKER_FILE_NAME
                ),
            );
            return;
        }
    }
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let fs = match FsFacts::of(existing) {
        Ok(f) => f,
        Err(e) => {
            r.push(
                Verdict::Fail,
                "state",
                format!("{}: {e}", existing.display()),
            );
            return;
        }
    };
    let made = if md.is_ok() {
        ""
    } else {
        " (made by the first container)"
    };
    let own = fs.mount_point == root.as_path();
    let text = format!(
        "{}{made}: on {} ({}, {}{})",
        root.display(),
        fs.mount_point.display(),
        fs.kind,
        format_bytes(fs.size),
        if own { ", its own" } else { ", shared" },
    );
    if own {
        r.push(Verdict::Ok, "state", text);
    } else {
        r.push(
            Verdict::Warn,
            "state",
            format!(
                "{text}: a tenant growing its ledger takes that filesystem's space; cap it with a tmpfs of its own: \
                 mount -t tmpfs -o size=64m,mode=0711 tmpfs {}",
                root.display()
            ),
        );
    }
}

/// The files the shim and the hook need: the library (and its engine beside it), the hook, the lower
/// runtime.
pub fn installed(h: &Host, cfg: &Config, r: &mut Report) {
    let mut missing = Vec::new();
    if !cfg.library.is_file() {
        missing.push(format!(
            "library {} (config key library)",
            cfg.library.display()
        ));
    } else if !cfg.library.with_file_name(layout::CORE_FILE_NAME).is_file() {
        missing.push(format!("{} beside the library", layout::CORE_FILE_NAME));
    }
    if !is_executable(&cfg.hook_path) {
        missing.push(format!(
            "hook {} (config key hook_path)",
            cfg.hook_path.display()
        ));
    }
    let lower = find_program(&cfg.lower_runtime, &h.program_dirs);
    if lower.is_none() {
        missing.push(format!(
            "lower runtime {:?} (config key lower_runtime)",
            cfg.lower_runtime
        ));
    }
    if !missing.is_empty() {
        r.push(
            Verdict::Fail,
            "files",
            format!("not found: {}", missing.join("; ")),
        );
        return;
    }
    r.push(
        Verdict::Ok,
        "files",
        format!(
            "library {}, hook {}, lower runtime {}",
            cfg.library.display(),
            cfg.hook_path.display(),
            lower.map_or_else(String::new, |p| p.display().to_string())
        ),
    );
}

/// The filesystem a path is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsFacts {
    /// The top of the filesystem above the path (where the device number changes).
    pub mount_point: PathBuf,
    /// `tmpfs`, `ext4`, ... or the magic number.
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
}

impl FsFacts {
    pub fn of(path: &Path) -> Result<FsFacts, String> {
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
        let d = dev(path).map_err(|e| e.to_string())?;
        let mut top = path.to_path_buf();
        while let Some(parent) = top.parent() {
            if dev(parent).ok() != Some(d) {
                break;
            }
            top = parent.to_path_buf();
        }
        let st = nix::sys::statfs::statfs(path).map_err(|e| e.to_string())?;
        Ok(FsFacts {
            mount_point: top,
            kind: fs_name(st.filesystem_type().0 as i64),
            size: st.blocks() * st.block_size() as u64,
        })
    }
}

/// The names of the filesystems a state root is likely on (statfs's magic numbers, linux/magic.h).
pub fn fs_name(magic: i64) -> String {
    match magic {
        0x0102_1994 => "tmpfs".into(),
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlay".into(),
        0x2FC1_2FC1 => "zfs".into(),
        m => format!("filesystem 0x{m:x}"),
    }
}

/// `name` as the runtime finds it: a path as it is, else the first executable of that name in `dirs`.
pub fn find_program(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
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
