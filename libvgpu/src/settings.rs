//! The process's configuration, loaded once on first use (never in a constructor), and the start of
//! process-life handling when a memory limit applies. The model and its parsing live in `config`; quotas
//! in `devices`; which devices have a compute share in `compute::which`.

use std::sync::OnceLock;

use crate::config::{Config, ConfigError};
use crate::error::Error;
use crate::{lifecycle, log};

static CONFIG: OnceLock<Result<Config, ConfigError>> = OnceLock::new();

/// The configuration; an error is logged once and makes CUDA refuse to start in this process.
///
/// Loaded with no lock held (the files read and any dlsym the standard library makes happen outside),
/// then published; threads that load it at the same time each read the same files and one publishes.
/// A one-time lock held across the load could deadlock with a thread inside `dlopen` whose library
/// constructor calls CUDA (the loader lock against ours).
pub fn config() -> Result<&'static Config, Error> {
    let c = match CONFIG.get() {
        Some(c) => c,
        None => publish(Config::load()),
    };
    c.as_ref().map_err(|_| Error::Refused)
}

#[cold]
fn publish(c: Result<Config, ConfigError>) -> &'static Result<Config, ConfigError> {
    // The closure only moves the value in under the cell's lock: nothing runs under it. A thread that
    // lost the race drops its copy and gets the published one.
    let mut ours = false;
    let published = CONFIG.get_or_init(|| {
        ours = true;
        c
    });
    if ours {
        match published {
            Err(e) => log::error(format_args!("{e}; CUDA is refused in this process")),
            Ok(c) if !c.is_unlimited() => {
                lifecycle::register();
                log::info(format_args!("configuration: {c:?}"));
            }
            _ => {}
        }
    }
    published
}

/// True when no quota applies anywhere (the hooks then only forward).
#[inline]
pub fn unlimited() -> bool {
    matches!(config(), Ok(c) if c.is_unlimited())
}

/// Whether any limit applies in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    /// No limit anywhere: forward everything.
    Nowhere,
    /// Some device may have a limit.
    Somewhere,
    /// The configuration is broken: CUDA is refused.
    Broken,
}

#[inline]
pub fn applies() -> Applies {
    match config() {
        Err(_) => Applies::Broken,
        Ok(c) if c.is_unlimited() => Applies::Nowhere,
        Ok(_) => Applies::Somewhere,
    }
}
