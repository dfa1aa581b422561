//! emq-scheduler settings in two steps: raw flags / `EMQ_SCHEDULER_*`
//! environment variables ([`SchedulerArgs`], flags win), then one validated
//! [`SchedulerConfig`].
//!
//! The data directory defaults to `$XDG_STATE_HOME/emq-scheduler`, else
//! `$HOME/.local/state/emq-scheduler`, else `./emq-scheduler-data`: schedules
//! are state (XDG Base Directory spec), not configuration or cache.

use std::path::PathBuf;
use std::time::Duration;

use chrono_tz::Tz;

use super::peer::PeerConfig;
use crate::config::kinds::DurationText;
use crate::config::ConfigError;
use crate::limits;

/// Raw command-line flags and environment variables.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "emq-scheduler", version, about = "Runs eMQP SCHEDULE jobs (EventMQ 0.3.13 compatible scheduler)")]
pub struct SchedulerArgs {
    /// The router frontend to connect to.
    #[arg(long, env = "EMQ_SCHEDULER_ROUTER_ADDR", default_value = limits::FRONTEND_ADDR)]
    pub router_addr: String,
    /// The scheduler's own admin socket (ROUTER, answers SCHEDULES), or `off`.
    #[arg(long, env = "EMQ_SCHEDULER_ADMIN_ADDR", default_value = limits::SCHEDULER_ADMIN_ADDR)]
    pub admin_addr: String,
    /// Directory of the embedded schedule store, and of the scheduler's name
    /// (default: XDG state dir). One scheduler per directory.
    #[arg(long, env = "EMQ_SCHEDULER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// IANA time zone cron expressions are evaluated in (e.g. `Europe/Berlin`).
    #[arg(long, env = "EMQ_SCHEDULER_TIMEZONE", default_value = limits::SCHEDULER_TIMEZONE)]
    pub timezone: String,
    /// Store schedules in Redis with EventMQ's key layout instead of the data
    /// directory (e.g. `redis://127.0.0.1:6379/0`).
    #[arg(long, env = "EMQ_SCHEDULER_REDIS")]
    pub redis: Option<String>,
    /// HEARTBEAT period to the router (must stay under the router's 5 s timeout).
    #[arg(long, env = "EMQ_SCHEDULER_HEARTBEAT_INTERVAL", default_value_t = text(limits::HEARTBEAT_INTERVAL))]
    pub heartbeat_interval: String,
    /// Router silence after which the scheduler reconnects under a new identity.
    #[arg(long, env = "EMQ_SCHEDULER_ROUTER_TIMEOUT", default_value_t = text(limits::SCHEDULER_ROUTER_TIMEOUT))]
    pub router_timeout: String,
    /// INFORM re-send period while waiting for the router's ACK.
    #[arg(long, env = "EMQ_SCHEDULER_INFORM_RETRY", default_value_t = text(limits::SCHEDULER_INFORM_RETRY))]
    pub inform_retry: String,
    /// This scheduler's name among several (1 to 128 printable ASCII
    /// characters): the router routes each schedule to one scheduler by
    /// name, so a restarted scheduler owns the same schedules. Default: a
    /// name made at first start and kept in the data directory (file
    /// store), or a new one per run (Redis store).
    #[arg(long, env = "EMQ_SCHEDULER_NAME")]
    pub name: Option<String>,
    /// Print the resolved configuration and exit.
    #[arg(long)]
    pub print_config: bool,
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

impl SchedulerConfig {
    /// Validates raw settings.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting: bad durations, unknown
    /// time zone, a heartbeat not shorter than the router timeout.
    pub fn from_args(args: &SchedulerArgs) -> Result<SchedulerConfig, ConfigError> {
        let heartbeat_interval = duration("heartbeat_interval", &args.heartbeat_interval)?;
        let router_timeout = duration("router_timeout", &args.router_timeout)?;
        let inform_retry = duration("inform_retry", &args.inform_retry)?;
        if heartbeat_interval >= router_timeout {
            return Err(ConfigError::Invalid {
                name: "heartbeat_interval",
                why: "must be shorter than router_timeout".into(),
            });
        }
        let tz: Tz = args.timezone.parse().map_err(|_| ConfigError::Invalid {
            name: "timezone",
            why: format!("unknown IANA time zone {:?}", args.timezone),
        })?;
        let admin_addr = (args.admin_addr != "off").then(|| args.admin_addr.clone());
        if let Some(name) = &args.name {
            check_name(name)?;
        }
        Ok(SchedulerConfig {
            peer: PeerConfig {
                router_addr: args.router_addr.clone(),
                admin_addr,
                heartbeat_interval,
                router_timeout,
                inform_retry,
                name: args.name.clone(),
            },
            data_dir: args.data_dir.clone().unwrap_or_else(default_data_dir),
            tz,
            redis: args.redis.clone(),
        })
    }

    /// The settings as `name = value` lines (for `--print-config`).
    pub fn render(&self) -> String {
        let p = &self.peer;
        format!(
            "router_addr = {:?}\nadmin_addr = {:?}\ndata_dir = {:?}\ntimezone = {:?}\nredis = {:?}\n\
             heartbeat_interval = {:?}\nrouter_timeout = {:?}\ninform_retry = {:?}\nname = {:?}\n",
            p.router_addr,
            p.admin_addr.as_deref().unwrap_or("off"),
            self.data_dir.display().to_string(),
            self.tz.name(),
            self.redis.as_deref().unwrap_or("off"),
            humantime::format_duration(p.heartbeat_interval).to_string(),
            humantime::format_duration(p.router_timeout).to_string(),
            humantime::format_duration(p.inform_retry).to_string(),
            p.name.as_deref().unwrap_or("(default)"),
        )
    }
}

/// A default duration as the flags write it (`15s`).
fn text(default: Duration) -> String {
    DurationText::from(default).0
}

fn duration(name: &'static str, text: &str) -> Result<Duration, ConfigError> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(ConfigError::Invalid { name, why: "must be more than 0".into() }),
        Err(e) => Err(ConfigError::Invalid { name, why: format!("{text:?}: {e}") }),
    }
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
