//! The active scheduler's lease on its name in the NATS store
//! ([`super::nats_store`]): one key per scheduler name in the bucket
//! `<nats_bucket>_leases`, whose entries expire `nats_lease` after their
//! last write (the bucket's max age), the router's lease
//! ([`crate::jslog::owner`]) made for a scheduler with standbys:
//!
//! * **Taking it**: a scheduler creates the key (compare-and-set: only if
//!   absent) before it reads a schedule. While another holds it, the
//!   scheduler is a **standby**: it tries again every
//!   [`limits::SCHEDULER_NATS_LEASE_POLL`], for as long as it runs (a stop
//!   signal ends the wait), and takes the name once the key is gone: its
//!   holder stopped cleanly (it deletes the key) or stopped renewing it
//!   (`kill -9`, a lost machine) and the key expired.
//! * **Holding it**: renewed every third of the lease, on the bridge's
//!   thread, by an update on the revision this scheduler last wrote. The
//!   scheduler may fire (and write the store) only until
//!   `sent + lease − lease / 10`, `sent` being when the last confirmed
//!   renewal (or the create) was **sent**: the server stored it after
//!   that, so its key cannot expire, and no standby can take the name,
//!   before this scheduler stops ([`Fence::Closed`]). A renewal confirmed
//!   later opens the fence again (an update on its own revision proves the
//!   key never expired).
//! * **Losing it**: a renewal that finds another revision reads the key
//!   from the bucket's leader: this scheduler's own value (a renewal stored
//!   whose answer was lost) is renewed from there; anything else (the key
//!   expired, or a standby holds it now) is final ([`Fence::Lost`]): the
//!   scheduler stops (a supervisor may start it again, as a standby).
//! * **A clean stop** deletes the key if it still holds this scheduler's
//!   value, so a standby takes over at its next try.
//!
//! The bound holds while the servers' clocks agree with the schedulers' to
//! within the margin (a tenth of the lease): a key's age is measured by the
//! server that stores it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use parking_lot::Mutex;

use super::store::{Fence, StoreError};
use crate::jslog::bridge::Bridge;
use crate::limits;

/// What the renewal task and the scheduler share.
struct State {
    /// The zero of `valid_until_ms`.
    base: Instant,
    /// Until when (ms after `base`) this scheduler may fire.
    valid_until_ms: AtomicU64,
    /// Why the lease is lost for good, once it is.
    lost: Mutex<Option<String>>,
    /// The renewal stops (a clean stop).
    stop: AtomicBool,
}

impl State {
    fn extend(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.valid_until_ms.fetch_max(ms, Ordering::AcqRel);
    }

    fn fence(&self) -> Fence {
        if let Some(why) = self.lost.lock().clone() {
            return Fence::Lost(why);
        }
        let now = Instant::now().saturating_duration_since(self.base).as_millis() as u64;
        if now < self.valid_until_ms.load(Ordering::Acquire) {
            Fence::Open
        } else {
            Fence::Closed("the lease on the scheduler name is not renewed (the NATS cluster does not answer)".into())
        }
    }
}

/// The held lease (module docs): renewed until [`Lease::release`] or
/// until it is lost.
pub struct Lease {
    state: Arc<State>,
    kv: kv::Store,
    key: String,
    value: Bytes,
    timeout: Duration,
}

/// Until when a write sent at `sent` keeps the name this scheduler's.
fn valid_until(sent: Instant, lease: Duration) -> Instant {
    sent + lease - lease / limits::SCHEDULER_NATS_LEASE_MARGIN_DIV
}

