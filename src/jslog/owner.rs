//! Who may write a router name's streams, and which streams they are.
//!
//! * **The lease**: key `<name>` in the key-value bucket
//!   `<prefix>_routers`, whose entries expire `nats_lease` after their last
//!   write (the bucket's max age). A router creates the key at start
//!   (compare-and-set: only if absent) and renews it every third of the
//!   lease with an update on the revision it last wrote. A router started
//!   with a name whose key exists watches it for up to twice the lease: a
//!   new revision means a live holder, and the start is refused
//!   ([`JsError::Held`]); a key that expires (its holder died, `kill -9`)
//!   is then created. A renewal that finds another revision reads the key
//!   from the bucket's leader: this router's own value (a renewal stored
//!   whose PubAck was lost), or no key (it expired while the cluster was
//!   unreachable for longer than the lease), leaves the name this router's
//!   (a missing key is created again, only if absent); another value means
//!   another router took the name: every shard stops acknowledging
//!   ([`JsShared::taken`]). A clean stop deletes the key. Taking over from
//!   a live holder, and fencing a paused one, are not done here.
//! * **The layout**: key `<name>` in `<prefix>_layouts` (no expiry) says
//!   the generation and shard count of the name's streams,
//!   `<prefix>_<name>_<gen>_<shard>`. A router started with another shard
//!   count writes generation + 1, then moves the key (the commit point),
//!   then deletes the old streams.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, StorageType};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::bridge::{retried, Bridge, Ctx};
use super::shared::JsShared;
use super::JsError;
use crate::config::NatsConfig;

/// A name's streams: their generation and shard count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The generation (in stream names).
    pub gen: u32,
    /// The shard count.
    pub shards: u16,
}

/// The router's hold on its name (module docs).
pub struct Lease {
    store: kv::Store,
    key: String,
    stop: Arc<AtomicBool>,
}

