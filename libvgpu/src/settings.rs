//! The process's configuration, loaded once on first use (never in a constructor), and the start of
//! process-life handling when a limit applies. Parsing lives in `config`; quotas in `devices`.

use std::sync::OnceLock;

use crate::config::Config;
use crate::error::Error;
use crate::{lifecycle, log};

static CONFIG: OnceLock<Result<Config, Error>> = OnceLock::new();

/// The configuration; an error is logged once and makes CUDA refuse to start in this process.
pub fn config() -> Result<&'static Config, Error> {
    let c = CONFIG.get_or_init(|| {
        let c = Config::load();
        match &c {
            Err(e) => log::error(format_args!("{e}; CUDA is refused in this process")),
            Ok(c) if !c.is_unlimited() => {
                lifecycle::register();
                log::info(format_args!("configuration: {c:?}"));
            }
            Ok(_) => {}
        }
        c
    });
    c.as_ref().map_err(|_| Error::Refused)
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
