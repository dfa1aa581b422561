//! Who may write a router name's streams, and which streams they are.
//!
//! * **The lease**: key `<name>` in the key-value bucket
//!   `<prefix>_routers`, whose entries expire `nats_lease` after their last
//!   write (the bucket's max age). A router creates the key at start
//!   (compare-and-set: only if absent) and, from then on (also while it
//!   replays its streams, which may take longer than the lease), renews it
//!   every third of the lease with an update on the revision it last
//!   wrote (the one each write returned, never one read back: a read may
//!   be answered by a replica that has not applied the latest write yet).
//!   The lease is the bucket's max age ([`bucket_lease`]). A router started
//!   with a name whose key exists watches it for up to twice the lease: a
//!   new revision means a live holder, and the start is refused
//!   ([`JsError::Held`]); a key that expires (its holder died, `kill -9`)
//!   is then created. A renewal that finds another revision reads the key
//!   from the bucket's leader ([`reclaim`]): this router's own value (a
//!   renewal stored whose answer was lost) is renewed from its revision;
//!   no key (it expired while the cluster was unreachable for longer than
//!   the lease) is created again, only if absent; another value means
//!   another router took the name: every shard is fenced at once
//!   ([`JsShared::taken`]). A clean stop deletes the key. A start with
//!   `standby` waits for the key to expire instead of refusing (read every
//!   [`LEASE_POLL`]). The revision of the key a start creates is its
//!   epoch ([`Lease::epoch`]); fencing a paused holder off the streams is
//!   `jslog::open`'s (module docs, "Fencing").
//! * **The layout**: key `<name>` in `<prefix>_layouts` (no expiry) says
//!   the generation and shard count of the name's streams,
//!   `<prefix>_<name>_<gen>_<shard>`. A router started with another shard
//!   count writes generation + 1, then moves the key (the commit point),
//!   then deletes the old streams.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, StorageType};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::bridge::{retried, Bridge, Ctx};
use super::ownership::{self, Ownership};
use super::shared::JsShared;
use super::JsError;
use crate::config::NatsConfig;
use crate::limits;

/// A name's streams: their generation and shard count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The generation (in stream names).
    pub gen: u32,
    /// The shard count.
    pub shards: u16,
}

/// How often a router waiting for its name (a standby, or a start that
/// found it held) reads the lease key: it takes the name within about
/// this of the key's expiry.
pub const LEASE_POLL: Duration = Duration::from_millis(250);

/// The router's hold on its name (module docs), renewed on the bridge's
/// thread from its making until [`Lease::release`].
pub struct Lease {
    store: kv::Store,
    key: String,
    /// The revision of the key this start created: its epoch.
    epoch: u64,
    stop: Arc<AtomicBool>,
    watchers: Arc<Mutex<Watchers>>,
}

/// Who hears that another router took the name.
#[derive(Default)]
struct Watchers {
    /// The shards, once made ([`Lease::attach`]).
    shards: Vec<Arc<JsShared>>,
    /// The name was taken (before or after they were attached).
    taken: bool,
    /// STATUS's view of the name.
    own: Arc<Ownership>,
}

impl Watchers {
    fn take(&mut self) {
        self.taken = true;
        self.own.fenced(None);
        let mut newly = false;
        for s in &self.shards {
            newly |= s.taken();
        }
        if newly {
            super::shared::say_router_fenced();
        }
    }
}

/// The bucket `name` with `max_age` (0: none), made when missing; tried
/// for `within` ([`retried`]).
async fn bucket(
    ctx: &Ctx,
    name: String,
    max_age: Duration,
    replicas: usize,
    within: Duration,
) -> Result<kv::Store, JsError> {
    retried(&format!("bucket {name}"), within, || bucket_once(ctx, name.clone(), max_age, replicas)).await
}

async fn bucket_once(ctx: &Ctx, name: String, max_age: Duration, replicas: usize) -> Result<kv::Store, JsError> {
    let config = kv::Config {
        bucket: name.clone(),
        history: 1,
        max_age,
        storage: StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    };
    open_or_make_bucket(ctx, config).await.map_err(|why| JsError::Store { what: format!("bucket {name}"), why })
}

/// Opens the key-value bucket `config.bucket`, made with `config` when
/// missing (one try; the routers' lease and layout buckets, emq-scheduler's
/// schedules and leases). One made meanwhile by another process is opened.
///
/// # Errors
/// The create's error when the bucket can be neither made nor opened.
pub(crate) async fn open_or_make_bucket(ctx: &Ctx, config: kv::Config) -> Result<kv::Store, String> {
    if let Ok(store) = ctx.js.get_key_value(&config.bucket).await {
        return Ok(store);
    }
    let name = config.bucket.clone();
    match ctx.js.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Made meanwhile by another router or scheduler.
        Err(e) => ctx.js.get_key_value(&name).await.map_err(|_| e.to_string()),
    }
}

