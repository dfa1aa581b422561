//! emq-scheduler's settings: one table ([`RawSchedulerConfig`], the same
//! mechanism as every program, [`crate::config`]), checked into one
//! [`SchedulerConfig`], and the commented defaults ([`SCHEDULER_TOML`]).
//!
//! The data directory defaults to `$XDG_STATE_HOME/emq-scheduler`, else
//! `$HOME/.local/state/emq-scheduler`, else `./emq-scheduler-data`: schedules
//! are state (XDG Base Directory spec), not configuration or cache.

use std::path::PathBuf;

use chrono_tz::Tz;

use super::nats_store::NatsSettings;
use super::peer::{AdminCurve, PeerConfig};
use crate::config::exposure::{check_plain_listeners, PlainListener};
use crate::config::kinds::{EmqpAddrOrOff, EmqpAddrs, LogFilter, Many, Optional, Period, Plain, Switch};
use crate::config::table::settings;
use crate::config::{ConfigError, NatsUrl, Replicas, Settings, StoreName};
use crate::curve::{self, ClientCurve};
use crate::jslog::connect::NatsSecurity;
use crate::limits;

settings! {
    /// emq-scheduler's settings as flags, `EMQ_*` variables and the TOML file
    /// give them.
    pub struct RawSchedulerConfig => SchedulerSettings {
        /// The router's eMQP frontend to connect to; several separated by commas for failover
        /// (docs/failover.md).
        frontend: EmqpAddrs = limits::FRONTEND_ADDR, env "EMQ_FRONTEND_ADDR",
            was router_addr "EMQ_SCHEDULER_ROUTER_ADDR";
        /// The scheduler's own admin address to bind (`emq-cli schedules` asks it), or `off`.
        scheduler_admin: EmqpAddrOrOff = limits::SCHEDULER_ADMIN_ADDR, env "EMQ_SCHEDULER_ADMIN_ADDR",
            was admin_addr;
        /// Allow `scheduler_admin` on a non-loopback address (it is plain:
        /// no encryption, no authentication); it is named in a warning at
        /// start (docs/security.md, "Safe default").
        allow_insecure_remote: Switch = false, env "EMQ_ALLOW_INSECURE_REMOTE";
        /// A CURVE admin address to bind besides `scheduler_admin` (same socket; ZAP domain
        /// `admin`, allow-list `curve_admins_dir`), or `off`.
        scheduler_admin_curve: EmqpAddrOrOff = "off", env "EMQ_SCHEDULER_ADMIN_CURVE";
        /// The scheduler's secret key file (`NAME.key_secret`, czmq/pyzmq format, mode 0600 or
        /// stricter); needed by `scheduler_admin_curve`.
        curve_secret_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_SECRET_KEY_FILE";
        /// Directory of the `*.key` files of operators allowed on `scheduler_admin_curve`.
        curve_admins_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_ADMINS_DIR";
        /// The scheduler's CURVE key file (`NAME.key_secret`, mode 0600): connect to the router
        /// as a CURVE client (with `curve_server_key`; `frontend` must be its `frontend_curve`).
        curve_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_KEY_FILE";
        /// The router's CURVE public key: 40 Z85 characters or a `.key` file; one for all addresses,
        /// or one per address in the same order, separated by commas.
        curve_server_key: Optional<Plain<String>>, env "EMQ_CURVE_SERVER_KEY";
        /// Directory of the schedule store (default: `$XDG_STATE_HOME/emq-scheduler`).
        data_dir: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_DATA_DIR";
        /// IANA time zone cron expressions are evaluated in (e.g. `Europe/Berlin`).
        timezone: Plain<String> = limits::SCHEDULER_TIMEZONE, env "EMQ_SCHEDULER_TIMEZONE";
        /// Keep schedules in Redis with EventMQ's key layout instead of the data directory
        /// (e.g. `redis://127.0.0.1:6379/0`).
        redis: Optional<Plain<String>>, env "EMQ_SCHEDULER_REDIS";
        /// Keep schedules in a NATS JetStream key-value bucket instead of the data directory:
        /// the cluster's URLs (`nats://host:4222`, `tls://host:4222`). Needs `name`; schedulers
        /// with the same name are one active and its standbys (the lease, `nats_lease`).
        nats_urls: Many<NatsUrl> = Vec::<String>::new(), env "EMQ_SCHEDULER_NATS_URLS";
        /// The key-value bucket of the NATS store; the lease bucket is `<bucket>_leases`.
        nats_bucket: StoreName = limits::SCHEDULER_NATS_BUCKET, env "EMQ_SCHEDULER_NATS_BUCKET";
        /// Copies JetStream keeps of the buckets (1 to 5; 3 survives one server's loss).
        nats_replicas: Replicas = limits::NATS_REPLICAS, env "EMQ_SCHEDULER_NATS_REPLICAS";
        /// The active scheduler's hold on its name: renewed every third of it; a standby
        /// takes over at most this long after the active one's last renewal (e.g. `10s`).
        nats_lease: Period = limits::SCHEDULER_NATS_LEASE, env "EMQ_SCHEDULER_NATS_LEASE";
        /// How long one request to the NATS store may take (e.g. `2s`).
        nats_timeout: Period = limits::SCHEDULER_NATS_TIMEOUT, env "EMQ_SCHEDULER_NATS_TIMEOUT";
        /// PEM file of the CA certificates to trust for the NATS servers' TLS certificates.
        nats_tls_ca: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_TLS_CA";
        /// PEM client certificate for mutual TLS with NATS (with `nats_tls_key`).
        nats_tls_cert: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_TLS_CERT";
        /// PEM private key of `nats_tls_cert`.
        nats_tls_key: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_TLS_KEY";
        /// NATS credentials file (a user JWT and NKey seed, `.creds`).
        nats_creds: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_CREDS";
        /// NATS user name (with `nats_password_file`); one kind of credentials at most.
        nats_user: Optional<Plain<String>>, env "EMQ_SCHEDULER_NATS_USER";
        /// File holding `nats_user`'s password (read at start, trimmed; never a flag value).
        nats_password_file: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_PASSWORD_FILE";
        /// File holding a NATS authentication token (read at start, trimmed).
        nats_token_file: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_TOKEN_FILE";
        /// File holding an NKey user seed (`SU...`, read at start, trimmed).
        nats_nkey_file: Optional<Plain<PathBuf>>, env "EMQ_SCHEDULER_NATS_NKEY_FILE";
        /// HEARTBEAT period to the router (must stay under the router's 5 s timeout).
        heartbeat_interval: Period = limits::HEARTBEAT_INTERVAL, env "EMQ_SCHEDULER_HEARTBEAT_INTERVAL";
        /// Router silence after which the scheduler reconnects under a new identity.
        router_timeout: Period = limits::SCHEDULER_ROUTER_TIMEOUT, env "EMQ_SCHEDULER_ROUTER_TIMEOUT";
        /// INFORM re-send period while waiting for the router's ACK.
        inform_retry: Period = limits::SCHEDULER_INFORM_RETRY, env "EMQ_SCHEDULER_INFORM_RETRY";
        /// This scheduler's name among several (1 to 128 printable ASCII characters): the
        /// router gives each schedule to one scheduler by name, so a restarted scheduler owns
        /// the same schedules. Default: a name made at first start and kept in the data
        /// directory.
        name: Optional<Plain<String>>, env "EMQ_SCHEDULER_NAME";
        /// Log filter (`info`, `emq=debug`, `warn`).
        log: LogFilter = limits::LOG, env "EMQ_LOG";
    }
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Socket settings.
    pub peer: PeerConfig,
    /// Embedded store directory; with `redis`, where the scheduler keeps its
    /// name (unless `name` is given). Locked while the scheduler runs.
    pub data_dir: PathBuf,
    /// Cron time zone.
    pub tz: Tz,
    /// Redis URL, if Redis is the store.
    pub redis: Option<String>,
    /// The NATS store and lease, if NATS is the store.
    pub nats: Option<NatsSettings>,
    /// Log filter.
    pub log: String,
}

