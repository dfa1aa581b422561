//! Router configuration in two steps (ripgrep's lowargs → hiargs habit):
//! raw values from flags, `EMQ_*` environment variables and a TOML file
//! ([`RawRouterConfig`]), then one validated [`RouterConfig`].
//!
//! Precedence: command-line flag, then environment variable, then the file
//! given with `--config` (or `EMQ_CONFIG`), then the defaults of
//! [`crate::limits`]. `emq-router --print-config` prints [`DEFAULT_TOML`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::limits;

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

/// The router's settings as the TOML file and the flags give them: every
/// field optional. Keys match [`DEFAULT_TOML`].
#[derive(Debug, Default, Clone, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct RawRouterConfig {
    /// eMQP frontend address (clients, schedulers).
    #[arg(long, env = "EMQ_FRONTEND_ADDR")]
    pub frontend_addr: Option<String>,
    /// eMQP backend address (workers).
    #[arg(long, env = "EMQ_BACKEND_ADDR")]
    pub backend_addr: Option<String>,
    /// Admin socket address (emq-cli).
    #[arg(long, env = "EMQ_ADMIN_ADDR")]
    pub admin_addr: Option<String>,
    /// Text protocol listen address (`host:port`), or `off`.
    #[arg(long, env = "EMQ_TEXT_ADDR")]
    pub text_addr: Option<String>,
    /// Dispatcher shards (queue-owning threads). 0 = pick from the core count.
    #[arg(long, env = "EMQ_SHARDS")]
    pub shards: Option<usize>,
    /// Pin the I/O and shard threads to cores when there are enough cores.
    #[arg(long, env = "EMQ_PIN_THREADS")]
    pub pin_threads: Option<bool>,
    /// Heartbeat send period to workers and schedulers (e.g. `3s`).
    #[arg(long, env = "EMQ_HEARTBEAT_INTERVAL")]
    pub heartbeat_interval: Option<String>,
    /// A peer silent this long is dead (e.g. `5s`).
    #[arg(long, env = "EMQ_HEARTBEAT_TIMEOUT")]
    pub heartbeat_timeout: Option<String>,
    /// Most waiting jobs per queue; past it REQUEST gets ERROR and SCHED
    /// gets `ERR QUEUE_FULL`.
    #[arg(long, env = "EMQ_MAX_QUEUE_LEN")]
    pub max_queue_len: Option<usize>,
    /// Queues of a worker whose INFORM has an empty queue list, as JSON
    /// (`[[10, "default"]]`).
    #[arg(long, env = "EMQ_DEFAULT_QUEUES")]
    pub default_queues: Option<String>,
    /// How long a worker that said KBYE may still finish its jobs (e.g. `300s`).
    #[arg(long, env = "EMQ_KBYE_GRACE")]
    pub kbye_grace: Option<String>,
    /// How long shutdown waits for queued and in-flight jobs (e.g. `10s`).
    #[arg(long, env = "EMQ_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<String>,
    /// ZeroMQ send and receive high-water mark per peer (messages).
    #[arg(long, env = "EMQ_ZMQ_HWM")]
    pub zmq_hwm: Option<i32>,
    /// Longest text line in bytes.
    #[arg(long, env = "EMQ_TEXT_MAX_LINE")]
    pub text_max_line: Option<usize>,
    /// Text offer timeout (e.g. `300s`).
    #[arg(long, env = "EMQ_TEXT_OFFER_TIMEOUT")]
    pub text_offer_timeout: Option<String>,
    /// Text partial-line idle timeout (e.g. `60s`).
    #[arg(long, env = "EMQ_TEXT_IDLE_TIMEOUT")]
    pub text_idle_timeout: Option<String>,
    /// Most open text connections.
    #[arg(long, env = "EMQ_TEXT_MAX_CONNECTIONS")]
    pub text_max_connections: Option<usize>,
    /// Threads accepting text connections.
    #[arg(long, env = "EMQ_TEXT_ACCEPTORS")]
    pub text_acceptors: Option<usize>,
    /// Period of the latency log line (e.g. `60s`; `0s` = off).
    #[arg(long, env = "EMQ_LATENCY_INTERVAL")]
    pub latency_interval: Option<String>,
    /// Directory for per-interval `.hgrm` latency files (off when unset).
    #[arg(long, env = "EMQ_LATENCY_DIR")]
    pub latency_dir: Option<PathBuf>,
}

