//! The doctor's checks of the node beside the engines: the vgpu config, NVML and the driver, the state
//! root's filesystem, the installed files. Each pushes its lines onto the report; none changes anything.
//! Not here: NVIDIA's runtime and the CDI specs (`cdi`), the engines' entries (`engines`).

use super::host::Host;
use super::report::{Report, Verdict};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use vgpu_host::config::Config;
use vgpu_host::nvml::{HostGpu, Nvml};
use vgpu_ledger::{format_bytes, layout};

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

/// `p` is a file someone may execute.
pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
