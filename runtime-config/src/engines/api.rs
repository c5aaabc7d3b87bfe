//! The one interface every container engine implements ([`ContainerEngine`]), after NVIDIA's container
//! toolkit's `engine.Interface` (pkg/config/engine/api.go), but pure: an engine reads through [`Files`],
//! returns [`Change`] lists for the CLI to write or print, and never restarts anything.
//!
//! An engine declares its own command-line options as two clap structs: `Target` (where its files are,
//! for configure and unconfigure) and `Options` (configure only). [`DynEngine`] is the same interface
//! behind `dyn`, over clap's matches, for the registry (`registry::ENGINES`).
use super::change::Change;
use super::error::Result;
use super::files::Files;
use super::ownership::Ownership;
use clap::{ArgMatches, FromArgMatches};
use std::path::Path;

/// Where vgpu's binaries are installed and what the hooks get in their environment: options every
/// engine accepts (an installer passes them whatever the engine), each using those it needs.
#[derive(clap::Args, Debug, Clone)]
pub struct Install {
    /// Where vgpu-container-runtime is installed (the file name must stay vgpu-container-runtime: it is how
    /// vgpuctl recognises its own entries).
    #[arg(long, default_value = "/usr/bin/vgpu-container-runtime")]
    pub runtime_path: String,
    /// Where vgpu-hook is installed (Podman's hooks.d files; the file name must stay vgpu-hook).
    #[arg(long, default_value = "/usr/bin/vgpu-hook")]
    pub hook_path: String,
    /// Extra KEY=VALUE for the hooks' explicit environment (VGPU_CONFIG is passed on when set).
    #[arg(long = "hook-env", value_name = "KEY=VALUE")]
    pub hook_env: Vec<String>,
}

impl Default for Install {
    fn default() -> Self {
        Install {
            runtime_path: "/usr/bin/vgpu-container-runtime".into(),
            hook_path: "/usr/bin/vgpu-hook".into(),
            hook_env: vec![],
        }
    }
}

/// What every engine gets besides its own options.
pub struct Context<'a> {
    /// Everything the engine reads.
    pub files: &'a dyn Files,
    /// vgpuctl's record of what configure changed (`record::default_path()`).
    pub record: &'a Path,
    /// Where vgpu is installed (configure; the defaults for unconfigure).
    pub install: &'a Install,
    /// Replace an entry named vgpu that vgpuctl did not write (configure only).
    pub force: bool,
}

/// A container engine vgpu can be plugged into.
pub trait ContainerEngine: Sync {
    /// Its options for both verbs: where its files are.
    type Target: clap::Args + FromArgMatches;
    /// Its options for configure only.
    type Options: clap::Args + FromArgMatches;
    /// The `--runtime` value.
    fn name(&self) -> &'static str;
    /// How messages name it ("Docker is already configured ...").
    fn title(&self) -> &'static str;
    /// The files or folders it edits when not told otherwise.
    fn default_paths(&self) -> &'static [&'static str];
    /// The changes that plug vgpu in.
    fn configure(&self, t: &Self::Target, o: &Self::Options, cx: &Context) -> Result<Vec<Change>>;
    /// The changes that take back what configure added, and only that.
    fn unconfigure(&self, t: &Self::Target, cx: &Context) -> Result<Vec<Change>>;
    /// Whose is the `vgpu` entry configure would write.
    fn ownership(&self, t: &Self::Target, cx: &Context) -> Result<Ownership>;
    /// What the operator must do for the engine to see a change.
    fn restart_hint(&self) -> &'static str;
    /// Advice after configure (none by default).
    fn notes(&self, _t: &Self::Target, _cx: &Context) -> Vec<String> {
        vec![]
    }
    /// Why an option of another engine means nothing here, when that deserves more than "--X is for Y
    /// only" (`long`: the option without its dashes).
    fn refusal(&self, _long: &str) -> Option<&'static str> {
        None
    }
}

/// [`ContainerEngine`] behind `dyn`, its options read from clap's matches (implemented for every engine).
pub trait DynEngine: Sync {
    fn name(&self) -> &'static str;
    fn title(&self) -> &'static str;
    fn default_paths(&self) -> &'static [&'static str];
    /// The clap arguments of `Target` (`configure: true`: and of `Options`).
    fn args(&self, configure: bool) -> Vec<clap::Arg>;
    fn configure(&self, m: &ArgMatches, cx: &Context) -> Result<Vec<Change>>;
    fn unconfigure(&self, m: &ArgMatches, cx: &Context) -> Result<Vec<Change>>;
    fn ownership(&self, m: &ArgMatches, cx: &Context) -> Result<Ownership>;
    fn restart_hint(&self) -> &'static str;
    fn notes(&self, m: &ArgMatches, cx: &Context) -> Vec<String>;
    fn refusal(&self, long: &str) -> Option<&'static str>;
}

/// The arguments a clap `Args` struct declares.
fn args_of<A: clap::Args>() -> Vec<clap::Arg> {
    A::augment_args(clap::Command::new("engine"))
        .get_arguments()
        .cloned()
        .collect()
}

impl<E: ContainerEngine> DynEngine for E {
    fn name(&self) -> &'static str {
        ContainerEngine::name(self)
    }
    fn title(&self) -> &'static str {
        ContainerEngine::title(self)
    }
    fn default_paths(&self) -> &'static [&'static str] {
        ContainerEngine::default_paths(self)
    }
    fn args(&self, configure: bool) -> Vec<clap::Arg> {
        let mut a = args_of::<E::Target>();
        if configure {
            a.extend(args_of::<E::Options>());
        }
        a
    }
    fn configure(&self, m: &ArgMatches, cx: &Context) -> Result<Vec<Change>> {
        let t = E::Target::from_arg_matches(m)?;
        let o = E::Options::from_arg_matches(m)?;
        ContainerEngine::configure(self, &t, &o, cx)
    }
    fn unconfigure(&self, m: &ArgMatches, cx: &Context) -> Result<Vec<Change>> {
        ContainerEngine::unconfigure(self, &E::Target::from_arg_matches(m)?, cx)
    }
    fn ownership(&self, m: &ArgMatches, cx: &Context) -> Result<Ownership> {
        ContainerEngine::ownership(self, &E::Target::from_arg_matches(m)?, cx)
    }
    fn restart_hint(&self) -> &'static str {
        ContainerEngine::restart_hint(self)
    }
    fn notes(&self, m: &ArgMatches, cx: &Context) -> Vec<String> {
        match E::Target::from_arg_matches(m) {
            Ok(t) => ContainerEngine::notes(self, &t, cx),
            Err(_) => vec![],
        }
    }
    fn refusal(&self, long: &str) -> Option<&'static str> {
        ContainerEngine::refusal(self, long)
    }
}

/// `Options` of an engine that has none of its own.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NoOptions {}