/// The lease the bucket gives: its max age, set by the router that made
/// it. All routers of a stream prefix share the bucket, so one whose
/// `nats_lease` differs renews every third of the bucket's (a warning
/// says so) rather than changing it under the others (a shorter max age
/// would expire their keys between their renewals).
fn bucket_lease(store: &kv::Store, configured: Duration) -> Duration {
    let max_age = store.stream.cached_info().config.max_age;
    if max_age.is_zero() || max_age == configured {
        return configured;
    }
    tracing::warn!(
        bucket = %store.stream.cached_info().config.name,
        nats_lease = ?configured,
        bucket_max_age = ?max_age,
        "nats_lease differs from the lease bucket's max age (set by the router that made the bucket; shared by every router of this stream prefix): using the bucket's"
    );
    max_age
}

/// Takes the router's name (module docs), `holder` describing this router
/// to whoever finds the name held.
///
/// # Errors
/// [`JsError::Held`] when a live router holds the name; [`JsError::Store`]
/// when the bucket cannot be read or written (tried for `nats_give_up`).
pub fn acquire(bridge: &Bridge, config: &NatsConfig, holder: String, own: Arc<Ownership>) -> Result<Lease, JsError> {
    let (prefix, name, lease, replicas, give_up, standby) = (
        config.stream_prefix.clone(),
        config.router_name.clone(),
        config.lease,
        config.replicas,
        config.give_up,
        config.standby,
    );
    let stopped = name.clone();
    bridge.call(move |ctx| async move {
        let take = async move {
        let store = bucket(&ctx, format!("{prefix}_routers"), lease, replicas, give_up).await?;
        tokio::spawn(list_peers(ctx.clone(), store.clone(), format!("{prefix}_layouts"), name.clone(), Arc::downgrade(&own)));
        let lease = bucket_lease(&store, lease);
        let deadline = Instant::now() + lease * 2 + Duration::from_secs(1);
        let mut seen: Option<u64> = None;
        let mut said: Option<String> = None;
        let value = Bytes::from(holder.clone());
        let what = format!("the lease on router name {name}");
        let revision = loop {
            let created = retried(&what, give_up, || async {
                match store.create(&name, value.clone()).await {
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
                    made => made.map(Some),
                }
            });
            match created.await {
                Ok(Some(revision)) => {
                    own.took(&holder, revision, said.as_deref());
                    match &said {
                        Some(old) => tracing::warn!(
                            router_name = %name,
                            ownership = "owner",
                            previous_holder = %old,
                            standby,
                            "took the router name: its holder's lease expired (it stopped renewing: dead, paused or cut off); fencing its streams, then replaying them"
                        ),
                        None => tracing::info!(router_name = %name, ownership = "owner", "took the router name: it was free"),
                    }
                    break revision;
                }
                Ok(None) => {}
                Err(e) => return Err(JsError::Store { what: format!("the lease on router name {name}"), why: e.to_string() }),
            }
            let entry = retried(&what, give_up, || store.entry(&name)).await.map_err(|e| JsError::Store { what: format!("the lease on router name {name}"), why: e.to_string() })?;
            if let Some(entry) = entry.filter(|e| e.operation == Operation::Put) {
                if entry.value == value {
                    // This router's create, stored while its answer was lost.
                    own.took(&holder, entry.revision, said.as_deref());
                    break entry.revision;
                }
                let other = String::from_utf8_lossy(&entry.value).into_owned();
                own.waiting(&other, entry.created.into());
                if !standby && (seen.is_some_and(|r| r != entry.revision) || Instant::now() >= deadline) {
                    return Err(JsError::Held { name, holder: other });
                }
                if said.as_ref() != Some(&other) {
                    if standby {
                        tracing::warn!(router_name = %name, ownership = "standby", holder = %other, "standby: the router name is held; taking it once its holder's lease expires (polled every {LEASE_POLL:?})");
                    } else {
                        tracing::warn!(router_name = %name, holder = %other, "the router name is held; waiting up to {:?} to see whether its holder is alive (it renews every {:?})", lease * 2, lease / 3);
                    }
                    said = Some(other);
                }
                seen = seen.or(Some(entry.revision));
            }
            if ownership::waiting_stopped() {
                return Err(JsError::Stopped { name });
            }
            tokio::time::sleep(LEASE_POLL).await;
        };
        let watchers = Arc::new(Mutex::new(Watchers { own, ..Watchers::default() }));
        let held = Lease { store, key: name, epoch: revision, stop: Arc::default(), watchers };
        let (store, key, stop, watchers) = (held.store.clone(), held.key.clone(), held.stop.clone(), held.watchers.clone());
        tokio::spawn(renew(store, key, value, revision, lease, stop, watchers));
        Ok(held)
        };
        // A stop signal ends the wait, also while a request to an
        // unreachable cluster is being retried. A key created just before
        // is never renewed: it expires after the lease, as a dead holder's.
        tokio::select! {
            taken = take => taken,
            () = ownership::stop_requested() => Err(JsError::Stopped { name: stopped }),
        }
    })?
}

