//! [`NatsStore`]: schedules in a NATS JetStream key-value bucket, with an
//! active scheduler and standbys per scheduler name ([`super::lease`]).
//!
//! # Layout
//! * Bucket `<nats_bucket>` (default `emq_schedules`, `nats_replicas`
//!   copies, history 1, no expiry): one key per schedule,
//!   `<name>.<schedule key>`, `<name>` being the scheduler's name with every
//!   byte but `A-Z a-z 0-9 - _` written `=XX` (hex; [`name_token`]) and the
//!   schedule key its 40 hex digits (docs/emqp.md "The scheduler"). The
//!   value is JSON, the file store's record ([`super::store`]):
//!   `{"record":[queue,headers,interval,body,cron],"runs_left":N|null,"next_ms":T|null}`.
//!   Like the Redis store, each schedule is written at every run (its next
//!   fire moved) and deleted by an UNSCHEDULE.
//! * Bucket `<nats_bucket>_leases` (max age `nats_lease`): key `<name>`,
//!   the lease ([`super::lease`]).
//!
//! # Across a takeover
//! A scheduler reads the schedules only once it holds the lease, and
//! writes them only while its lease is valid (a write of a scheduler that
//! is not is refused, [`Fence`]). A run is stored **before** it is sent:
//! [`super::service::Service::fire_due`] writes each fired schedule's next
//! fire, then checks the lease again, and only then returns the REQUESTs
//! to send. So a standby that takes over (after the key expired, so after
//! every write the active scheduler made) reads the next fire of the last
//! run sent and never sends that run again. The bound (README "Scheduled
//! jobs"): a schedule fires at most once per period across a takeover, and
//! its longest gap is one period plus `nats_lease` plus
//! [`limits::SCHEDULER_NATS_LEASE_POLL`] plus the new scheduler's
//! registration with the router (the due run fires once at once). Two
//! cases may lose one run instead (a gap of up to two periods): `kill -9`
//! between a run's write and its send, and a lease that lapses while the
//! run is written. A run whose write failed is sent anyway (the store is
//! retried, [`super::service`]); if the scheduler dies before it is
//! stored, the standby sends it again. While the lease is not certainly
//! valid, SCHEDULEs are refused (`STORE_FAILED`: not run, not kept); an
//! UNSCHEDULE is taken in memory and stored when the lease is renewed, and
//! lost if a standby takes over first.
//!
//! # Limits
//! A value is at most [`limits::SCHEDULER_NATS_MAX_VALUE_BYTES`] (a
//! SCHEDULE over it is refused, `TOO_BIG`); a load reads at most
//! [`limits::SCHEDULER_MAX_SCHEDULES`] schedules of a name (more is an
//! error naming the bucket); every request waits at most `nats_timeout`.

use std::time::Duration;

use async_nats::jetstream::consumer::push::OrderedConfig;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::StorageType;
use bytes::Bytes;
use chrono::DateTime;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::key::ScheduleKey;
use super::lease::{self, Lease};
use super::store::{Fence, Reconciled, Store, StoreError, Stored};
use crate::config::NatsConfig;
use crate::jslog::bridge::{retried, Bridge, Ctx};
use crate::jslog::connect::NatsSecurity;
use crate::jslog::owner::open_or_make_bucket;
use crate::limits;

/// The NATS store's settings (the scheduler's `nats_*` settings).
#[derive(Debug, Clone)]
pub struct NatsSettings {
    /// Server URLs of the cluster.
    pub urls: Vec<String>,
    /// The schedules' bucket (the lease bucket is `<bucket>_leases`).
    pub bucket: String,
    /// Copies of each bucket.
    pub replicas: usize,
    /// The lease.
    pub lease: Duration,
    /// Longest wait for one request.
    pub timeout: Duration,
    /// TLS files and credentials.
    pub security: NatsSecurity,
    /// The scheduler's name (its schedules' keys, its lease).
    pub name: String,
}

