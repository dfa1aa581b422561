//! Configuration in two steps (ripgrep's lowargs → hiargs habit): raw
//! values from flags, `EMQ_*` environment variables and a TOML file, then
//! one validated, typed config.
//!
//! Each program declares its settings once, in a table ([`table`]): name,
//! kind ([`kinds`]), default from [`crate::limits`], variable, doc. The
//! table makes the raw struct (clap flags, serde keys), the variable reader,
//! the merge and the checked, typed config. [`layered`] stacks the sources,
//! [`template`] prints the commented defaults with what was resolved.
//!
//! Precedence: command-line flag, then environment variable, then the file
//! given with `--config` (or `EMQ_CONFIG`), then the defaults of
//! [`crate::limits`]. Only the router uses the table so far
//! ([`RawRouterConfig`]).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

pub mod kinds;
mod router;
pub mod table;
pub mod template;

pub use kinds::Kind;
pub use router::{
    default_shards, Durability, LatencyConfig, RawRouterConfig, RouterConfig, TextConfig, WalConfig, DEFAULT_TOML,
};
pub use table::Settings;

/// A configuration error: which setting, and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has unknown keys.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML error (with line and column).
        source: Box<toml::de::Error>,
    },
    /// A value is out of range or malformed.
    #[error("setting {name}: {why}")]
    Invalid {
        /// The setting's name as in the file.
        name: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// Reads a TOML file of settings.
///
/// # Errors
/// [`ConfigError::Read`], or [`ConfigError::Parse`] (unknown keys and
/// values of the wrong type included).
pub fn from_file<S: DeserializeOwned>(path: &Path) -> Result<S, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })
}

/// Stacks a program's sources: `flags` over the process's environment
/// variables over the file at `file` (if any). Defaults come later, in
/// [`Settings::build`].
///
/// # Errors
/// [`ConfigError`] from the variables or the file, naming the setting or
/// the file.
pub fn layered<S: Settings>(flags: S, file: Option<&Path>) -> Result<S, ConfigError> {
    let env = S::from_env(&|name| std::env::var_os(name))?;
    let file = match file {
        Some(path) => from_file(path)?,
        None => S::default(),
    };
    Ok(flags.or(env).or(file))
}