/// Lists the other router names of the stream prefix into `own`'s peers
/// every [`limits::PEER_ROUTERS_POLL`] ([`super::peers`]), from the lease
/// bucket `routers` and the layout bucket `layouts` (opened, not made:
/// none before the first router laid out its streams), while the
/// router's ownership view lives. Standbys list them too.
async fn list_peers(ctx: Ctx, routers: kv::Store, layouts: String, name: String, own: Weak<Ownership>) {
    let mut laid: Option<kv::Store> = None;
    loop {
        let Some(o) = own.upgrade() else { return };
        if laid.is_none() {
            laid = ctx.js.get_key_value(&layouts).await.ok();
        }
        match super::peers::list(&routers, laid.as_ref(), &name).await {
            Ok((found, more)) => o.peers().set(found, more),
            Err(why) => o.peers().failed(why),
        }
        drop(o);
        tokio::time::sleep(limits::PEER_ROUTERS_POLL).await;
    }
}

/// Renews the key every third of `lease`, starting from `revision`, until
/// `stop`; if another router took the name, tells the watchers.
async fn renew(
    store: kv::Store,
    key: String,
    value: Bytes,
    mut revision: u64,
    lease: Duration,
    stop: Arc<AtomicBool>,
    watchers: Arc<Mutex<Watchers>>,
) {
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(lease / 3).await;
        if stop.load(Ordering::Acquire) {
            break;
        }
        let error = match store.update(&key, value.clone(), revision).await {
            Ok(r) => {
                revision = r;
                watchers.lock().own.renewed();
                continue;
            }
            // Released meanwhile (a clean stop deleted the key).
            Err(_) if stop.load(Ordering::Acquire) => break,
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => match reclaim(&store, &key, &value).await {
                Ok(Some(Reclaimed::Ours(r))) => {
                    revision = r;
                    watchers.lock().own.renewed();
                    continue;
                }
                Ok(Some(Reclaimed::Lapsed(r))) => {
                    tracing::warn!(router_name = %key, "the lease on the router name lapsed (the cluster was unreachable longer than nats_lease) and no other router took it: held again");
                    revision = r;
                    watchers.lock().own.renewed();
                    continue;
                }
                Ok(None) => {
                    tracing::warn!(router_name = %key, ownership = "fenced", "a lease renewal found another router holding this router's name");
                    watchers.lock().take();
                    break;
                }
                Err(why) => why,
            },
            Err(e) => e.to_string(),
        };
        crate::log_limited!(warn, router_name = %key, error = %error, "renewing the lease on the router name failed; trying again");
    }
}

impl Lease {
    /// This start's epoch: the revision of the lease key it created (or
    /// found it had created). The bucket's sequence: unique, and higher
    /// for every later start that takes the name. It names the subject
    /// this start publishes on (`jslog` module docs, "Fencing").
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The shards to stop acknowledging if another router takes the name
    /// (at once if it was taken already).
    pub fn attach(&self, shards: Vec<Arc<JsShared>>) {
        let mut w = self.watchers.lock();
        w.shards = shards;
        if w.taken {
            w.take();
        }
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
/// [`JsError::Store`] when the bucket cannot be read (tried for
/// `nats_give_up`).
pub fn read_layout(bridge: &Bridge, config: &NatsConfig) -> Result<Option<Layout>, JsError> {
    let (prefix, name, replicas, give_up) =
        (config.stream_prefix.clone(), config.router_name.clone(), config.replicas, config.give_up);
    bridge.call(move |ctx| async move {
        let store = bucket(&ctx, format!("{prefix}_layouts"), Duration::ZERO, replicas, give_up).await?;
        match retried(&format!("the layout of router name {name}"), give_up, || store.get(&name)).await {
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
/// [`JsError::Store`] when the bucket cannot be written (tried for
/// `nats_give_up`).
pub fn write_layout(bridge: &Bridge, config: &NatsConfig, layout: Layout) -> Result<(), JsError> {
    let (prefix, name, replicas, give_up) =
        (config.stream_prefix.clone(), config.router_name.clone(), config.replicas, config.give_up);
    bridge.call(move |ctx| async move {
        let store = bucket(&ctx, format!("{prefix}_layouts"), Duration::ZERO, replicas, give_up).await?;
        let value = Bytes::from(serde_json::to_vec(&layout).unwrap_or_default());
        retried(&format!("the layout of router name {name}"), give_up, || store.put(&name, value.clone()))
            .await
            .map(|_| ())
            .map_err(|e| JsError::Store { what: format!("the layout of router name {name}"), why: e.to_string() })
    })?
}