/// Checks a scheduler name: 1 to [`limits::MAX_SCHEDULER_NAME_BYTES`]
/// printable ASCII characters (no spaces).
///
/// # Errors
/// [`ConfigError::Invalid`] saying what is wrong.
pub fn check_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= limits::MAX_SCHEDULER_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        let why = format!("{name:?}: 1 to {} printable ASCII characters, no spaces", limits::MAX_SCHEDULER_NAME_BYTES);
        Err(ConfigError::Invalid { name: "name", why })
    }
}

/// The commented default configuration of emq-scheduler.
pub const SCHEDULER_TOML: &str = include_str!("scheduler.toml");

impl RawSchedulerConfig {
    /// Validates into a [`SchedulerConfig`], defaults applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting: bad durations, unknown
    /// time zone, a heartbeat not shorter than the router timeout, a bad
    /// name.
    pub fn validate(self) -> Result<SchedulerConfig, ConfigError> {
        let s = self.build()?;
        if s.heartbeat_interval >= s.router_timeout {
            return Err(ConfigError::Invalid {
                name: "heartbeat_interval",
                why: "must be shorter than router_timeout".into(),
            });
        }
        let tz: Tz = s.timezone.parse().map_err(|_| ConfigError::Invalid {
            name: "timezone",
            why: format!("unknown IANA time zone {:?} (e.g. UTC, Europe/Berlin)", s.timezone),
        })?;
        if let Some(name) = &s.name {
            check_name(name)?;
        }
        let plain: Vec<PlainListener> =
            s.scheduler_admin.iter().map(|a| PlainListener::new("scheduler_admin", a)).collect();
        check_plain_listeners(&plain, s.allow_insecure_remote)?;
        let nats = if s.nats_urls.is_empty() {
            None
        } else {
            if s.redis.is_some() {
                let why = "give one store: redis or nats_urls".to_string();
                return Err(ConfigError::Invalid { name: "nats_urls", why });
            }
            let Some(name) = s.name.clone() else {
                let why = "the NATS store needs the scheduler's name (--name, EMQ_SCHEDULER_NAME): an active \
                           scheduler and its standbys share it"
                    .to_string();
                return Err(ConfigError::Invalid { name: "name", why });
            };
            if s.nats_lease < limits::SCHEDULER_NATS_MIN_LEASE {
                let why = format!("{:?} is below {:?}", s.nats_lease, limits::SCHEDULER_NATS_MIN_LEASE);
                return Err(ConfigError::Invalid { name: "nats_lease", why });
            }
            if s.nats_timeout * 2 > s.nats_lease {
                let why = format!(
                    "{:?} is more than half of nats_lease ({:?}): a renewal could not be tried twice in a lease",
                    s.nats_timeout, s.nats_lease
                );
                return Err(ConfigError::Invalid { name: "nats_timeout", why });
            }
            let settings = NatsSettings {
                urls: s.nats_urls,
                bucket: s.nats_bucket,
                replicas: s.nats_replicas,
                lease: s.nats_lease,
                timeout: s.nats_timeout,
                security: NatsSecurity {
                    tls_ca: s.nats_tls_ca,
                    tls_cert: s.nats_tls_cert,
                    tls_key: s.nats_tls_key,
                    creds: s.nats_creds,
                    user: s.nats_user,
                    password_file: s.nats_password_file,
                    token_file: s.nats_token_file,
                    nkey_file: s.nats_nkey_file,
                },
                name,
            };
            crate::jslog::connect::check(&settings.bridge_config())?;
            Some(settings)
        };
        if s.frontend.owners().len() > 1 {
            // One DEALER to several names would register with one and
            // heartbeat them all in turn (docs/scaleout.md).
            let why = format!(
                "{:?} names {} router names (owners, separated by ;): a scheduler serves one; run one per owner",
                s.frontend.to_list_string(),
                s.frontend.owners().len()
            );
            return Err(ConfigError::Invalid { name: "frontend", why });
        }
        let router_curve =
            ClientCurve::from_settings(s.curve_key_file.as_deref(), s.curve_server_key.as_deref(), s.frontend.len())
                .map_err(|e| ConfigError::Invalid { name: "curve_key_file", why: e.to_string() })?;
        let admin_curve = match s.scheduler_admin_curve {
            None => None,
            Some(addr) => Some(admin_curve(addr, s.curve_secret_key_file, s.curve_admins_dir)?),
        };
        Ok(SchedulerConfig {
            peer: PeerConfig {
                router_addr: s.frontend.join(","),
                admin_addr: s.scheduler_admin,
                admin_curve,
                router_curve,
                heartbeat_interval: s.heartbeat_interval,
                router_timeout: s.router_timeout,
                inform_retry: s.inform_retry,
                name: s.name,
            },
            data_dir: s.data_dir.unwrap_or_else(default_data_dir),
            tz,
            redis: s.redis,
            nats,
            log: s.log,
        })
    }
}

