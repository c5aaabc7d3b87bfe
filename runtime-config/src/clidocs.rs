//! vgpuctl's shell completions (bash, zsh, fish) and the man pages of vgpuctl, vgpu-hook and
//! vgpu-container-runtime, generated from their clap definitions (`vgpu_oci::cli` for the hook and the
//! shim) so they never drift from the binaries. `make package` runs the hidden `vgpuctl generate-docs DIR`
//! and ships the result in the .deb and .rpm.
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Why the docs were not all written: the file or folder, and the system's reason.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    #[error("cannot create {}: {err}", dir.display())]
    Create { dir: PathBuf, err: std::io::Error },
    #[error("cannot write {}: {err}", path.display())]
    Write { path: PathBuf, err: std::io::Error },
    #[error("cannot write the man pages under {}: {err}", dir.display())]
    Man { dir: PathBuf, err: std::io::Error },
    /// Listing the man pages just written.
    #[error(transparent)]
    List(#[from] std::io::Error),
}

/// The completion files: (shell, file name the shell's completion loader looks for).
pub const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "vgpuctl"),
    (Shell::Zsh, "_vgpuctl"),
    (Shell::Fish, "vgpuctl.fish"),
];

/// Writes `DIR/completions/{vgpuctl,_vgpuctl,vgpuctl.fish}` and `DIR/man/vgpuctl*.1` (one page per visible
/// subcommand, `vgpuctl-runtime-configure.1` style), and a page for each of `others` (the programs engines
/// run, which need no completions); returns the files written, sorted.
pub fn write_all(
    cmd: clap::Command,
    others: &[clap::Command],
    dir: &Path,
) -> Result<Vec<PathBuf>, DocsError> {
    let comp_dir = dir.join("completions");
    let man_dir = dir.join("man");
    for d in [&comp_dir, &man_dir] {
        std::fs::create_dir_all(d).map_err(|err| DocsError::Create {
            dir: d.clone(),
            err,
        })?;
    }
    let name = cmd.get_name().to_string();
    let mut files = Vec::new();
    for (shell, file) in COMPLETIONS {
        let path = comp_dir.join(file);
        let mut out = std::fs::File::create(&path).map_err(|err| DocsError::Write {
            path: path.clone(),
            err,
        })?;
        clap_complete::generate(shell, &mut cmd.clone(), &name, &mut out);
        files.push(path);
    }
    for c in std::iter::once(cmd).chain(others.iter().cloned()) {
        clap_mangen::generate_to(c, &man_dir).map_err(|err| DocsError::Man {
            dir: man_dir.clone(),
            err,
        })?;
    }
    for e in std::fs::read_dir(&man_dir)? {
        files.push(e?.path());
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn cli() -> Command {
        Command::new("vgpuctl")
            .about("the tool")
            .subcommand(
                Command::new("runtime").about("engines").subcommand(
                    Command::new("configure")
                        .about("add vgpu")
                        .arg(Arg::new("dry-run").long("dry-run").num_args(0)),
                ),
            )
            .subcommand(Command::new("secret").hide(true))
    }

    #[test]
    fn every_visible_subcommand_gets_a_page_and_every_shell_its_file() {
        let d = tempfile::tempdir().unwrap();
        let files = write_all(cli(), &[], d.path()).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| {
                p.strip_prefix(d.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "completions/_vgpuctl",
                "completions/vgpuctl",
                "completions/vgpuctl.fish",
                "man/vgpuctl-runtime-configure.1",
                "man/vgpuctl-runtime.1",
                "man/vgpuctl.1",
            ]
        );
        let page =
            std::fs::read_to_string(d.path().join("man/vgpuctl-runtime-configure.1")).unwrap();
        assert!(page.contains("dry\\-run"), "{page}");
        let bash = std::fs::read_to_string(d.path().join("completions/vgpuctl")).unwrap();
        assert!(bash.contains("--dry-run"), "{bash}");
        // clap_complete offers hidden subcommands too (so `generate-docs` completes): the man pages skip them.
        let top = bash
            .lines()
            .find(|l| l.trim_start().starts_with("opts=\"-"))
            .unwrap();
        assert!(top.contains("runtime"), "{top}");
    }

    /// The hook's and the shim's pages come from vgpu_oci's descriptions: their arguments, what they do.
    #[test]
    fn the_hook_and_the_shim_get_their_pages() {
        let d = tempfile::tempdir().unwrap();
        let files = write_all(
            cli(),
            &[vgpu_oci::cli::hook_command(), vgpu_oci::cli::shim_command()],
            d.path(),
        )
        .unwrap();
        for page in ["man/vgpu-hook.1", "man/vgpu-container-runtime.1"] {
            assert!(files.contains(&d.path().join(page)), "{files:?}");
        }
        let hook = std::fs::read_to_string(d.path().join("man/vgpu-hook.1")).unwrap();
        assert!(
            hook.contains("createRuntime") && hook.contains("poststop"),
            "{hook}"
        );
        assert!(hook.contains("VGPU_CONFIG"), "{hook}");
        let shim = std::fs::read_to_string(d.path().join("man/vgpu-container-runtime.1")).unwrap();
        assert!(
            shim.contains("lower runtime") && shim.contains("\\-\\-bundle"),
            "{shim}"
        );
        assert!(
            !d.path().join("completions/vgpu-hook").exists(),
            "no completions for them"
        );
    }

    #[test]
    fn an_unwritable_folder_is_one_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, "").unwrap();
        let e = write_all(cli(), &[], &file).unwrap_err();
        assert!(
            matches!(&e, DocsError::Create { dir, .. } if *dir == file.join("completions")),
            "{e}"
        );
    }
}
