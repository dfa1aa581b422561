//! [`Bridge`]: the one thread that talks to NATS (`emq-nats`), with a
//! current-thread tokio runtime and the official async-nats client: the
//! only async code in emq. Shards never block on it: they hand it
//! publishes through an unbounded channel (a non-blocking send) and learn
//! the outcome from their [`JsShared`] (the PubAcks, a give-up), which
//! their release threads wait on.
//!
//! Each publish is retried with the same `Nats-Msg-Id` (JetStream stores it
//! once inside the stream's duplicate window) after a timeout, "no
//! responders" (no stream leader) or a lost connection, with back-off
//! ([`limits::NATS_RETRY_MIN`] doubling to [`limits::NATS_RETRY_MAX`]),
//! until `nats_give_up`: then the shard is told ([`JsShared::gave_up`]).
//! At most `nats_max_in_flight` publishes are in flight; the rest wait in
//! the channel, in order.
//!
//! Start-up work (the lease, the layout, the streams, the replay) runs on
//! the same thread through [`Bridge::call`], which blocks the calling
//! thread (the router's start) until the future is done.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::message::SNAPSHOT_HEADER;
use super::shared::JsShared;
use super::JsError;
use crate::config::NatsConfig;
use crate::joblog::FaultKind;
use crate::limits;

/// A boxed future the bridge runs for a caller.
pub type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the bridge's tasks use: the client and the JetStream context.
#[derive(Clone)]
pub struct Ctx {
    /// The connection.
    pub client: async_nats::Client,
    /// JetStream on it (its timeout is `nats_ack_timeout`).
    pub js: jetstream::Context,
}

/// One message of a shard's log to publish.
#[derive(Debug)]
pub struct Publish {
    /// The shard (index into the bridge's [`JsShared`]s).
    pub shard: usize,
    /// The batch.
    pub ticket: u64,
    /// Its part.
    pub part: u16,
    /// This start's subject on the shard's stream (its epoch subject).
    pub subject: Arc<str>,
    /// `Nats-Msg-Id`: the same on every retry.
    pub msg_id: String,
    /// Header and records.
    pub payload: Bytes,
    /// A part of a repair's snapshot (sent with [`SNAPSHOT_HEADER`]).
    pub snapshot: bool,
}

/// What the bridge's thread is asked to do.
pub(crate) enum Cmd {
    Publish(Publish),
    Purge { shard: usize, below: u64 },
    Call(Box<dyn FnOnce(Ctx) -> Job + Send>),
    Attach(Vec<Arc<JsShared>>),
}

/// Figures of the bridge for STATUS and `/metrics`.
#[derive(Debug, Default)]
pub struct BridgeStats {
    /// Publishes in flight now.
    pub in_flight: AtomicUsize,
    /// Publishes retried.
    pub retries: AtomicU64,
    /// Purges that failed.
    pub purge_errors: AtomicU64,
}

/// The NATS thread (module docs). Dropping it stops the thread after the
/// publishes in flight end (each within `nats_give_up`).
pub struct Bridge {
    tx: Option<mpsc::UnboundedSender<Cmd>>,
    join: Option<JoinHandle<()>>,
    ctx: Ctx,
    /// The bridge's figures.
    pub stats: Arc<BridgeStats>,
}

impl Bridge {
    /// Connects to `config.urls` on a new thread and runs the bridge there.
    ///
    /// # Errors
    /// [`JsError::Connect`] when no server answers within
    /// `nats_ack_timeout` × 3, or TLS or the credentials fail
    /// ([`super::connect::connect`]); [`JsError::Secret`] for an unusable
    /// secret file;
    /// [`JsError::Io`] when the thread or runtime cannot be made.
    pub fn start(config: &NatsConfig) -> Result<Bridge, JsError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| JsError::Io { what: "the NATS thread's runtime".into(), source: e })?;
        let name = format!("emq-router {}", config.router_name);
        let client = rt.block_on(super::connect::connect(config, name))?;
        // The context spawns its acker task on the runtime.
        let entered = rt.enter();
        let js = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout)
            .max_ack_inflight(config.max_in_flight.saturating_mul(2).max(16))
            .build(client.clone());
        drop(entered);
        let ctx = Ctx { client, js };
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(BridgeStats::default());
        let run = Run {
            ctx: ctx.clone(),
            shards: Vec::new(),
            max_in_flight: config.max_in_flight,
            give_up: config.give_up,
            stats: stats.clone(),
        };
        let join = std::thread::Builder::new()
            .name("emq-nats".into())
            .spawn(move || rt.block_on(run.run(rx)))
            .map_err(|e| JsError::Io { what: "the NATS thread".into(), source: e })?;
        Ok(Bridge { tx: Some(tx), join: Some(join), ctx, stats })
    }

    /// Runs `f` on the bridge's thread and waits for its result.
    ///
    /// # Errors
    /// [`JsError::Io`] when the thread is gone.
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T, JsError>
    where
        T: Send + 'static,
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        let job: Box<dyn FnOnce(Ctx) -> Job + Send> = Box::new(move |ctx| {
            Box::pin(async move {
                let _ = reply_tx.send(f(ctx).await);
            })
        });
        self.send(Cmd::Call(job));
        reply_rx.recv().map_err(|_| JsError::Io {
            what: "the NATS thread".into(),
            source: std::io::Error::other("it stopped before answering"),
        })
    }

    /// The shards' states, in shard order, for the publishes' outcomes.
    pub fn attach(&self, shards: Vec<Arc<JsShared>>) {
        self.send(Cmd::Attach(shards));
    }

    /// A sender of publishes for a shard's log.
    pub fn publisher(&self) -> Publisher {
        Publisher { tx: self.tx.clone() }
    }

    /// The connection (for reads of its state: the server it is on).
    pub fn client(&self) -> &async_nats::Client {
        &self.ctx.client
    }

    fn send(&self, cmd: Cmd) {
        if let Some(tx) = &self.tx {
            if tx.send(cmd).is_err() {
                tracing::error!("the NATS thread is gone");
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// A shard's way to the bridge (cloned into each log).
#[derive(Clone)]
pub struct Publisher {
    tx: Option<mpsc::UnboundedSender<Cmd>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Publisher")
    }
}

impl Publisher {
    /// Hands a message to the bridge (never blocks); `false` when the
    /// bridge is gone (shutdown).
    pub fn publish(&self, p: Publish) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(Cmd::Publish(p)).is_ok())
    }

    /// Asks the bridge to purge shard `shard`'s stream below sequence `below`.
    pub fn purge(&self, shard: usize, below: u64) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(Cmd::Purge { shard, below }).is_ok())
    }
}

