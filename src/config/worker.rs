//! `emq-worker`'s settings: one table ([`RawWorkerConfig`]), its typed
//! result ([`WorkerSettings`]) and its commented defaults
//! ([`WORKER_TOML`]).

use std::path::PathBuf;

use super::kinds::{AtLeastOne, EmqpAddrValues, Kind, LogFilter, Many, Optional, Period, Plain, ReportPeriodOrOff};
use super::table::{settings, Settings};
use super::ConfigError;
use crate::limits;
use crate::protocol::queues::check_queue_name;

settings! {
    /// emq-worker's settings as flags, `EMQ_*` variables and the TOML file
    /// give them. The command to run is not a setting: it follows `--`.
    pub struct RawWorkerConfig => WorkerSettings {
        /// Router backend address; several (repeated, or separated by commas) for failover: the worker
        /// connects to all and registers with the one that is up (docs/failover.md). Semicolons
        /// separate router names (owners) the worker serves at once, its concurrency split
        /// between them (docs/scaleout.md): `tcp://a:47290,tcp://a2:47290;tcp://b:47290`.
        backend: EmqpAddrValues = vec![limits::BACKEND_ADDR.to_string()], env "EMQ_BACKEND_ADDR", short 'B',
            was router;
        /// Queue to serve, as NAME or NAME:WEIGHT (weight at least 1, default 10; the higher tier of
        /// workers gets a queue's jobs first); repeat for several. None: the router's default queues.
        queue => queues: Many<QueueSpec> = Vec::<String>::new(), env "EMQ_WORKER_QUEUE", short 'Q';
        /// Jobs run at once (1 to 1024).
        concurrency: Concurrency = limits::WORKER_CONCURRENCY, env "EMQ_WORKER_CONCURRENCY", short 'J';
        /// Time limit of a job without a `timeout:N` header (e.g. `300s`), from its start until
        /// its command has exited and closed its stdout; past it the command's process group is
        /// killed and the job fails (timed out).
        timeout: Period = limits::WORKER_JOB_TIMEOUT, env "EMQ_WORKER_TIMEOUT";
        /// Longest wait for running jobs at shutdown (SIGTERM, SIGINT or SIGHUP; e.g. `30s`); then their commands' process
        /// groups get SIGTERM, SIGKILL 2 s later, and each job is reported failed to the router
        /// (which retries it on another worker instead of holding it for its `kbye_grace`) before
        /// the worker exits.
        drain_timeout: Period = limits::WORKER_DRAIN_TIMEOUT, env "EMQ_WORKER_DRAIN_TIMEOUT";
        /// Router silence before reconnecting under a new identity (e.g. `15s`).
        silence_timeout: Period = limits::WORKER_SILENCE_TIMEOUT, env "EMQ_WORKER_SILENCE_TIMEOUT";
        /// Period of the `jobs ok=… failed=…` log line (`0s`: only on exit).
        stats_interval: ReportPeriodOrOff = limits::WORKER_STATS_INTERVAL, env "EMQ_WORKER_STATS_INTERVAL";
        /// Largest job-result REPLY sent, in bytes (at least 1024); a result whose REPLY would be
        /// larger once JSON-encoded is reported failed instead, naming its size. Match it to the
        /// router: its `max_message_bytes` less 64 KiB.
        max_reply_bytes: ReplyBytes = limits::WORKER_MAX_REPLY_BYTES, env "EMQ_WORKER_MAX_REPLY_BYTES";
        /// Log filter (`info`, `emq=debug`, `warn`).
        log: LogFilter = limits::LOG, env "EMQ_LOG";
        /// The worker's CURVE secret key file (`NAME.key_secret`, mode 0600): connect as a CURVE client
        /// (with `curve_server_key`; the backend addresses must be the router's `backend_curve`).
        curve_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_KEY_FILE";
        /// The router's CURVE public key: 40 Z85 characters or a `.key` file; one for all addresses,
        /// or one per address in the same order, separated by commas.
        curve_server_key: Optional<Plain<String>>, env "EMQ_CURVE_SERVER_KEY";
    }
}

/// The commented default configuration of emq-worker.
pub const WORKER_TOML: &str = include_str!("worker.toml");

impl RawWorkerConfig {
    /// Validates into [`WorkerSettings`], defaults applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(self) -> Result<WorkerSettings, ConfigError> {
        let settings = self.build()?;
        if settings.backend.is_empty() {
            return Err(ConfigError::Invalid { name: "backend", why: "give at least one address".into() });
        }
        Ok(settings)
    }
}

/// Jobs a worker runs at once: 1 to [`limits::WORKER_MAX_CONCURRENCY`].
pub struct Concurrency;

impl Kind for Concurrency {
    type Raw = usize;
    type Value = usize;

    fn parse(text: &str) -> Result<usize, String> {
        AtLeastOne::parse(text)
    }

    fn check(n: usize) -> Result<usize, String> {
        let n = AtLeastOne::check(n)?;
        if n > limits::WORKER_MAX_CONCURRENCY {
            return Err(format!(
                "must be at most {} (each job is a thread; run more workers for more)",
                limits::WORKER_MAX_CONCURRENCY
            ));
        }
        Ok(n)
    }
}

/// The largest job-result REPLY a worker sends, in bytes: at least
/// [`limits::WORKER_MIN_REPLY_BYTES`], room for the failed REPLY that
/// replaces a larger result.
pub struct ReplyBytes;

