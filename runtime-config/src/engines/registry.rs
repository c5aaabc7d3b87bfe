//! The engines vgpuctl knows. Adding one: a module implementing `api::ContainerEngine`, and its line here.
use super::api::DynEngine;
use super::{containerd, crio, docker, podman};

/// Every engine, in the order `--runtime` lists them.
pub static ENGINES: &[&dyn DynEngine] = &[
    &docker::Docker,
    &containerd::Containerd,
    &crio::Crio,
    &podman::Podman,
];

/// The engine `--runtime=name` names.
pub fn find(name: &str) -> Option<&'static dyn DynEngine> {
    ENGINES.iter().copied().find(|e| e.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique, and each engine's options are clap-valid on their own.
    #[test]
    fn names_are_unique_and_options_build() {
        for (i, e) in ENGINES.iter().enumerate() {
            assert!(ENGINES[..i].iter().all(|o| o.name() != e.name()));
            assert!(std::ptr::eq(find(e.name()).unwrap(), *e));
            assert!(!e.default_paths().is_empty());
            let cmd = e
                .args(true)
                .into_iter()
                .fold(clap::Command::new("x"), |c, a| c.arg(a));
            cmd.debug_assert();
        }
        assert!(find("lxc").is_none());
    }
}