#[cfg(test)]
impl Publisher {
    /// A publisher whose commands a test reads.
    pub(crate) fn for_test() -> (Publisher, mpsc::UnboundedReceiver<Cmd>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Publisher { tx: Some(tx) }, rx)
    }
}

/// The bridge's loop and what it holds.
struct Run {
    ctx: Ctx,
    shards: Vec<Arc<JsShared>>,
    max_in_flight: usize,
    give_up: Duration,
    stats: Arc<BridgeStats>,
}

/// Why a publish was not acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// Not confirmed within `nats_give_up`.
    GaveUp,
    /// Cannot be stored: the stream no longer takes this start's subject
    /// (another router took the name and fenced this one), or the shard
    /// was fenced already.
    Fenced,
}

/// A publish's outcome: `Ok((seq, time from first try))`, or why not.
type Outcome = (usize, u64, u16, Result<(u64, Duration), Lost>);

impl Run {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        loop {
            tokio::select! {
                cmd = rx.recv(), if tasks.len() < self.max_in_flight => match cmd {
                    None => break,
                    Some(Cmd::Publish(p)) => {
                        let shard = self.shards.get(p.shard).cloned();
                        if let Some(s) = &shard {
                            s.stats.published.fetch_add(1, Ordering::Relaxed);
                            s.stats.published_bytes.fetch_add(p.payload.len() as u64, Ordering::Relaxed);
                        }
                        tasks.spawn(publish(self.ctx.js.clone(), p, self.give_up, self.stats.clone(), shard));
                        self.stats.in_flight.store(tasks.len(), Ordering::Relaxed);
                    }
                    Some(Cmd::Purge { shard, below }) => self.purge(shard, below),
                    Some(Cmd::Call(job)) => {
                        tokio::spawn(job(self.ctx.clone()));
                    }
                    Some(Cmd::Attach(shards)) => self.shards = shards,
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    self.stats.in_flight.store(tasks.len(), Ordering::Relaxed);
                    match done {
                        Ok(outcome) => self.outcome(outcome),
                        Err(e) => tracing::error!(error = %e, "a publish task failed"),
                    }
                }
            }
        }
        // Stopping: the publishes in flight end (each within give_up).
        while let Some(done) = tasks.join_next().await {
            if let Ok(outcome) = done {
                self.outcome(outcome);
            }
        }
        let _ = self.ctx.client.flush().await;
    }

    fn outcome(&self, (shard, ticket, part, result): Outcome) {
        let Some(s) = self.shards.get(shard) else { return };
        match result {
            Ok((seq, took)) => s.acked(ticket, part, seq, took),
            Err(Lost::GaveUp) => s.not_confirmed(ticket, part),
            Err(Lost::Fenced) => {
                if s.fenced(ticket, part) && self.shards.iter().all(|o| o.fault() == Some(FaultKind::Fenced)) {
                    super::shared::say_router_fenced();
                }
            }
        }
    }

    fn purge(&self, shard: usize, below: u64) {
        let Some(s) = self.shards.get(shard).cloned() else { return };
        let (js, stats) = (self.ctx.js.clone(), self.stats.clone());
        tokio::spawn(async move {
            let result = async {
                let stream = js.get_stream_no_info(s.stream()).await.map_err(|e| e.to_string())?;
                stream.purge().sequence(below).await.map_err(|e| e.to_string())
            }
            .await;
            match result {
                Ok(_) => {
                    s.stats.purges.fetch_add(1, Ordering::Relaxed);
                    s.stats.purged_below.fetch_max(below, Ordering::Relaxed);
                    s.stats.last_purge_unix_ms.store(crate::job::unix_ms_now(), Ordering::Relaxed);
                }
                Err(e) => {
                    stats.purge_errors.fetch_add(1, Ordering::Relaxed);
                    crate::log_limited!(warn, stream = %s.stream(), below, error = %e, "purging done records failed; tried again later");
                }
            }
        });
    }
}