/// Reads the key file and the allow-list of `scheduler_admin_curve`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting: no CURVE in libzmq, a
/// missing setting, a key file or directory that cannot be used.
fn admin_curve(addr: String, key_file: Option<PathBuf>, dir: Option<PathBuf>) -> Result<AdminCurve, ConfigError> {
    let invalid = |name: &'static str| move |why: String| ConfigError::Invalid { name, why };
    curve::require_curve().map_err(|e| invalid("scheduler_admin_curve")(e.to_string()))?;
    let key_file = key_file.ok_or_else(|| {
        invalid("scheduler_admin_curve")("needs curve_secret_key_file (the scheduler's .key_secret)".into())
    })?;
    let dir = dir.ok_or_else(|| {
        invalid("scheduler_admin_curve")("needs curve_admins_dir (the allow-list directory of *.key files)".into())
    })?;
    let pair = curve::read_secret_key_file(&key_file).map_err(|e| invalid("curve_secret_key_file")(e.to_string()))?;
    let admins = curve::read_allow_list(&dir).map_err(|e| invalid("curve_admins_dir")(e.to_string()))?;
    Ok(AdminCurve { addr, secret: pair.secret, admins })
}

/// `$XDG_STATE_HOME/emq-scheduler`, else `$HOME/.local/state/emq-scheduler`,
/// else `./emq-scheduler-data`.
pub fn default_data_dir() -> PathBuf {
    let nonempty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(state) = nonempty("XDG_STATE_HOME") {
        return state.join("emq-scheduler");
    }
    if let Some(home) = nonempty("HOME") {
        return home.join(".local/state/emq-scheduler");
    }
    PathBuf::from("emq-scheduler-data")
}