impl Kind for ReplyBytes {
    type Raw = usize;
    type Value = usize;

    fn parse(text: &str) -> Result<usize, String> {
        AtLeastOne::parse(text)
    }

    fn check(n: usize) -> Result<usize, String> {
        if n < limits::WORKER_MIN_REPLY_BYTES {
            return Err(format!(
                "must be at least {} (room for the failed REPLY that replaces a larger result)",
                limits::WORKER_MIN_REPLY_BYTES
            ));
        }
        Ok(n)
    }
}

/// A queue a worker serves: `NAME` or `NAME:WEIGHT`.
pub struct QueueSpec;

impl Kind for QueueSpec {
    type Raw = String;
    type Value = (i64, String);

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(spec: String) -> Result<(i64, String), String> {
        let (name, weight) = match spec.rsplit_once(':') {
            Some((name, weight)) => match weight.parse::<i64>() {
                Ok(w) if w >= 1 => (name, w),
                _ => return Err(format!("{spec:?}: the weight {weight:?} must be a whole number of at least 1")),
            },
            None => (spec.as_str(), limits::DEFAULT_QUEUE_WEIGHT),
        };
        check_queue_name(name).map_err(|e| format!("{spec:?}: {e}"))?;
        Ok((weight, name.to_string()))
    }
}

super::table::program!(RawWorkerConfig => WorkerSettings, WORKER_TOML, RawWorkerConfig::validate);

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        raw: RawWorkerConfig,
    }

    fn parse(args: &[&str]) -> Result<WorkerSettings, String> {
        let raw = Args::try_parse_from([&["emq-worker"], args].concat()).map_err(|e| e.to_string())?.raw;
        raw.or(RawWorkerConfig::default()).validate().map_err(|e| e.to_string())
    }

    #[test]
    fn default_toml_matches_the_table() {
        assert_eq!(super::super::template::problems::<RawWorkerConfig>(WORKER_TOML), Vec::<String>::new());
    }

    #[test]
    fn repeated_flags_make_lists() {
        let s = parse(&["-Q", "email:5", "--queue", "default", "-B", "tcp://a:1", "--backend", "tcp://b:2"]).unwrap();
        assert_eq!(s.queues, vec![(5, "email".to_string()), (10, "default".to_string())]);
        assert_eq!(s.backend, ["tcp://a:1", "tcp://b:2"]);
        let s = parse(&[]).unwrap();
        assert_eq!((s.queues.len(), s.backend.as_slice()), (0, &[limits::BACKEND_ADDR.to_string()][..]));
        let vars = |name: &str| (name == "EMQ_WORKER_QUEUE").then(|| "a, b:2".into());
        let env = RawWorkerConfig::from_env(&vars).unwrap().validate().unwrap();
        assert_eq!(env.queues, vec![(10, "a".to_string()), (2, "b".to_string())]);
    }

    #[test]
    fn typos_are_refused() {
        let weight = "setting queue: \"email:-1\": the weight \"-1\" must be a whole number of at least 1";
        assert_eq!(parse(&["-Q", "email:-1"]).unwrap_err(), weight);
        assert!(parse(&["-Q", "email:0"]).unwrap_err().contains("at least 1"));
        let name = parse(&["-Q", "a@b"]).unwrap_err();
        assert!(name.ends_with("is not valid: use 1 to 255 characters from A-Z a-z 0-9 _ - . :"), "{name}");
        let addr = parse(&["--backend", "127.0.0.1:1"]).unwrap_err();
        assert!(addr.contains("eMQP addresses look like tcp://host:port"), "{addr}");
        assert!(parse(&["--timeout", "0s"]).unwrap_err().contains("must be more than 0"));
        assert_eq!(parse(&["-J", "0"]).unwrap_err(), "setting concurrency: must be at least 1");
        assert_eq!(parse(&["-J", "1024"]).unwrap().concurrency, 1024);
        let over = "setting concurrency: must be at most 1024 (each job is a thread; run more workers for more)";
        assert_eq!(parse(&["-J", "1025"]).unwrap_err(), over);
        assert_eq!(parse(&["-J", "100000"]).unwrap_err(), over);
    }

    #[test]
    fn max_reply_bytes_is_a_flag_a_variable_and_a_key_with_a_floor() {
        assert_eq!(parse(&[]).unwrap().max_reply_bytes, limits::WORKER_MAX_REPLY_BYTES);
        assert_eq!(limits::WORKER_MAX_REPLY_BYTES, 16_711_680);
        assert_eq!(parse(&["--max-reply-bytes", "1048576"]).unwrap().max_reply_bytes, 1 << 20);
        assert_eq!(parse(&["--max-reply-bytes", "1024"]).unwrap().max_reply_bytes, 1024);
        let floor =
            "setting max_reply_bytes: must be at least 1024 (room for the failed REPLY that replaces a larger result)";
        assert_eq!(parse(&["--max-reply-bytes", "1023"]).unwrap_err(), floor);
        assert_eq!(parse(&["--max-reply-bytes", "0"]).unwrap_err(), floor);
        let vars = |name: &str| (name == "EMQ_WORKER_MAX_REPLY_BYTES").then(|| "4000000".into());
        assert_eq!(RawWorkerConfig::from_env(&vars).unwrap().validate().unwrap().max_reply_bytes, 4_000_000);
        let file: RawWorkerConfig = toml::from_str("max_reply_bytes = 2048").unwrap();
        assert_eq!(file.validate().unwrap().max_reply_bytes, 2048);
    }
}