/// Runs the start-up request `attempt` until it succeeds or `within` has
/// passed, with the publishes' back-off: a stream or bucket just made, or
/// one whose leader is being elected, answers "no responders" (or times
/// out) until it has a leader. `what` names the request in the log.
///
/// # Errors
/// The last attempt's error once `within` has passed.
pub async fn retried<T, E, F, Fut>(what: &str, within: Duration, mut attempt: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    let mut backoff = limits::NATS_RETRY_MIN;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() + backoff < deadline => {
                crate::log_limited!(warn, what, error = %e, "a JetStream request at start failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(limits::NATS_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Publishes `p` until it is acknowledged or `give_up` has passed.
///
/// "No responders" is first taken for a stream leader being elected and
/// retried, like a timeout. But it is also how a fenced router learns it
/// lost its streams (`jslog` module docs, "Fencing"): a later owner set
/// the stream's subjects to its own, so nothing listens on this start's
/// subject any more. So after "no responders" the stream's subjects are
/// asked ([`still_takes`], at most once per back-off step for the shard):
/// a stream that answers without this start's subject makes the publish
/// [`Lost::Fenced`] at once (no retry can store it). A stream that does
/// not answer (no leader) leaves it a passing error. A shard already
/// fenced sends nothing more.
async fn publish(
    js: jetstream::Context,
    p: Publish,
    give_up: Duration,
    stats: Arc<BridgeStats>,
    shard: Option<Arc<JsShared>>,
) -> Outcome {
    let t0 = Instant::now();
    let mut backoff = limits::NATS_RETRY_MIN;
    let mut tries = 0u32;
    let fenced = || shard.as_ref().is_some_and(|s| s.fault() == Some(FaultKind::Fenced));
    loop {
        if fenced() {
            return (p.shard, p.ticket, p.part, Err(Lost::Fenced));
        }
        let mut msg = PublishMessage::build().payload(p.payload.clone()).message_id(p.msg_id.as_str());
        if p.snapshot {
            msg = msg.header(SNAPSHOT_HEADER, "1");
        }
        let (error, no_responders) = match js.send_publish(p.subject.to_string(), msg).await {
            Ok(ack) => match ack.await {
                Ok(ack) => return (p.shard, p.ticket, p.part, Ok((ack.sequence, t0.elapsed()))),
                // async-nats's name for a "no responders" status.
                Err(e) => (e.to_string(), e.kind() == PublishErrorKind::StreamNotFound),
            },
            Err(e) => (e.to_string(), e.kind() == PublishErrorKind::StreamNotFound),
        };
        if let Some(s) = shard.as_ref().filter(|s| no_responders && s.may_check_fence(backoff)) {
            if still_takes(&js, s.stream(), &p.subject).await == Some(false) {
                return (p.shard, p.ticket, p.part, Err(Lost::Fenced));
            }
        }
        tries += 1;
        if tries == 1 || tries.is_multiple_of(20) {
            crate::log_limited!(warn, subject = %p.subject, msg_id = %p.msg_id, tries, error = %error, "a publish to the job log failed; retrying with the same message id");
        }
        let left = give_up.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return (p.shard, p.ticket, p.part, Err(Lost::GaveUp));
        }
        stats.retries.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = &shard {
            s.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(limits::NATS_RETRY_MAX);
    }
}

/// Whether stream `stream` still takes `subject`, as its leader answers
/// (a stream info request): `Some(false)` when its subjects no longer
/// include it (a later owner fenced this start), `None` when the request
/// fails (no leader, a timeout, the stream not found): nothing certain.
pub async fn still_takes(js: &jetstream::Context, stream: &str, subject: &str) -> Option<bool> {
    let st = js.get_stream_no_info(stream).await.ok()?;
    let info = st.get_info().await.ok()?;
    Some(info.config.subjects.iter().any(|s| s == subject))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retried_tries_again_until_it_works_or_its_time_is_up() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let mut tries = 0;
        let got: Result<u32, String> = rt.block_on(retried("a test", Duration::from_secs(5), || {
            tries += 1;
            let t = tries;
            async move {
                if t < 3 {
                    Err(format!("try {t}"))
                } else {
                    Ok(t)
                }
            }
        }));
        assert_eq!(got, Ok(3));

        let (t0, within) = (Instant::now(), Duration::from_millis(300));
        let mut tries = 0;
        let got: Result<u32, String> = rt.block_on(retried("a test", within, || {
            tries += 1;
            let t = tries;
            async move { Err(format!("try {t}")) }
        }));
        assert_eq!(got, Err(format!("try {tries}")), "the last error");
        // 50, 100 and 200 ms apart: the fourth would start past `within`.
        assert_eq!(tries, 3, "tries in {:?}", t0.elapsed());
    }
}