impl NatsSettings {
    /// The router's NATS settings the bridge takes; the fields of the job
    /// log it does not use for calls are left at their defaults.
    pub(crate) fn bridge_config(&self) -> NatsConfig {
        let NatsSecurity { tls_ca, tls_cert, tls_key, creds, user, password_file, token_file, nkey_file } =
            self.security.clone();
        NatsConfig {
            urls: self.urls.clone(),
            router_name: "scheduler".into(),
            stream_prefix: limits::NATS_STREAM_PREFIX.into(),
            replicas: self.replicas,
            dedup_window: limits::NATS_DEDUP_WINDOW,
            ack_timeout: self.timeout,
            give_up: self.timeout,
            lease: self.lease,
            max_in_flight: limits::NATS_MAX_IN_FLIGHT,
            tls_ca,
            tls_cert,
            tls_key,
            creds,
            user,
            password_file,
            token_file,
            nkey_file,
            standby: false,
        }
    }
}

/// The stored value of a schedule (module docs).
#[derive(Debug, Serialize, Deserialize)]
struct Value {
    record: [String; 5],
    runs_left: Option<u64>,
    #[serde(default)]
    next_ms: Option<i64>,
}

/// `name` as a key token: `A-Z a-z 0-9 - _` kept, every other byte `=XX`.
///
/// ```
/// use emq::scheduler::nats_store::name_token;
/// assert_eq!(name_token("sched-a_1"), "sched-a_1");
/// assert_eq!(name_token("a.b*c=d"), "a=2Eb=2Ac=3Dd");
/// ```
pub fn name_token(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// Schedules in a JetStream bucket, this scheduler holding its name's
/// lease (module docs).
pub struct NatsStore {
    bridge: Bridge,
    kv: kv::Store,
    /// `<name token>.`
    prefix: String,
    timeout: Duration,
    lease: Lease,
    /// The schedules were read once ([`Store::load`]).
    loaded: bool,
}

/// Opens `bucket` (made when missing, tried for `within`).
async fn bucket(
    ctx: Ctx,
    name: String,
    max_age: Duration,
    replicas: usize,
    within: Duration,
) -> Result<kv::Store, String> {
    let config = kv::Config {
        bucket: name.clone(),
        history: 1,
        max_age,
        storage: StorageType::File,
        num_replicas: replicas,
        max_value_size: (limits::SCHEDULER_NATS_MAX_VALUE_BYTES + 1024) as i32,
        ..Default::default()
    };
    retried(&format!("bucket {name}"), within, || open_or_make_bucket(&ctx, config.clone())).await
}

impl NatsStore {
    /// Connects, opens the buckets and takes the name's lease, waiting as a
    /// standby while another scheduler holds it; `Ok(None)` when
    /// `stopping` says stop meanwhile.
    ///
    /// # Errors
    /// [`StoreError::Nats`] when the cluster cannot be reached or the
    /// buckets cannot be opened (tried for 10 × `nats_timeout`).
    pub fn open(settings: &NatsSettings, stopping: impl FnMut() -> bool) -> Result<Option<NatsStore>, StoreError> {
        let bridge = Bridge::start(&settings.bridge_config()).map_err(|e| StoreError::Nats(e.to_string()))?;
        let (name, leases, replicas, lease) =
            (settings.bucket.clone(), format!("{}_leases", settings.bucket), settings.replicas, settings.lease);
        let within = settings.timeout * 10;
        let (kv, leases) = bridge
            .call(move |ctx| async move {
                let kv = bucket(ctx.clone(), name, Duration::ZERO, replicas, within).await?;
                let leases = bucket(ctx, leases, lease, replicas, within).await?;
                Ok::<_, String>((kv, leases))
            })
            .map_err(|e| StoreError::Nats(e.to_string()))?
            .map_err(StoreError::Nats)?;
        let lease = bucket_lease(&leases, settings.lease);
        let token = name_token(&settings.name);
        let holder =
            format!("emq-scheduler {} pid {} {}", settings.name, std::process::id(), uuid::Uuid::new_v4().hyphenated());
        let held = lease::acquire(&bridge, leases, token.clone(), holder, lease, settings.timeout, stopping)?;
        Ok(held.map(|lease| NatsStore {
            bridge,
            kv,
            prefix: format!("{token}."),
            timeout: settings.timeout,
            lease,
            loaded: false,
        }))
    }

    /// Runs a request on the bridge with the store's timeout.
    fn request<T, F, Fut, E>(&self, what: &str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        E: std::fmt::Display,
        F: FnOnce(kv::Store) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
    {
        let (kv, timeout) = (self.kv.clone(), self.timeout);
        let answer = self
            .bridge
            .call(move |_ctx| async move {
                match tokio::time::timeout(timeout, f(kv)).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {timeout:?} (nats_timeout)")),
                }
            })
            .map_err(|e| StoreError::Nats(e.to_string()))?;
        answer.map_err(|e| StoreError::Nats(format!("{what}: {e}")))
    }

    /// Refuses a write while this scheduler may not write (its lease).
    fn writable(&self) -> Result<(), StoreError> {
        match self.lease.fence() {
            Fence::Open => Ok(()),
            Fence::Closed(why) | Fence::Lost(why) => Err(StoreError::Nats(format!("not written: {why}"))),
        }
    }
}

/// The lease the bucket gives: its max age, set by the scheduler that made
/// it (every scheduler of the bucket shares it; a warning says when
/// `nats_lease` differs).
fn bucket_lease(store: &kv::Store, configured: Duration) -> Duration {
    let max_age = store.stream.cached_info().config.max_age;
    if max_age.is_zero() || max_age == configured {
        return configured;
    }
    tracing::warn!(nats_lease = ?configured, bucket_max_age = ?max_age, "nats_lease differs from the lease bucket's max age (set by the scheduler that made the bucket): using the bucket's");
    max_age
}

/// Encodes a schedule's value.
fn encode(stored: &Stored) -> Result<Vec<u8>, StoreError> {
    let value = Value {
        record: stored.record.clone(),
        runs_left: stored.runs_left,
        next_ms: stored.next_fire.map(|t| t.timestamp_millis()),
    };
    serde_json::to_vec(&value).map_err(|e| StoreError::Encode(e.to_string()))
}

/// Decodes a stored value.
///
/// # Errors
/// Why it is not one (as text).
fn decode(bytes: &[u8]) -> Result<Stored, String> {
    if bytes.len() > limits::SCHEDULER_NATS_MAX_VALUE_BYTES {
        return Err(format!("{} bytes, over the limit of {}", bytes.len(), limits::SCHEDULER_NATS_MAX_VALUE_BYTES));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    Ok(Stored {
        record: v.record,
        runs_left: v.runs_left,
        next_fire: v.next_ms.and_then(DateTime::from_timestamp_millis),
    })
}

/// Every live schedule under `prefix`: the last message of each key, read
/// by an ordered consumer (from the stream's leader).
async fn read_all(kv: kv::Store, prefix: String, inbox: String) -> Result<Vec<(ScheduleKey, Stored)>, String> {
    let subject_prefix = format!("{}{prefix}", kv.prefix);
    let consumer = kv
        .stream
        .create_consumer(OrderedConfig {
            deliver_subject: inbox,
            filter_subject: format!("{subject_prefix}>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            replay_policy: ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if consumer.cached_info().num_pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut seen = 0usize;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| e.to_string())?;
        let pending = message.info().map_err(|e| e.to_string())?.pending;
        seen += 1;
        if seen > limits::SCHEDULER_MAX_SCHEDULES {
            return Err(format!(
                "more than {} schedules under {subject_prefix}: not loaded (the scheduler's limit)",
                limits::SCHEDULER_MAX_SCHEDULES
            ));
        }
        let deleted = message
            .headers
            .as_ref()
            .is_some_and(|h| h.get("KV-Operation").is_some() || h.get("Nats-Marker-Reason").is_some());
        let key_text = message.subject.strip_prefix(subject_prefix.as_str()).unwrap_or_default().to_string();
        if !deleted {
            match (ScheduleKey::from_hex(&key_text), decode(&message.payload)) {
                (Some(key), Ok(stored)) => out.push((key, stored)),
                (None, _) => {
                    tracing::warn!(subject = %message.subject, "nats store: a key that is no schedule key; skipped")
                }
                (_, Err(why)) => tracing::warn!(key = %key_text, error = %why, "nats store: skipping a damaged record"),
            }
        }
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

impl Store for NatsStore {
    fn load(&mut self) -> Result<Vec<(ScheduleKey, Stored)>, StoreError> {
        let prefix = self.prefix.clone();
        // A long list may take more than one request's time.
        let (kv, timeout) = (self.kv.clone(), self.timeout * 10);
        let answer = self
            .bridge
            .call(move |ctx| async move {
                tokio::time::timeout(timeout, read_all(kv, prefix, ctx.client.new_inbox()))
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
            })
            .map_err(|e| StoreError::Nats(e.to_string()))?;
        let loaded = answer.map_err(|e| StoreError::Nats(format!("reading the schedules: {e}")))?;
        self.loaded = true;
        Ok(loaded)
    }

    /// Loads the schedules if the load at start failed (the service then
    /// adds them); nothing to do otherwise: no other scheduler writes this
    /// name's schedules while this one holds the lease.
    fn reconcile(&mut self) -> Result<Reconciled, StoreError> {
        if self.loaded {
            return Ok(Reconciled::default());
        }
        Ok(Reconciled { claimed: self.load()?, lost: Vec::new() })
    }

    fn put(&mut self, key: &ScheduleKey, stored: &Stored) -> Result<(), StoreError> {
        let value = encode(stored)?;
        if value.len() > limits::SCHEDULER_NATS_MAX_VALUE_BYTES {
            return Err(StoreError::Nats(format!(
                "schedule {key}: {} bytes, over the NATS store's limit of {}",
                value.len(),
                limits::SCHEDULER_NATS_MAX_VALUE_BYTES
            )));
        }
        self.writable()?;
        let k = format!("{}{key}", self.prefix);
        self.request(
            &format!("writing schedule {key}"),
            move |kv| async move { kv.put(&k, Bytes::from(value)).await },
        )?;
        Ok(())
    }

    fn delete(&mut self, key: &ScheduleKey) -> Result<(), StoreError> {
        self.writable()?;
        let k = format!("{}{key}", self.prefix);
        self.request(&format!("deleting schedule {key}"), move |kv| async move { kv.delete(&k).await })
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    fn fence(&self) -> Fence {
        self.lease.fence()
    }

    fn admit(&self, record: &[String; 5]) -> Result<(), String> {
        let largest = Stored {
            record: record.clone(),
            runs_left: Some(u64::MAX),
            next_fire: DateTime::from_timestamp_millis(i64::MAX / 1_000_000),
        };
        let size = encode(&largest).map_err(|e| e.to_string())?.len();
        if size > limits::SCHEDULER_NATS_MAX_VALUE_BYTES {
            return Err(format!(
                "the schedule's record is {size} bytes stored, over the NATS store's limit of {}",
                limits::SCHEDULER_NATS_MAX_VALUE_BYTES
            ));
        }
        Ok(())
    }
}

impl Drop for NatsStore {
    fn drop(&mut self) {
        self.lease.release(&self.bridge);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_damage_is_refused() {
        let record = ["q".into(), "nohaste".into(), "2".into(), "[\"run\", {}]".into(), "".into()];
        let stored =
            Stored { record, runs_left: Some(3), next_fire: DateTime::from_timestamp_millis(1_700_000_000_123) };
        let bytes = encode(&stored).unwrap();
        assert_eq!(decode(&bytes).unwrap(), stored);
        assert!(decode(b"[1,2]").is_err());
        assert!(decode(br#"{"record":["a"],"runs_left":null}"#).is_err());
        let big = vec![b' '; limits::SCHEDULER_NATS_MAX_VALUE_BYTES + 1];
        assert!(decode(&big).unwrap_err().contains("over the limit"));
    }

    #[test]
    fn name_tokens_are_key_safe_and_distinct() {
        for name in ["a", "a.b", "a=2Eb", "x y", "~!@#$%^&*()", "é"] {
            let t = name_token(name);
            assert!(t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)), "{t}");
        }
        assert_ne!(name_token("a.b"), name_token("a=2Eb"));
    }
}
