//! `emq-pubsub`'s settings: one table ([`RawPubSubConfig`]), its typed
//! result ([`PubSubSettings`]) and its commented defaults ([`PUBSUB_TOML`]).

use std::path::{Path, PathBuf};

use super::exposure::{check_plain_listeners, PlainListener};
use super::kinds::{AtLeastOne, EmqpAddr, EmqpAddrOrOff, LogFilter, Optional, Plain, Switch};
use super::table::{settings, Settings};
use super::ConfigError;
use crate::curve;
use crate::curve::zap::AllowList;
use crate::curve::Key;
use crate::limits;

settings! {
    /// emq-pubsub's settings as flags, `EMQ_*` variables and the TOML file
    /// give them.
    pub struct RawPubSubConfig => PubSubSettings {
        /// Incoming address to bind (publishers, `emq-cli publish`).
        pubsub_in: EmqpAddr = limits::PUBSUB_IN_ADDR, env "EMQ_PUBSUB_IN_ADDR", was r#in "EMQ_PUBSUB_IN";
        /// Outgoing PUB address to bind (subscribers).
        pubsub_out: EmqpAddr = limits::PUBSUB_OUT_ADDR, env "EMQ_PUBSUB_OUT_ADDR", was out "EMQ_PUBSUB_OUT";
        /// Allow `pubsub_in` and `pubsub_out` on a non-loopback address
        /// (they are plain: no encryption, no authentication); each is
        /// named in a warning at start (docs/security.md, "Safe default").
        allow_insecure_remote: Switch = false, env "EMQ_ALLOW_INSECURE_REMOTE";
        /// Messages queued per subscriber (ZeroMQ send high-water mark);
        /// past it a slow subscriber misses messages.
        pubsub_hwm => hwm: AtLeastOne = limits::PUBSUB_HWM, env "EMQ_PUBSUB_HWM";
        /// Largest PUBLISH taken (topic and message); a larger one is
        /// dropped and counted.
        pubsub_max_message_bytes => max_message_bytes: AtLeastOne = limits::MAX_MESSAGE_BYTES, env "EMQ_PUBSUB_MAX_MESSAGE_BYTES";
        /// Log filter (`info`, `warn`).
        log: LogFilter = limits::LOG, env "EMQ_LOG";
        /// CURVE address for publishers to bind besides `pubsub_in` (same socket; ZAP domain
        /// `publishers`, allow-list `curve_publishers_dir`), or `off`.
        pubsub_in_curve: EmqpAddrOrOff = "off", env "EMQ_PUBSUB_IN_CURVE";
        /// CURVE address for subscribers to bind besides `pubsub_out` (same socket; ZAP domain
        /// `subscribers`, allow-list `curve_subscribers_dir`), or `off`.
        pubsub_out_curve: EmqpAddrOrOff = "off", env "EMQ_PUBSUB_OUT_CURVE";
        /// The device's secret key file (`NAME.key_secret`, czmq/pyzmq format, mode 0600 or
        /// stricter); needed by either `*_curve` address.
        curve_secret_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_SECRET_KEY_FILE";
        /// Directory of the `*.key` files of publishers allowed on `pubsub_in_curve`.
        curve_publishers_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_PUBLISHERS_DIR";
        /// Directory of the `*.key` files of subscribers allowed on `pubsub_out_curve`.
        curve_subscribers_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_SUBSCRIBERS_DIR";
    }
}

/// The commented default configuration of emq-pubsub.
pub const PUBSUB_TOML: &str = include_str!("pubsub.toml");

impl RawPubSubConfig {
    /// Validates into [`PubSubSettings`], defaults applied.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(self) -> Result<PubSubSettings, ConfigError> {
        let s = self.build()?;
        let plain = [PlainListener::new("pubsub_in", &s.pubsub_in), PlainListener::new("pubsub_out", &s.pubsub_out)];
        check_plain_listeners(&plain, s.allow_insecure_remote)?;
        Ok(s)
    }
}