/// The validated router configuration.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// eMQP frontend endpoint (ZeroMQ syntax).
    pub frontend_addr: String,
    /// eMQP backend endpoint.
    pub backend_addr: String,
    /// Admin endpoint.
    pub admin_addr: String,
    /// Text protocol listen address; `None` = text front end off.
    pub text_addr: Option<SocketAddr>,
    /// Number of dispatcher shards, ≥ 1.
    pub shards: usize,
    /// Pin threads to cores where the machine has enough of them.
    pub pin_threads: bool,
    /// Heartbeat send period.
    pub heartbeat_interval: Duration,
    /// Peer expiry.
    pub heartbeat_timeout: Duration,
    /// Most waiting jobs per queue.
    pub max_queue_len: usize,
    /// `(weight, queue)` pairs for an INFORM with an empty queue list.
    pub default_queues: Vec<(i64, String)>,
    /// In-flight grace of a worker after its KBYE.
    pub kbye_grace: Duration,
    /// Shutdown drain limit.
    pub drain_timeout: Duration,
    /// ZeroMQ HWM per peer pipe.
    pub zmq_hwm: i32,
    /// Text protocol limits.
    pub text: TextConfig,
    /// Latency reporter settings.
    pub latency: LatencyConfig,
}

/// Text protocol limits (text-protocol.md "Limits").
#[derive(Debug, Clone)]
pub struct TextConfig {
    /// Longest line in bytes (not counting LF and a CR before it).
    pub max_line_bytes: usize,
    /// Unanswered offers go back to the front after this.
    pub offer_timeout: Duration,
    /// A partial line idle this long closes the connection.
    pub idle_timeout: Duration,
    /// Connection cap.
    pub max_connections: usize,
    /// Acceptor threads.
    pub acceptors: usize,
}

/// Latency reporter settings.
#[derive(Debug, Clone)]
pub struct LatencyConfig {
    /// Log line period; `None` = no periodic line.
    pub report_interval: Option<Duration>,
    /// Where to write `.hgrm` files per interval, if anywhere.
    pub hgrm_dir: Option<PathBuf>,
}

/// The commented default configuration, as `--print-config` prints it.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

