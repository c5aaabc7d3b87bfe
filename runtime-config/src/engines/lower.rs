//! NVIDIA's runtime as the shim's lower runtime. On a node where NVIDIA's runtime
//! (`nvidia-container-runtime`: the Container Toolkit's, or the GPU Operator's under
//! `/usr/local/nvidia/toolkit`) is installed, containers get their GPUs from it (env-based injection,
//! `--gpus`): under vgpu's shim it must still run, as the shim's `lower_runtime`, or a pod gets no GPU.
//! `runtime configure` of an engine the shim serves (Docker, containerd, CRI-O) therefore writes the
//! absolute path of the one it finds as `lower_runtime` into vgpu's config (every other key and comment
//! kept), unless `--no-nvidia-lower-runtime` or the operator chose another lower runtime. A bare name is
//! not enough: the shim looks it up on its own `PATH`, which the GPU Operator's folder is not on.
//! Not here: writing the file (`change::apply`), the doctor's warning (`doctor::cdi::nvidia`).

use super::change::Change;
use super::files::Files;
use std::path::{Path, PathBuf};

/// NVIDIA's runtime's file name.
pub const NVIDIA_RUNTIME: &str = "nvidia-container-runtime";

/// Where NVIDIA's runtime is looked for, before the `PATH`'s folders: the toolkit's packages, and the GPU
/// Operator's toolkit folder on the host.
pub const NVIDIA_DIRS: [&str; 4] = [
    "/usr/bin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/local/nvidia/toolkit",
];

/// The folders to look in: [`NVIDIA_DIRS`], then `path`'s (a `PATH` value).
pub fn search_dirs(path: Option<&str>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = NVIDIA_DIRS.iter().map(PathBuf::from).collect();
    for d in path
        .unwrap_or_default()
        .split(':')
        .filter(|d| d.starts_with('/'))
    {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(d.into());
        }
    }
    dirs
}

/// The first executable `nvidia-container-runtime` in `dirs`.
pub fn find_nvidia(files: &dyn Files, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| d.join(NVIDIA_RUNTIME))
        .find(|p| files.is_executable(p))
}

/// Whether a `lower_runtime` value is one configure may replace by NVIDIA's path: unset, `runc` (the
/// default), or NVIDIA's runtime by its bare name (the operator asked for NVIDIA's; the shim would look
/// it up on its own `PATH`). A path is the operator's choice.
fn replaceable(current: Option<&str>) -> bool {
    matches!(current, None | Some("runc") | Some(NVIDIA_RUNTIME))
}

/// What to do with vgpu's config (`text`: the file, `None` when there is none) given NVIDIA's runtime at
/// `nvidia`: the new text (`lower_runtime` set to its path, everything else as it was), or `None` when it
/// says so already or names a lower runtime of the operator's. A file that does not parse is left alone
/// (`vgpuctl doctor` and the shim name its error).
pub fn with_lower_runtime(text: Option<&str>, nvidia: &Path) -> Option<String> {
    let mut doc: toml_edit::DocumentMut = text.unwrap_or_default().parse().ok()?;
    let current = doc.get("lower_runtime").and_then(|v| v.as_str());
    let want = nvidia.to_str()?;
    if current == Some(want) || !replaceable(current) {
        return None;
    }
    match doc.get_mut("lower_runtime").and_then(|i| i.as_value_mut()) {
        // Keep the comment after the old value.
        Some(v) => {
            let decor = v.decor().clone();
            *v = toml_edit::Value::from(want);
            *v.decor_mut() = decor;
        }
        None => {
            let mut item = toml_edit::value(want);
            if let Some(v) = item.as_value_mut() {
                v.decor_mut().set_suffix(
                    " # vgpuctl runtime configure: NVIDIA's runtime, so its GPU injection still happens under vgpu",
                );
            }
            // Top-level keys go before the tables.
            doc.insert("lower_runtime", item);
        }
    }
    Some(doc.to_string())
}

/// The change to vgpu's config at `config` that makes NVIDIA's runtime found in `dirs`
/// the lower runtime, and the line that says so; none when there is no NVIDIA runtime or nothing to change.
pub fn change(files: &dyn Files, config: &Path, dirs: &[PathBuf]) -> Option<(Change, String)> {
    let nvidia = find_nvidia(files, dirs)?;
    let text = files.read(config).ok()?;
    let new = with_lower_runtime(text.as_deref(), &nvidia)?;
    let what = format!("lower_runtime = {:?}", nvidia.display().to_string());
    Some((
        // Not an engine's file: `--dry-run` says what changes in it on stderr, the engines' files alone
        // go to stdout.
        Change {
            record: Some(what),
            ..Change::write(config.to_path_buf(), new, 0o644)
        },
        format!(
            "lower_runtime = {:?} in {} (NVIDIA's runtime, so that its GPU injection still happens under vgpu; --no-nvidia-lower-runtime leaves it)",
            nvidia.display(),
            config.display()
        ),
    ))
}

#[cfg(test)]
mod tests;