crate::config::table::program!(RawSchedulerConfig => SchedulerConfig, SCHEDULER_TOML, RawSchedulerConfig::validate);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_matches_the_table() {
        let problems = crate::config::template::problems::<RawSchedulerConfig>(SCHEDULER_TOML);
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn old_names_still_work() {
        let vars = |name: &str| (name == "EMQ_SCHEDULER_ROUTER_ADDR").then(|| "tcp://127.0.0.1:9".into());
        let old = RawSchedulerConfig::from_env(&vars).unwrap();
        assert_eq!(old.validate().unwrap().peer.router_addr, "tcp://127.0.0.1:9");
        let flags = RawSchedulerConfig { admin_addr: Some("off".into()), ..Default::default() };
        assert_eq!(flags.or(RawSchedulerConfig::default()).validate().unwrap().peer.admin_addr, None);
    }

    #[test]
    fn bad_values_name_the_setting() {
        let message = |raw: RawSchedulerConfig| raw.validate().unwrap_err().to_string();
        let raw = RawSchedulerConfig { timezone: Some("Mars/Base".into()), ..Default::default() };
        assert!(message(raw).starts_with("setting timezone: unknown IANA time zone \"Mars/Base\""));
        let raw = RawSchedulerConfig { heartbeat_interval: Some("20s".into()), ..Default::default() };
        assert_eq!(message(raw), "setting heartbeat_interval: must be shorter than router_timeout");
        let raw = RawSchedulerConfig { frontend: Some("localhost:47291".into()), ..Default::default() };
        assert!(message(raw).contains("eMQP addresses look like tcp://host:port"));
        let raw = RawSchedulerConfig { frontend: Some("tcp://a:1;tcp://b:1".into()), ..Default::default() };
        let text = message(raw);
        assert!(text.contains("a scheduler serves one; run one per owner"), "{text}");
        let nats = |extra: RawSchedulerConfig| RawSchedulerConfig {
            nats_urls: Some(vec!["nats://127.0.0.1:4222".into()]),
            ..extra
        };
        let named = || RawSchedulerConfig { name: Some("a".into()), ..Default::default() };
        assert!(message(nats(RawSchedulerConfig::default())).starts_with("setting name: the NATS store needs"));
        let both = RawSchedulerConfig { redis: Some("redis://127.0.0.1/0".into()), ..named() };
        assert_eq!(message(nats(both)), "setting nats_urls: give one store: redis or nats_urls");
        let slow = RawSchedulerConfig { nats_timeout: Some("6s".into()), ..named() };
        assert!(message(nats(slow)).starts_with("setting nats_timeout: 6s is more than half of nats_lease"));
        let ok = nats(named()).validate().unwrap().nats.unwrap();
        assert_eq!((ok.bucket.as_str(), ok.replicas, ok.lease), ("emq_schedules", 3, limits::SCHEDULER_NATS_LEASE));
        let raw = RawSchedulerConfig { name: Some("two words".into()), ..Default::default() };
        assert!(message(raw).starts_with("setting name: \"two words\": 1 to 128 printable ASCII characters"));
    }
}