/// The bucket `name` with `max_age` (0: none), made when missing; tried
/// for up to `within` ([`retried`]).
async fn bucket(
    ctx: &Ctx,
    name: String,
    max_age: Duration,
    replicas: usize,
    within: Duration,
) -> Result<kv::Store, JsError> {
    let config = kv::Config {
        bucket: name.clone(),
        history: 1,
        max_age,
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    let what = format!("bucket {name}");
    retried(&what, within, || async {
        if let Ok(store) = ctx.js.get_key_value(&name).await {
            return Ok(store);
        }
        match ctx.js.create_key_value(config.clone()).await {
            Ok(store) => Ok(store),
            // Made meanwhile by another router.
            Err(e) => ctx.js.get_key_value(&name).await.map_err(|_| e.to_string()),
        }
    })
    .await
    .map_err(|why| JsError::Store { what, why })
}

/// Takes the router's name (module docs), `holder` describing this router
/// to whoever finds the name held.
///
/// # Errors
/// [`JsError::Held`] when a live router holds the name; [`JsError::Store`]
/// when the bucket cannot be read or written.
pub fn acquire(bridge: &Bridge, config: &NatsConfig, holder: String) -> Result<Lease, JsError> {
    let (prefix, name, lease, replicas, within) =
        (config.stream_prefix.clone(), config.router_name.clone(), config.lease, config.replicas, config.give_up);
    bridge.call(move |ctx| async move {
        let store = bucket(&ctx, format!("{prefix}_routers"), lease, replicas, within).await?;
        let deadline = Instant::now() + lease * 2 + Duration::from_secs(1);
        let mut seen: Option<u64> = None;
        let mut said = false;
        let what = format!("the lease on router name {name}");
        loop {
            let created = retried(&what, within, || async {
                match store.create(&name, Bytes::from(holder.clone())).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(e.to_string()),
                }
            });
            if created.await.map_err(|why| JsError::Store { what: what.clone(), why })? {
                break;
            }
            let entry = retried(&what, within, || store.entry(&name)).await;
            let entry = entry.map_err(|e| JsError::Store { what: what.clone(), why: e.to_string() })?;
            if let Some(entry) = entry.filter(|e| e.operation == Operation::Put) {
                let other = String::from_utf8_lossy(&entry.value).into_owned();
                if seen.is_some_and(|r| r != entry.revision) || Instant::now() >= deadline {
                    return Err(JsError::Held { name, holder: other });
                }
                if !said {
                    tracing::warn!(router_name = %name, holder = %other, "the router name is held; waiting up to {:?} to see whether its holder is alive (it renews every {:?})", lease * 2, lease / 3);
                    said = true;
                }
                seen = seen.or(Some(entry.revision));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(Lease { store, key: name, stop: Arc::new(AtomicBool::new(false)) })
    })?
}

impl Lease {
    /// Renews the lease every third of `lease` on the bridge's thread
    /// until [`Lease::release`]; if another router took the name, every
    /// shard in `shards` stops acknowledging.
    pub fn keep(&self, bridge: &Bridge, lease: Duration, shards: Vec<Arc<JsShared>>) {
        let (store, key, stop) = (self.store.clone(), self.key.clone(), self.stop.clone());
        let _ = bridge.call(move |_ctx| async move {
            tokio::spawn(async move {
                let mut revision = match store.entry(&key).await {
                    Ok(Some(e)) => e.revision,
                    _ => 0,
                };
                let value = match store.get(&key).await {
                    Ok(Some(v)) => v,
                    _ => Bytes::new(),
                };
                while !stop.load(Ordering::Acquire) {
                    tokio::time::sleep(lease / 3).await;
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    match store.update(&key, value.clone(), revision).await {
                        Ok(r) => revision = r,
                        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => match reclaim(&store, &key, &value).await {
                            Ok(Some(Reclaimed::Lapsed(r))) => {
                                tracing::warn!(router_name = %key, "the lease on the router name lapsed (the cluster was unreachable longer than nats_lease) and no other router took it: held again");
                                revision = r;
                            }
                            Ok(Some(Reclaimed::Ours(r))) => revision = r,
                            Ok(None) => {
                                tracing::error!(router_name = %key, "another router took this router's name: nothing more is acknowledged here (new jobs get STORE_FAILED); stop this router");
                                for s in &shards {
                                    s.taken();
                                }
                                break;
                            }
                            Err(e) => crate::log_limited!(warn, router_name = %key, error = %e, "renewing the lease on the router name failed; trying again"),
                        },
                        Err(e) => crate::log_limited!(warn, router_name = %key, error = %e, "renewing the lease on the router name failed; trying again"),
                    }
                }
            });
        });
    }

    /// Stops renewing and deletes the key, so the name is free at once.
    pub fn release(self, bridge: &Bridge) {
        self.stop.store(true, Ordering::Release);
        let (store, key) = (self.store, self.key);
        let name = key.clone();
        let deleted = bridge.call(move |_ctx| async move { store.delete(&key).await.map_err(|e| e.to_string()) });
        let error = match deleted {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(e) => e.to_string(),
        };
        tracing::warn!(router_name = %name, error = %error, "could not free the router name at stop: a new router with it waits until the lease expires");
    }
}

/// The name is still this router's after a renewal found another
/// revision ([`reclaim`]); the revision to renew next.
enum Reclaimed {
    /// The key holds this router's own value: a renewal was stored whose
    /// PubAck was lost.
    Ours(u64),
    /// The key was gone (it expired while the cluster was unreachable for
    /// longer than the lease, or was deleted) and is made again.
    Lapsed(u64),
}

/// Whose the name is after a renewal found another revision than the one
/// this router last wrote, as the bucket's stream leader says (a replica
/// answering a direct get may lag, a node just restarted say): still this
/// router's (`Some`, see [`Reclaimed`]; a missing key is created again,
/// only if absent, as at start), or another router's (`None`) only when
/// the key holds another value.
///
/// # Errors
/// Nothing certain (a request failed, or the key was made between the
/// read and the create): the next renewal asks again.
async fn reclaim(store: &kv::Store, key: &str, value: &Bytes) -> Result<Option<Reclaimed>, String> {
    let subject = format!("{}{key}", store.prefix);
    match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) if m.headers.get("KV-Operation").is_none() && m.headers.get("Nats-Marker-Reason").is_none() => {
            return Ok((m.payload == *value).then_some(Reclaimed::Ours(m.sequence)));
        }
        // A delete or purge marker: the key is gone.
        Ok(_) => {}
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
        Err(e) => return Err(e.to_string()),
    }
    match store.create(key, value.clone()).await {
        Ok(revision) => Ok(Some(Reclaimed::Lapsed(revision))),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            Err("the key was made again between its read and its creation".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The name's layout, `None` when it has none yet.
///
/// # Errors
/// [`JsError::Store`].
pub fn read_layout(bridge: &Bridge, config: &NatsConfig) -> Result<Option<Layout>, JsError> {
    let (prefix, name, replicas, within) =
        (config.stream_prefix.clone(), config.router_name.clone(), config.replicas, config.give_up);
    bridge.call(move |ctx| async move {
        let store = bucket(&ctx, format!("{prefix}_layouts"), Duration::ZERO, replicas, within).await?;
        match retried(&format!("the layout of router name {name}"), within, || store.get(&name)).await {
            Ok(Some(v)) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| JsError::Store { what: format!("the layout of router name {name}"), why: e.to_string() }),
            Ok(None) => Ok(None),
            Err(e) => Err(JsError::Store { what: format!("the layout of router name {name}"), why: e.to_string() }),
        }
    })?
}

/// Writes the name's layout (the commit point of a new layout).
///
/// # Errors
/// [`JsError::Store`].
pub fn write_layout(bridge: &Bridge, config: &NatsConfig, layout: Layout) -> Result<(), JsError> {
    let (prefix, name, replicas, within) =
        (config.stream_prefix.clone(), config.router_name.clone(), config.replicas, config.give_up);
    bridge.call(move |ctx| async move {
        let store = bucket(&ctx, format!("{prefix}_layouts"), Duration::ZERO, replicas, within).await?;
        let value = Bytes::from(serde_json::to_vec(&layout).unwrap_or_default());
        retried(&format!("the layout of router name {name}"), within, || store.put(&name, value.clone()))
            .await
            .map(|_| ())
            .map_err(|e| JsError::Store { what: format!("the layout of router name {name}"), why: e.to_string() })
    })?
}