/// The device's CURVE endpoints (settings `pubsub_in_curve`,
/// `pubsub_out_curve`; docs/security.md "CURVE"): each is a second, CURVE
/// bind on the same socket as the plain address, served by the device's
/// own ZAP handler with its allow-list (public key → user id).
#[derive(Clone, Default)]
pub struct PubSubCurve {
    /// The device's secret key.
    pub secret: Key,
    /// The publishers' CURVE address and allow-list, if any.
    pub publishers: Option<(String, AllowList)>,
    /// The subscribers' CURVE address and allow-list, if any.
    pub subscribers: Option<(String, AllowList)>,
}

/// Reads the key file and allow-lists of `pubsub_in_curve` /
/// `pubsub_out_curve`; `Ok(None)` when both are `off`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting: no CURVE in libzmq, a
/// missing key file or directory, one that cannot be used.
pub fn curve_settings(s: &PubSubSettings) -> Result<Option<PubSubCurve>, ConfigError> {
    if s.pubsub_in_curve.is_none() && s.pubsub_out_curve.is_none() {
        return Ok(None);
    }
    let first = if s.pubsub_in_curve.is_some() { "pubsub_in_curve" } else { "pubsub_out_curve" };
    curve::require_curve().map_err(|e| ConfigError::Invalid { name: first, why: e.to_string() })?;
    let Some(key_file) = &s.curve_secret_key_file else {
        let why = "needs curve_secret_key_file (the device's .key_secret)".to_string();
        return Err(ConfigError::Invalid { name: first, why });
    };
    let pair = curve::read_secret_key_file(key_file)
        .map_err(|e| ConfigError::Invalid { name: "curve_secret_key_file", why: e.to_string() })?;
    let endpoint = |addr: &Option<String>, setting, dir: &Option<PathBuf>, dir_setting| match addr {
        None => Ok(None),
        Some(a) => allow_list(setting, dir.as_deref(), dir_setting).map(|keys| Some((a.clone(), keys))),
    };
    Ok(Some(PubSubCurve {
        secret: pair.secret,
        publishers: endpoint(&s.pubsub_in_curve, "pubsub_in_curve", &s.curve_publishers_dir, "curve_publishers_dir")?,
        subscribers: endpoint(
            &s.pubsub_out_curve,
            "pubsub_out_curve",
            &s.curve_subscribers_dir,
            "curve_subscribers_dir",
        )?,
    }))
}

fn allow_list(setting: &'static str, dir: Option<&Path>, dir_setting: &'static str) -> Result<AllowList, ConfigError> {
    let Some(dir) = dir else {
        let why = format!("needs {dir_setting} (the allow-list directory of *.key files)");
        return Err(ConfigError::Invalid { name: setting, why });
    };
    curve::read_allow_list(dir).map_err(|e| ConfigError::Invalid { name: dir_setting, why: e.to_string() })
}

super::table::program!(RawPubSubConfig => PubSubSettings, PUBSUB_TOML, RawPubSubConfig::validate);

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn default_toml_matches_the_table() {
        assert_eq!(super::super::template::problems::<RawPubSubConfig>(PUBSUB_TOML), Vec::<String>::new());
    }

    #[test]
    fn old_flags_in_and_out_still_work() {
        #[derive(Parser)]
        struct Args {
            #[command(flatten)]
            raw: RawPubSubConfig,
        }
        let args =
            Args::try_parse_from(["emq-pubsub", "--in", "tcp://*:1", "--out", "tcp://*:2", "--allow-insecure-remote"])
                .unwrap();
        let s = args.raw.or(RawPubSubConfig::default()).validate().unwrap();
        assert_eq!((s.pubsub_in.as_str(), s.pubsub_out.as_str()), ("tcp://*:1", "tcp://*:2"));
        let vars = |name: &str| match name {
            "EMQ_PUBSUB_IN" => Some("tcp://*:3".into()),
            "EMQ_ALLOW_INSECURE_REMOTE" => Some("true".into()),
            _ => None,
        };
        assert_eq!(RawPubSubConfig::from_env(&vars).unwrap().validate().unwrap().pubsub_in, "tcp://*:3");
    }
}