impl RawRouterConfig {
    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`] (unknown keys included).
    pub fn from_file(path: &Path) -> Result<RawRouterConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source: Box::new(source) })
    }

    /// Fills every unset field of `self` from `lower` (flags over file).
    pub fn or(self, lower: RawRouterConfig) -> RawRouterConfig {
        macro_rules! pick {
            ($($f:ident),*) => { RawRouterConfig { $($f: self.$f.or(lower.$f)),* } };
        }
        pick!(
            frontend_addr,
            backend_addr,
            admin_addr,
            text_addr,
            shards,
            pin_threads,
            heartbeat_interval,
            heartbeat_timeout,
            max_queue_len,
            default_queues,
            kbye_grace,
            drain_timeout,
            zmq_hwm,
            text_max_line,
            text_offer_timeout,
            text_idle_timeout,
            text_max_connections,
            text_acceptors,
            latency_interval,
            latency_dir
        )
    }

    /// Validates into a [`RouterConfig`], applying defaults.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(self) -> Result<RouterConfig, ConfigError> {
        let text_addr = match self.text_addr.as_deref() {
            Some("off") | Some("") => None,
            Some(a) => Some(parse_addr("text_addr", a)?),
            None => Some(parse_addr("text_addr", limits::TEXT_ADDR)?),
        };
        let heartbeat_interval = duration("heartbeat_interval", self.heartbeat_interval, limits::HEARTBEAT_INTERVAL)?;
        let heartbeat_timeout = duration("heartbeat_timeout", self.heartbeat_timeout, limits::HEARTBEAT_TIMEOUT)?;
        if heartbeat_interval.is_zero() || heartbeat_timeout <= heartbeat_interval {
            return Err(invalid("heartbeat_timeout", "must be longer than a non-zero heartbeat_interval"));
        }
        if heartbeat_timeout < limits::PYTHON_PEER_HEARTBEAT + limits::PYTHON_PEER_HEARTBEAT_SLACK
            || heartbeat_interval > limits::PYTHON_PEER_SILENCE / 3
        {
            tracing::warn!(
                ?heartbeat_interval,
                ?heartbeat_timeout,
                "Python EventMQ peers heartbeat every 3 s and reconnect after ~15 s of router silence: \
                 these settings will expire or lose them"
            );
        }
        let latency_interval = duration("latency_interval", self.latency_interval, limits::LATENCY_REPORT_INTERVAL)?;
        Ok(RouterConfig {
            frontend_addr: self.frontend_addr.unwrap_or_else(|| limits::FRONTEND_ADDR.into()),
            backend_addr: self.backend_addr.unwrap_or_else(|| limits::BACKEND_ADDR.into()),
            admin_addr: self.admin_addr.unwrap_or_else(|| limits::ADMIN_ADDR.into()),
            text_addr,
            shards: match self.shards {
                None | Some(0) => default_shards(),
                Some(n) if n > limits::MAX_SHARDS => {
                    return Err(invalid("shards", &format!("at most {}", limits::MAX_SHARDS)))
                }
                Some(n) => n,
            },
            pin_threads: self.pin_threads.unwrap_or(true),
            heartbeat_interval,
            heartbeat_timeout,
            max_queue_len: positive("max_queue_len", self.max_queue_len.unwrap_or(limits::MAX_QUEUE_LEN))?,
            default_queues: match self.default_queues {
                None => vec![(limits::DEFAULT_QUEUE_WEIGHT, limits::DEFAULT_QUEUE.to_string())],
                Some(json) => crate::protocol::queues::parse_queue_list(json.as_bytes())
                    .map_err(|e| invalid("default_queues", &e.to_string()))?,
            },
            kbye_grace: duration("kbye_grace", self.kbye_grace, limits::KBYE_GRACE)?,
            drain_timeout: duration("drain_timeout", self.drain_timeout, limits::DRAIN_TIMEOUT)?,
            zmq_hwm: self.zmq_hwm.unwrap_or(limits::ZMQ_HWM),
            text: TextConfig {
                max_line_bytes: positive("text_max_line", self.text_max_line.unwrap_or(limits::TEXT_MAX_LINE_BYTES))?,
                offer_timeout: duration("text_offer_timeout", self.text_offer_timeout, limits::TEXT_OFFER_TIMEOUT)?,
                idle_timeout: duration("text_idle_timeout", self.text_idle_timeout, limits::TEXT_IDLE_TIMEOUT)?,
                max_connections: positive(
                    "text_max_connections",
                    self.text_max_connections.unwrap_or(limits::TEXT_MAX_CONNECTIONS),
                )?,
                acceptors: positive("text_acceptors", self.text_acceptors.unwrap_or(limits::TEXT_ACCEPTORS))?,
            },
            latency: LatencyConfig {
                report_interval: (!latency_interval.is_zero()).then_some(latency_interval),
                hgrm_dir: self.latency_dir,
            },
        })
    }
}

impl Default for RouterConfig {
    fn default() -> RouterConfig {
        match RawRouterConfig::default().validate() {
            Ok(c) => c,
            Err(e) => unreachable!("built-in defaults are valid: {e}"),
        }
    }
}

/// Default shard count: one per two cores, at least one, so that the I/O
/// thread and the shards do not oversubscribe small machines (2 cores → 1).
pub fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores / 2).max(1)
}

fn invalid(name: &'static str, why: &str) -> ConfigError {
    ConfigError::Invalid { name, why: why.to_string() }
}

fn parse_addr(name: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|e| invalid(name, &format!("{text:?} is not host:port ({e})")))
}

fn positive(name: &'static str, n: usize) -> Result<usize, ConfigError> {
    if n == 0 {
        return Err(invalid(name, "must be at least 1"));
    }
    Ok(n)
}

/// Parses a human duration (`3s`, `250ms`, `5m`) or takes `default`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting.
pub fn duration(name: &'static str, text: Option<String>, default: Duration) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(t) => humantime::parse_duration(t.trim()).map_err(|e| invalid(name, &format!("{t:?}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_parses_and_matches_defaults() {
        let raw: RawRouterConfig = toml::from_str(DEFAULT_TOML).unwrap();
        let c = raw.validate().unwrap();
        let d = RouterConfig::default();
        assert_eq!(c.frontend_addr, d.frontend_addr);
        assert_eq!(c.heartbeat_timeout, d.heartbeat_timeout);
        assert_eq!(c.text.max_line_bytes, d.text.max_line_bytes);
        assert_eq!(c.default_queues, vec![(10, "default".to_string())]);
    }

    #[test]
    fn flags_win_over_file() {
        let flags = RawRouterConfig { shards: Some(3), ..Default::default() };
        let file = RawRouterConfig { shards: Some(1), max_queue_len: Some(7), ..Default::default() };
        let c = flags.or(file).validate().unwrap();
        assert_eq!((c.shards, c.max_queue_len), (3, 7));
    }

    #[test]
    fn bad_values_name_the_setting() {
        let raw = RawRouterConfig { heartbeat_timeout: Some("1s".into()), ..Default::default() };
        assert!(raw.validate().unwrap_err().to_string().contains("heartbeat_timeout"));
        let raw = RawRouterConfig { text_addr: Some("nowhere".into()), ..Default::default() };
        assert!(raw.validate().unwrap_err().to_string().contains("text_addr"));
    }
}
