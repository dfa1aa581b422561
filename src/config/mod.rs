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
//! [`crate::limits`]. Every program has a table: the router
//! ([`RawRouterConfig`]), `emq-worker` ([`RawWorkerConfig`]), `emq-cli`
//! ([`RawCliConfig`]), `emq-pubsub` ([`RawPubSubConfig`]), `emq-bench`
//! ([`RawBenchConfig`]) and
//! `emq-scheduler` ([`crate::scheduler::config::RawSchedulerConfig`]), each
//! with a `log` key and with [`ConfigArgs`] (`--config`, `--print-config`).
//! A socket has the same key, flag and variable in every program that uses
//! it (`frontend`, `--frontend`, `EMQ_FRONTEND_ADDR`); [`addr`] checks every
//! address the same way.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

pub mod addr;
mod bench;
mod cli;
pub mod exposure;
pub mod kinds;
mod pubsub;
pub mod queues;
mod router;
pub mod table;
pub mod template;
mod worker;

pub use bench::{BenchSettings, RawBenchConfig, BENCH_TOML};
pub use cli::{CliSettings, RawCliConfig, CLI_TOML};
pub use kinds::Kind;
pub use pubsub::{curve_settings as pubsub_curve_settings, PubSubCurve, PubSubSettings, RawPubSubConfig, PUBSUB_TOML};
pub use router::{check_curve_settings, check_nats_settings, CurveServerConfig, NatsUrl, Replicas, StoreName};
pub use router::{
    default_data_dir, default_shards, Durability, LatencyConfig, NatsConfig, RawRouterConfig, RouterConfig, TextConfig,
    WalConfig, DEFAULT_TOML,
};
pub use table::Settings;
pub use worker::{QueueSpec, RawWorkerConfig, WorkerSettings, WORKER_TOML};

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
    /// `--print-config`'s output could not be written (stdout a closed
    /// pipe, a full disk).
    #[error("cannot print the configuration to stdout: {source}")]
    Print {
        /// The I/O error.
        source: std::io::Error,
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

/// The flags every program has besides its settings table.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML configuration file (keys as --print-config prints them)
    /// [env: EMQ_CONFIG].
    // The variable is in the text, as for the settings' flags
    // ([`table::flag_help`]): clap's long help would put it after a blank
    // line that ends in spaces.
    #[arg(long, short = 'C', env = "EMQ_CONFIG", hide_env = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the configuration with the defaults, --config file, EMQ_*
    /// variables and flags applied, and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// [`layered`] for a program's start: `flags` over the variables over the
/// `--config` file. Warnings about deprecated names go to stderr at once,
/// before the program's own log is set up (its filter is one of the
/// settings).
///
/// # Errors
/// As [`layered`].
pub fn resolve<S: Settings>(args: &ConfigArgs, flags: S) -> Result<S, ConfigError> {
    let log = crate::logging::subscriber("warn");
    tracing::subscriber::with_default(log, || layered(flags, args.config.as_deref()))
}

/// A program's settings table, with what its start needs.
pub trait Program: Settings {
    /// The checked configuration.
    type Checked;
    /// The commented defaults `--print-config` fills in.
    const TEMPLATE: &'static str;

    /// Checks the settings, each and together, defaults applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    fn check(self) -> Result<Self::Checked, ConfigError>;

    /// The log filter of a checked configuration.
    fn log(checked: &Self::Checked) -> &str;
}

/// A program's start: [`resolve`] its settings, check them (warnings to
/// stderr at once, as [`resolve`]'s), then either print them (`--print-config`: returns `None`, the program exits) or set
/// up its log and return them.
///
/// # Errors
/// [`ConfigError`] naming the file or the setting; [`ConfigError::Print`]
/// when `--print-config` cannot write to stdout.
pub fn start<P: Program>(args: &ConfigArgs, flags: P) -> Result<Option<P::Checked>, ConfigError> {
    let raw = resolve(args, flags)?;
    // The checks warn too (settings that work but will cost something):
    // like resolve's, their warnings go to stderr at once.
    let checked = tracing::subscriber::with_default(crate::logging::subscriber("warn"), || raw.clone().check())?;
    if args.print_config {
        use std::io::Write;
        let text = template::resolved(&raw, P::TEMPLATE)?;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|source| ConfigError::Print { source })?;
        return Ok(None);
    }
    crate::logging::init(P::log(&checked));
    Ok(Some(checked))
}

/// The variable read when `name` is not set: `RUST_LOG` for `EMQ_LOG`, the
/// usual variable of Rust programs' log filters.
fn fallback(name: &str) -> Option<std::ffi::OsString> {
    (name == "EMQ_LOG").then(|| std::env::var_os("RUST_LOG")).flatten()
}

/// Stacks a program's sources: `flags` over the process's environment
/// variables over the file at `file` (if any). Defaults come later, in
/// [`Settings::build`].
///
/// # Errors
/// [`ConfigError`] from the variables or the file, naming the setting or
/// the file.
pub fn layered<S: Settings>(flags: S, file: Option<&Path>) -> Result<S, ConfigError> {
    let env = S::from_env(&|name| std::env::var_os(name).or_else(|| fallback(name)))?;
    let file = match file {
        Some(path) => from_file(path)?,
        None => S::default(),
    };
    Ok(flags.or(env).or(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md names every setting of every program, with its variable.
    #[test]
    fn the_configuration_page_names_every_setting() {
        let page = include_str!("../../docs/configuration.md");
        let mut missing = Vec::new();
        let mut check = |names: &[table::Names]| {
            for n in names {
                for word in [format!("`{}`", n.key), format!("`{}`", n.env)] {
                    if !page.contains(&word) {
                        missing.push(word);
                    }
                }
            }
        };
        check(RawRouterConfig::NAMES);
        check(RawWorkerConfig::NAMES);
        check(RawCliConfig::NAMES);
        check(RawPubSubConfig::NAMES);
        check(RawBenchConfig::NAMES);
        check(crate::scheduler::config::RawSchedulerConfig::NAMES);
        assert_eq!(missing, Vec::<String>::new());
    }
}
