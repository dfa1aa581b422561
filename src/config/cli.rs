//! `emq-cli`'s settings: one table ([`RawCliConfig`]), its typed result
//! ([`CliSettings`]) and its commented defaults ([`CLI_TOML`]). The
//! addresses have the names the router, scheduler and pub/sub device use
//! for the same sockets.

use std::path::PathBuf;

use super::kinds::{EmqpAddr, EmqpAddrs, LogFilter, Optional, Period, Plain, TextOwnerList};
use super::table::{settings, Settings};
use super::ConfigError;
use crate::limits;

settings! {
    /// emq-cli's settings as flags, `EMQ_*` variables and the TOML file give
    /// them.
    pub struct RawCliConfig => CliSettings {
        /// The router's eMQP frontend (request, schedule, unschedule); several separated by commas
        /// for failover (docs/failover.md); several router names separated by `;`: requests go to
        /// them in turn, schedules to the first (docs/scaleout.md).
        frontend: EmqpAddrs = limits::FRONTEND_ADDR, env "EMQ_FRONTEND_ADDR";
        /// The router's admin address (status, workers, schedulers, latency, dead, disconnect);
        /// several separated by commas (the routers of one name, docs/failover.md): `status`
        /// shows each, every other command goes to the one that owns the name. Several router
        /// names separated by `;`: status, workers, latency and dead list show one view over
        /// all (docs/admin.md); the other admin commands take one name.
        admin: EmqpAddrs = limits::ADMIN_ADDR, env "EMQ_ADMIN_ADDR";
        /// The router's text protocol address, host:port (sched, ask); several router names
        /// separated by `;` (sched spreads, ask asks each in turn; docs/scaleout.md), one name's
        /// owner and standby by `,`.
        text: TextOwnerList = limits::TEXT_ADDR, env "EMQ_TEXT_ADDR";
        /// PEM CA certificates: talk TLS to `text` (a router's `text_tls`
        /// listener), trusting these (docs/security.md "Text protocol: TLS and tokens").
        tls_ca: Optional<Plain<PathBuf>>, env "EMQ_TLS_CA";
        /// The name the text server's certificate must carry (default: the host of `text`).
        tls_server_name: Optional<Plain<String>>, env "EMQ_TLS_SERVER_NAME";
        /// PEM client certificate for a `text_tls` listener that requires one (with `tls_key`).
        tls_cert: Optional<Plain<PathBuf>>, env "EMQ_TLS_CERT";
        /// PEM private key of `tls_cert`.
        tls_key: Optional<Plain<PathBuf>>, env "EMQ_TLS_KEY";
        /// File holding a text protocol token (its first line), sent as `AUTH <token>` first.
        token_file: Optional<Plain<PathBuf>>, env "EMQ_TOKEN_FILE";
        /// The scheduler's admin address (schedules).
        scheduler_admin: EmqpAddr = limits::SCHEDULER_ADMIN_ADDR, env "EMQ_SCHEDULER_ADMIN_ADDR";
        /// The pub/sub device's incoming address (publish).
        pubsub_in: EmqpAddr = limits::PUBSUB_IN_ADDR, env "EMQ_PUBSUB_IN_ADDR", was pubsub "EMQ_PUBSUB_ADDR";
        /// Longest wait for a connection and an answer (e.g. `3s`).
        timeout: Period = limits::CLIENT_TIMEOUT, env "EMQ_CLI_TIMEOUT";
        /// Log filter (`warn`; `info` or `emq=debug` for more).
        log: LogFilter = limits::TOOL_LOG, env "EMQ_LOG";
        /// emq-cli's CURVE secret key file (`NAME.key_secret`, mode 0600): the frontend and admin
        /// connections are CURVE clients (with `curve_server_key`; the addresses must be the router's
        /// `frontend_curve` / `admin_curve`).
        curve_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_KEY_FILE";
        /// The router's CURVE public key: 40 Z85 characters or a `.key` file; one for all addresses,
        /// or one per address in the same order, separated by commas.
        curve_server_key: Optional<Plain<String>>, env "EMQ_CURVE_SERVER_KEY";
    }
}

/// The commented default configuration of emq-cli.
pub const CLI_TOML: &str = include_str!("cli.toml");

impl RawCliConfig {
    /// Validates into [`CliSettings`], defaults applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(self) -> Result<CliSettings, ConfigError> {
        let s = self.build()?;
        if s.tls_cert.is_some() != s.tls_key.is_some() {
            return Err(ConfigError::Invalid { name: "tls_cert", why: "tls_cert and tls_key go together".into() });
        }
        if s.tls_cert.is_some() && s.tls_ca.is_none() {
            return Err(ConfigError::Invalid {
                name: "tls_cert",
                why: "a client certificate needs tls_ca (TLS)".into(),
            });
        }
        Ok(s)
    }
}

super::table::program!(RawCliConfig => CliSettings, CLI_TOML, RawCliConfig::validate);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_toml_matches_the_table() {
        assert_eq!(super::super::template::problems::<RawCliConfig>(CLI_TOML), Vec::<String>::new());
    }

    #[test]
    fn misspelled_addresses_show_the_expected_form() {
        let raw = RawCliConfig { admin: Some("127.0.0.1:48303".into()), ..Default::default() };
        let e = raw.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "setting admin: \"127.0.0.1:48303\" is not an eMQP address (no tcp://): \
             eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291"
        );
        let raw = RawCliConfig { text: Some("tcp://127.0.0.1:48304".into()), ..Default::default() };
        let e = raw.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "setting text: \"tcp://127.0.0.1:48304\" is not a text address (no tcp:// here): \
             the text address is host:port, e.g. 127.0.0.1:47294"
        );
    }
}
