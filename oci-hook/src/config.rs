//! The vgpu config file as the shim and the hook see it: the one owner of `/etc/vgpu/config.toml` is
//! `vgpu_host::config` (the whole file, parsed once into typed values); this module names it for the rest
//! of the crate. Not here: the paths inside a container or of the state folder (`vgpu_ledger::layout`).

pub use vgpu_host::config::{
    Config, ConfigError, HookStage, LogLevel, LogRotation, Unquoted, CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
};
