//! Per-queue policy: what a queue's jobs get (their time limit, their
//! retries, the queue's limits), resolved once from the router's settings
//! into one typed table the shards hold ([`QueuePolicies`]).
//!
//! Every queue gets the router-wide settings (`job_timeout`, `max_retries`,
//! `max_queue_len`, `max_queue_bytes`); the setting `queues` overrides them
//! for named queues, as a JSON object of queue → object of settings:
//!
//! ```text
//! queues = '{"reports": {"job_timeout": "2h", "max_retries": 10}, "email": {"max_queue_len": 1000}}'
//! ```
//!
//! A per-queue setting is declared once: a field of [`QueuePolicy`] (its
//! type checks its value, its doc is its help), its router-wide default in
//! [`QueuePolicy::router_wide`], its consumer in the shard, and its line in
//! docs/configuration.md. The older `job_timeouts` (queue → duration)
//! still works and feeds the same table.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::FastMap;
use crate::limits;

/// One queue's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuePolicy {
    /// Time limit of a job on an eMQP worker without a `timeout:N` header
    /// (`"0s"` / `None`: none); past it, plus 5 s, the job is taken back.
    #[serde(with = "limit_text")]
    pub job_timeout: Option<Duration>,
    /// Retries of a job (failed, past its deadline, its worker lost) before
    /// it goes to the dead set; a `retry:N` header overrides it (at most
    /// [`limits::MAX_RETRIES_HEADER`]).
    #[serde(deserialize_with = "retries")]
    pub max_retries: u32,
    /// Most waiting jobs in the queue; past it `QUEUE_FULL`.
    pub max_queue_len: NonZeroUsize,
    /// Most waiting bytes in the queue (job frames as held); past it
    /// `QUEUE_FULL`.
    pub max_queue_bytes: NonZeroUsize,
}