/// Takes the lease `key` in `kv` with `value` (unique to this process),
/// waiting as a standby while another scheduler holds it (module docs).
/// `stopping` is asked between tries: `Ok(None)` when it says stop.
///
/// # Errors
/// [`StoreError::Nats`] when the bridge's thread is gone.
pub fn acquire(
    bridge: &Bridge,
    kv: kv::Store,
    key: String,
    value: String,
    lease: Duration,
    timeout: Duration,
    mut stopping: impl FnMut() -> bool,
) -> Result<Option<Lease>, StoreError> {
    let value = Bytes::from(value);
    let mut said_standby = false;
    loop {
        if stopping() {
            return Ok(None);
        }
        let sent = Instant::now();
        let (k, v, store) = (key.clone(), value.clone(), kv.clone());
        let tried = bridge
            .call(move |_ctx| async move {
                match tokio::time::timeout(timeout, store.create(&k, v.clone())).await {
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                    Ok(Ok(revision)) => Ok(Taken::Created(revision)),
                    Ok(Err(e)) if e.kind() == CreateErrorKind::AlreadyExists => {
                        match tokio::time::timeout(timeout, leader_value(&store, &k)).await {
                            Ok(Ok(Some((holder, seq)))) if holder == v => Ok(Taken::Ours(seq)),
                            Ok(Ok(Some((holder, _)))) => Ok(Taken::Held(String::from_utf8_lossy(&holder).into_owned())),
                            Ok(Ok(None)) => Ok(Taken::Held("(the key was just deleted)".into())),
                            Ok(Err(e)) => Err(e),
                            Err(_) => Err(format!("no answer within {timeout:?}")),
                        }
                    }
                    Ok(Err(e)) => Err(e.to_string()),
                }
            })
            .map_err(|e| StoreError::Nats(e.to_string()))?;
        let state = Arc::new(State {
            base: sent,
            valid_until_ms: AtomicU64::new(0),
            lost: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let revision = match tried {
            Ok(Taken::Created(revision)) => {
                state.extend(valid_until(sent, lease));
                revision
            }
            // Created by an earlier try whose answer was lost: when it was
            // stored is not known, so the fence opens at the first renewal.
            Ok(Taken::Ours(revision)) => revision,
            Ok(Taken::Held(holder)) => {
                if !said_standby {
                    tracing::info!(scheduler_name = %key, holder = %holder, "standby: another scheduler holds the name; taking over when its lease ends (nats_lease {lease:?} after its last renewal)");
                    said_standby = true;
                }
                std::thread::sleep(limits::SCHEDULER_NATS_LEASE_POLL);
                continue;
            }
            Err(why) => {
                crate::log_limited!(warn, scheduler_name = %key, error = %why, "taking the lease on the scheduler name failed; trying again");
                std::thread::sleep(limits::SCHEDULER_NATS_LEASE_POLL);
                continue;
            }
        };
        tracing::info!(scheduler_name = %key, "holding the lease on the scheduler name: active");
        let held = Lease { state: state.clone(), kv: kv.clone(), key: key.clone(), value: value.clone(), timeout };
        let (kv, key) = (kv.clone(), key.clone());
        bridge
            .call(move |_ctx| async move {
                tokio::spawn(renew(kv, key, value, revision, lease, timeout, state));
            })
            .map_err(|e| StoreError::Nats(e.to_string()))?;
        return Ok(Some(held));
    }
}

/// What a try to take the lease found.
enum Taken {
    /// Created, at this revision.
    Created(u64),
    /// The key holds this process's value already (an earlier try's
    /// create, whose answer was lost).
    Ours(u64),
    /// Another scheduler holds it (its value).
    Held(String),
}

/// Renews the key every third of `lease` from `revision` (module docs).
async fn renew(
    kv: kv::Store,
    key: String,
    value: Bytes,
    mut revision: u64,
    lease: Duration,
    timeout: Duration,
    state: Arc<State>,
) {
    let retry = (lease / 10).min(Duration::from_millis(500));
    let mut wait = if state.fence() == Fence::Open { lease / 3 } else { Duration::ZERO };
    loop {
        tokio::time::sleep(wait).await;
        if state.stop.load(Ordering::Acquire) {
            return;
        }
        let sent = Instant::now();
        let error = match tokio::time::timeout(timeout, kv.update(&key, value.clone(), revision)).await {
            Ok(Ok(r)) => {
                revision = r;
                state.extend(valid_until(sent, lease));
                wait = lease / 3;
                continue;
            }
            Ok(Err(e)) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                match tokio::time::timeout(timeout, leader_value(&kv, &key)).await {
                    Ok(Ok(Some((v, seq)))) if v == value => {
                        // A renewal stored whose answer was lost.
                        revision = seq;
                        wait = Duration::ZERO;
                        continue;
                    }
                    Ok(Ok(found)) => {
                        let why = match found {
                            Some((holder, _)) => {
                                format!("another scheduler holds the name now ({})", String::from_utf8_lossy(&holder))
                            }
                            None => "the lease expired (the NATS cluster was unreachable for longer than nats_lease)"
                                .to_string(),
                        };
                        tracing::error!(scheduler_name = %key, why = %why, "lost the lease on the scheduler name: nothing more is fired here");
                        *state.lost.lock() = Some(why);
                        return;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => format!("no answer within {timeout:?}"),
                }
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {timeout:?}"),
        };
        wait = retry;
        crate::log_limited!(warn, scheduler_name = %key, error = %error, "renewing the lease on the scheduler name failed; trying again");
    }
}

/// The key's value and revision as the bucket's stream leader says (a
/// replica answering a direct get may lag); `None` when it has none (never
/// written, expired, deleted).
///
/// # Errors
/// The request's error, as text.
async fn leader_value(kv: &kv::Store, key: &str) -> Result<Option<(Bytes, u64)>, String> {
    let subject = format!("{}{key}", kv.prefix);
    match kv.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) if m.headers.get("KV-Operation").is_none() && m.headers.get("Nats-Marker-Reason").is_none() => {
            Ok(Some((m.payload, m.sequence)))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl Lease {
    /// Whether this scheduler may fire now.
    pub fn fence(&self) -> Fence {
        self.state.fence()
    }

    /// Stops renewing and deletes the key if it still holds this
    /// scheduler's value, so a standby takes over at its next try.
    pub fn release(&self, bridge: &Bridge) {
        self.state.stop.store(true, Ordering::Release);
        *self.state.lost.lock() = Some("released at stop".into());
        let (kv, key, value, timeout) = (self.kv.clone(), self.key.clone(), self.value.clone(), self.timeout);
        let deleted = bridge.call(move |_ctx| async move {
            let release = async {
                match leader_value(&kv, &key).await? {
                    Some((v, seq)) if v == value => {
                        kv.delete_expect_revision(&key, Some(seq)).await.map_err(|e| e.to_string())
                    }
                    _ => Ok(()),
                }
            };
            tokio::time::timeout(timeout * 2, release).await.unwrap_or_else(|_| Err("no answer".into()))
        });
        match deleted {
            Ok(Ok(())) => tracing::info!(scheduler_name = %self.key, "lease released"),
            Ok(Err(e)) => {
                tracing::warn!(scheduler_name = %self.key, error = %e, "could not release the lease: a standby takes over when it expires")
            }
            Err(e) => {
                tracing::warn!(scheduler_name = %self.key, error = %e, "could not release the lease: a standby takes over when it expires")
            }
        }
    }
}
