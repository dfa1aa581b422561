//! `emq-pubsub`'s settings: one table ([`RawPubSubConfig`]), its typed
//! result ([`PubSubSettings`]) and its commented defaults ([`PUBSUB_TOML`]).

use super::exposure::{check_plain_listeners, PlainListener};
use super::kinds::{AtLeastOne, EmqpAddr, LogFilter, Switch};
use super::table::{settings, Settings};
use super::ConfigError;
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