impl QueuePolicy {
    /// The router-wide policy: every queue's unless `queues` says otherwise.
    pub fn router_wide(c: &super::RouterConfig) -> QueuePolicy {
        QueuePolicy {
            job_timeout: c.job_timeout,
            max_retries: c.max_retries,
            max_queue_len: NonZeroUsize::new(c.max_queue_len).unwrap_or(NonZeroUsize::MIN),
            max_queue_bytes: NonZeroUsize::new(c.max_queue_bytes).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// Every queue's policy (see the module docs). Looking one up costs no hash
/// when no queue has its own.
#[derive(Debug, Clone)]
pub struct QueuePolicies {
    default: QueuePolicy,
    by_name: FastMap<Vec<u8>, QueuePolicy>,
}

impl QueuePolicies {
    /// The policies of a router with `config`'s settings.
    ///
    /// # Errors
    /// A setting of `queues` that does not check, or a queue whose time
    /// limit both `queues` and `job_timeouts` set.
    pub fn new(config: &super::RouterConfig) -> Result<QueuePolicies, String> {
        let default = QueuePolicy::router_wide(config);
        let mut by_name: FastMap<Vec<u8>, QueuePolicy> = FastMap::default();
        for (queue, overrides) in &config.queues {
            let policy = with_overrides(&default, overrides).map_err(|e| format!("queue {queue}: {e}"))?;
            by_name.insert(queue.as_bytes().to_vec(), policy);
        }
        for (queue, limit) in &config.job_timeouts {
            if config.queues.get(queue).is_some_and(|o| o.contains_key("job_timeout")) {
                return Err(format!("queue {queue}: job_timeout set in both queues and job_timeouts; set it once"));
            }
            by_name.entry(queue.as_bytes().to_vec()).or_insert_with(|| default.clone()).job_timeout = *limit;
        }
        Ok(QueuePolicies { default, by_name })
    }

    /// The router-wide policy for every queue (what [`QueuePolicies::new`]
    /// falls back to for a configuration it refuses).
    pub fn router_wide(config: &super::RouterConfig) -> QueuePolicies {
        QueuePolicies { default: QueuePolicy::router_wide(config), by_name: FastMap::default() }
    }

    /// The policy of `queue`.
    pub fn of(&self, queue: &[u8]) -> &QueuePolicy {
        if self.by_name.is_empty() {
            return &self.default;
        }
        self.by_name.get(queue).unwrap_or(&self.default)
    }
}

/// `default` with the settings of `overrides` (a JSON object) in place.
fn with_overrides(
    default: &QueuePolicy,
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> Result<QueuePolicy, String> {
    let merged = match serde_json::to_value(default) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err("the router-wide policy is not an object".into()),
    };
    // Each setting alone first, so an error names the setting and says
    // what it takes in words, not in Rust's types.
    for (key, value) in overrides {
        if !merged.contains_key(key) {
            let known: Vec<&str> = merged.keys().map(String::as_str).collect();
            return Err(format!("unknown setting {key:?}; a queue's settings are {}", known.join(", ")));
        }
        let takes = takes(key).unwrap_or_else(|| "a value it takes (docs/configuration.md)".to_string());
        let mut one = merged.clone();
        one.insert(key.clone(), value.clone());
        if let Err(e) = serde_json::from_value::<QueuePolicy>(serde_json::Value::Object(one)) {
            return Err(format!("setting {key}: {value} is not {takes} ({e})"));
        }
    }
    let mut all = merged;
    all.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
    serde_json::from_value(serde_json::Value::Object(all)).map_err(|e| e.to_string())
}

/// What per-queue setting `key` takes, in words, for its error (`None`:
/// a setting without words here gets a general phrase).
fn takes(key: &str) -> Option<String> {
    Some(match key {
        "job_timeout" => "a duration such as \"30s\" or \"5m\" (\"0s\": no limit)".to_string(),
        "max_retries" => format!("a whole number from 0 to {}", limits::MAX_RETRIES_HEADER),
        "max_queue_len" => "a whole number of jobs from 1 up".to_string(),
        "max_queue_bytes" => "a whole number of bytes from 1 up".to_string(),
        _ => return None,
    })
}

/// A JSON object read key by key, duplicates kept (serde's maps keep the
/// last silently), each value as it came.
struct Pairs<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Visit<V> {
            type Value = Pairs<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Pairs<V>, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, V>()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// `pairs` as a map, refused when a key comes twice (`what` names whose).
fn unique<V>(pairs: Pairs<V>, what: &str) -> Result<BTreeMap<String, V>, String> {
    let mut map = BTreeMap::new();
    for (key, value) in pairs.0 {
        if map.insert(key.clone(), value).is_some() {
            return Err(format!("{what}{key:?} is given twice; give it once"));
        }
    }
    Ok(map)
}

/// The value of the setting `queues`: queue → its settings, in name order.
pub type QueueOverrides = BTreeMap<String, serde_json::Map<String, serde_json::Value>>;

/// `queues`: a JSON object of queue names (checked, at most
/// [`limits::MAX_QUEUE_POLICIES`]) to objects of per-queue settings. Each
/// setting's value is checked against the router-wide ones by
/// [`QueuePolicies::new`] (in `RawRouterConfig::validate`).
pub struct QueuesKind;

impl super::Kind for QueuesKind {
    type Raw = String;
    type Value = QueueOverrides;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(json: String) -> Result<QueueOverrides, String> {
        let pairs: Pairs<Pairs<serde_json::Value>> = serde_json::from_str(&json)
            .map_err(|e| format!("{json:?} is not a JSON object of queue names and objects of settings: {e}"))?;
        let mut table = QueueOverrides::new();
        for (queue, settings) in unique(pairs, "queue ")? {
            let settings = unique(settings, &format!("queue {queue}: setting "))?;
            table.insert(queue, settings.into_iter().collect());
        }
        if table.len() > limits::MAX_QUEUE_POLICIES {
            return Err(format!(
                "{} queues; at most {} may have settings of their own",
                table.len(),
                limits::MAX_QUEUE_POLICIES
            ));
        }
        for queue in table.keys() {
            crate::protocol::queues::check_queue_name(queue)?;
        }
        Ok(table)
    }
}

/// A retry count: at most [`limits::MAX_RETRIES_HEADER`].
fn retries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if n > limits::MAX_RETRIES_HEADER {
        return Err(serde::de::Error::custom(format!("max_retries {n}: at most {}", limits::MAX_RETRIES_HEADER)));
    }
    Ok(n)
}

/// A time limit as text (`"30s"`, `"2h"`; `"0s"`: none).
mod limit_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(limit: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(limit.unwrap_or_default()).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        let limit = crate::config::kinds::DurationText(text).parse().map_err(serde::de::Error::custom)?;
        Ok((!limit.is_zero()).then_some(limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Kind;

    fn config(queues: &str, job_timeouts: &str) -> Result<crate::config::RouterConfig, crate::config::ConfigError> {
        let raw = crate::config::RawRouterConfig {
            queues: Some(queues.into()),
            job_timeouts: Some(job_timeouts.into()),
            max_retries: Some(3),
            ..Default::default()
        };
        raw.validate()
    }

    #[test]
    fn a_queue_gets_its_settings_and_the_router_wide_ones_for_the_rest() {
        let c = config(r#"{"reports": {"job_timeout": "2h", "max_retries": 10}, "mail": {"max_queue_len": 5}}"#, "{}")
            .expect("valid");
        let p = QueuePolicies::new(&c).expect("policies");
        let reports = p.of(b"reports");
        assert_eq!((reports.job_timeout, reports.max_retries), (Some(Duration::from_secs(7200)), 10));
        assert_eq!(reports.max_queue_len.get(), limits::MAX_QUEUE_LEN, "not given: router-wide");
        assert_eq!((p.of(b"mail").max_queue_len.get(), p.of(b"mail").max_retries), (5, 3));
        assert_eq!(p.of(b"other"), &QueuePolicy::router_wide(&c));
        let off = config(r#"{"free": {"job_timeout": "0s"}}"#, "{}").expect("valid");
        assert_eq!(QueuePolicies::new(&off).expect("policies").of(b"free").job_timeout, None);
    }

    #[test]
    fn job_timeouts_feed_the_table_and_a_limit_is_set_once() {
        let c = config(r#"{"a": {"max_retries": 1}}"#, r#"{"a": "10s", "b": "0s"}"#).expect("valid");
        let p = QueuePolicies::new(&c).expect("policies");
        assert_eq!((p.of(b"a").job_timeout, p.of(b"a").max_retries), (Some(Duration::from_secs(10)), 1));
        assert_eq!(p.of(b"b").job_timeout, None);
        let err = config(r#"{"a": {"job_timeout": "1s"}}"#, r#"{"a": "10s"}"#).unwrap_err();
        assert!(err.to_string().contains("set it once"), "{err}");
    }

    #[test]
    fn bad_settings_are_refused_naming_the_queue_and_the_setting() {
        for (json, part) in [
            (r#"{"q": {"max_retries": 51}}"#, "max_retries 51: at most 50"),
            (r#"{"q": {"max_queue_len": 0}}"#, "queue q"),
            (
                r#"{"q": {"retries": 1}}"#,
                "unknown setting \"retries\"; a queue's settings are job_timeout, max_retries",
            ),
            (r#"{"q": {"job_timeout": "soon"}}"#, "queue q"),
            (r#"{"bad name!": {}}"#, "bad name!"),
            (r#"["q"]"#, "not a JSON object"),
            (r#"{"a": {"max_retries": 3}, "a": {"max_retries": 0}}"#, "queue \"a\" is given twice; give it once"),
            (r#"{"a": {"max_retries": 3, "max_retries": 0}}"#, "queue a: setting \"max_retries\" is given twice"),
            (r#"{"a": {"max_retries": -1}}"#, "queue a: setting max_retries: -1 is not a whole number from 0 to 50"),
            (
                r#"{"a": {"max_queue_len": 0}}"#,
                "queue a: setting max_queue_len: 0 is not a whole number of jobs from 1",
            ),
            (r#"{"a": {"max_queue_bytes": 1e20}}"#, "setting max_queue_bytes: 1e+20 is not a whole number of bytes"),
            (r#"{"a": {"job_timeout": 5}}"#, "queue a: setting job_timeout: 5 is not a duration such as \"30s\""),
        ] {
            let err = config(json, "{}").unwrap_err().to_string();
            assert!(err.contains(part) && err.contains("queues"), "{json}: {err}");
        }
        let many: serde_json::Map<String, serde_json::Value> =
            (0..=limits::MAX_QUEUE_POLICIES).map(|i| (format!("q{i}"), serde_json::json!({}))).collect();
        let err = QueuesKind::check(serde_json::Value::Object(many).to_string()).unwrap_err();
        assert!(err.contains("at most"), "{err}");
    }

    /// docs/configuration.md names every per-queue setting.
    #[test]
    fn the_configuration_page_names_every_per_queue_setting() {
        let page = include_str!("../../docs/configuration.md");
        let policy = serde_json::to_value(QueuePolicy::router_wide(&crate::config::RouterConfig::default()));
        let Ok(serde_json::Value::Object(fields)) = policy else { panic!("a policy is an object") };
        let missing: Vec<&String> = fields.keys().filter(|k| !page.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty(), "{missing:?}");
        let section = page.split("### Per-queue settings").nth(1).expect("the section");
        assert!(fields.keys().all(|k| section.contains(&format!("`{k}`"))), "each in \"Per-queue settings\"");
    }
}
