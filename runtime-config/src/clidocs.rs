//! vgpuctl's shell completions (bash, zsh, fish) and man pages, generated from its clap definition so they
//! never drift from the binary. `make package` runs the hidden `vgpuctl generate-docs DIR` and ships the
//! result in the .deb and .rpm.
use anyhow::{Context, Result};
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The completion files: (shell, file name the shell's completion loader looks for).
pub const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "vgpuctl"),
    (Shell::Zsh, "_vgpuctl"),
    (Shell::Fish, "vgpuctl.fish"),
];

/// Writes `DIR/completions/{vgpuctl,_vgpuctl,vgpuctl.fish}` and `DIR/man/vgpuctl*.1` (one page per visible
/// subcommand, `vgpuctl-runtime-configure.1` style); returns the files written, sorted.
pub fn write_all(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>> {
    let comp_dir = dir.join("completions");
    let man_dir = dir.join("man");
    for d in [&comp_dir, &man_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let name = cmd.get_name().to_string();
    let mut files = Vec::new();
    for (shell, file) in COMPLETIONS {
        let path = comp_dir.join(file);
        let mut out = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        clap_complete::generate(shell, &mut cmd.clone(), &name, &mut out);
        files.push(path);
    }
    clap_mangen::generate_to(cmd, &man_dir)
        .with_context(|| format!("cannot write the man pages under {}", man_dir.display()))?;
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
        let files = write_all(cli(), d.path()).unwrap();
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

    #[test]
    fn an_unwritable_folder_is_one_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        std::fs::write(&file, "").unwrap();
        let e = write_all(cli(), &file).unwrap_err();
        assert!(
            format!("{e:#}").contains(&file.join("completions").display().to_string()),
            "{e:#}"
        );
    }
}
