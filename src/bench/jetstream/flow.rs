//! The measured part of a JetStream run: the publisher (a window of
//! PubAcks in a `FuturesUnordered`, each job retried on its own), the
//! consumer (pull requests, one ack per message) and the wait for the
//! stream to be empty. Both run on the one runtime thread; with
//! `--concurrent` they are joined, else one after the other.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::Subject;
use futures_util::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;

use super::{nats, CpuUse, JetStreamRun, JetStreamSettings, Retries, FETCH_BATCH, INDEX_BYTES, RETRY_FIRST};
use super::{RETRY_FOR, RETRY_MAX};
use crate::bench::body::histogram;
use crate::bench::BenchError;

/// How long a pull request waits on the server for messages (a long poll:
/// the consumer of a concurrent run waits there for the publisher).
const FETCH_EXPIRES: Duration = Duration::from_secs(1);
/// The consumer gives up after this long without a new delivery (past the
/// consumer's 30 s ack wait, so one round of redeliveries fits); the jobs
/// missing then are reported lost.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the stream's message count is asked for at the end.
const EMPTY_POLL: Duration = Duration::from_millis(2);

/// What the publisher and the consumer share on the runtime's one thread.
struct Shared {
    /// The run's start: the first publish.
    t0: Instant,
    /// Each job's first try, in nanoseconds since `t0`.
    sent_ns: Vec<Cell<u64>>,
    /// PubAcks plus jobs consumed, for the progress bar.
    progress: Arc<AtomicU64>,
}

impl Shared {
    fn since_t0_ns(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Publishes and consumes `--jobs` on `stream` (see the module docs).
pub(super) async fn measure(
    js: &jetstream::Context,
    stream: &mut stream::Stream,
    consumer: &consumer::PullConsumer,
    s: &JetStreamSettings,
    progress: Arc<AtomicU64>,
) -> Result<JetStreamRun, BenchError> {
    let name = stream.cached_info().config.name.clone();
    let subject = Subject::from(format!("{name}.jobs"));
    let cpu0 = CpuUse::read(&s.server_pids)?;
    let jobs = s.jobs as usize;
    let shared = Shared { t0: Instant::now(), sent_ns: (0..jobs).map(|_| Cell::new(0)).collect(), progress };
    let (published, mut consumed, cpu_mid) = if s.concurrent {
        let (p, c) = tokio::try_join!(
            publish_all(js, &subject, &name, s, &shared),
            consume_all(consumer, s.jobs, true, &shared)
        )?;
        (p, c, None)
    } else {
        let p = publish_all(js, &subject, &name, s, &shared).await?;
        let mid = CpuUse::read(&s.server_pids)?;
        (p, consume_all(consumer, s.jobs, false, &shared).await?, Some(mid))
    };
    let left_in_stream = wait_empty(stream, consumer, &mut consumed, &shared).await?;
    let wall = shared.t0.elapsed();
    let end = CpuUse::read(&s.server_pids)?;
    let cpu = match cpu_mid {
        None => vec![("run", end.since(&cpu0))],
        Some(mid) => vec![("publish", mid.since(&cpu0)), ("consume", end.since(&mid))],
    };
    let consume = if s.concurrent { wall } else { wall.saturating_sub(published.ended) };
    Ok(JetStreamRun {
        stream: name,
        concurrent: s.concurrent,
        published: published.published,
        duplicate_pubacks: published.duplicates,
        retries: published.retries,
        consumed: consumed.consumed,
        redelivered: consumed.redelivered,
        foreign: consumed.foreign,
        fetch_errors: consumed.fetch_errors,
        left_in_stream,
        publish_s: published.ended.as_secs_f64(),
        consume_s: consume.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        puback_us: published.latency_us,
        delivery_us: s.concurrent.then_some(consumed.delivery_us),
        cpu,
    })
}

/// What the publisher counted.
struct Published {
    /// Jobs with a PubAck.
    published: u64,
    /// PubAcks flagged duplicate.
    duplicates: u64,
    retries: Retries,
    /// Each job's first try to its PubAck, µs.
    latency_us: Histogram<u64>,
    /// The last PubAck, since `t0`.
    ended: Duration,
}

/// One job's publish, once acknowledged.
struct Acked {
    latency_us: u64,
    duplicate: bool,
    retries: Retries,
}

/// Publishes every job, at most `--in-flight` awaiting their PubAck.
async fn publish_all(
    js: &jetstream::Context,
    subject: &Subject,
    prefix: &str,
    s: &JetStreamSettings,
    shared: &Shared,
) -> Result<Published, BenchError> {
    let mut template = vec![b'x'; s.size];
    let mut pending = FuturesUnordered::new();
    let mut out = Published {
        published: 0,
        duplicates: 0,
        retries: Retries::default(),
        latency_us: histogram(),
        ended: Duration::ZERO,
    };
    let mut next = 0u64;
    loop {
        while pending.len() < s.in_flight && next < s.jobs {
            template[..INDEX_BYTES].copy_from_slice(&next.to_le_bytes());
            let message =
                PublishMessage::build().payload(template.clone().into()).message_id(format!("{prefix}-{next}"));
            pending.push(publish_one(js, subject, next, message, shared));
            next += 1;
        }
        let Some(acked) = pending.next().await else { break };
        let acked = acked?;
        out.published += 1;
        out.duplicates += u64::from(acked.duplicate);
        out.retries.add(&acked.retries);
        out.latency_us.saturating_record(acked.latency_us.max(1));
        shared.progress.fetch_add(1, Ordering::Relaxed);
    }
    out.ended = shared.t0.elapsed();
    Ok(out)
}

/// Publishes job `index` until it is acknowledged, retrying transient
/// errors with the same message (the same id: stored once).
async fn publish_one(
    js: &jetstream::Context,
    subject: &Subject,
    index: u64,
    message: PublishMessage,
    shared: &Shared,
) -> Result<Acked, BenchError> {
    let first = Instant::now();
    if let Some(sent) = shared.sent_ns.get(index as usize) {
        sent.set(shared.since_t0_ns());
    }
    let mut retries = Retries::default();
    let mut pause = RETRY_FIRST;
    loop {
        let attempt = match js.send_publish(subject.clone(), message.clone()).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        let e = match attempt {
            Ok(ack) => {
                let latency_us = u64::try_from(first.elapsed().as_micros()).unwrap_or(u64::MAX);
                return Ok(Acked { latency_us, duplicate: ack.duplicate, retries });
            }
            Err(e) => e,
        };
        let what = || format!("publish job {index} to {subject}");
        let counter = match e.kind() {
            PublishErrorKind::TimedOut => &mut retries.timed_out,
            PublishErrorKind::StreamNotFound => &mut retries.no_responders,
            PublishErrorKind::BrokenPipe => &mut retries.broken_pipe,
            PublishErrorKind::MaxAckPending => &mut retries.max_ack_pending,
            _ => return Err(nats(what(), e)),
        };
        *counter += 1;
        if first.elapsed() + pause > RETRY_FOR {
            let tries = retries.total();
            return Err(nats(what(), format!("no PubAck after {tries} tries in {RETRY_FOR:?}, the last: {e}")));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// What the consumer counted.
struct Consumed {
    consumed: u64,
    redelivered: u64,
    foreign: u64,
    fetch_errors: u64,
    /// The last failed pull request since the last delivery.
    last_error: Option<String>,
    /// Each job's first try to its delivery, µs (recorded when `timed`).
    delivery_us: Histogram<u64>,
    timed: bool,
    /// Jobs delivered, by index.
    seen: Vec<bool>,
}

impl Consumed {
    fn deliveries(&self) -> u64 {
        self.consumed + self.redelivered + self.foreign
    }

    fn all_delivered(&self) -> bool {
        self.consumed == self.seen.len() as u64
    }

    /// Counts one delivery by the job index in its payload.
    fn take(&mut self, payload: &[u8], shared: &Shared) {
        let index =
            payload.get(..INDEX_BYTES).and_then(|b| <[u8; INDEX_BYTES]>::try_from(b).ok()).map(u64::from_le_bytes);
        let slot = index.and_then(|i| usize::try_from(i).ok()).and_then(|i| Some((i, self.seen.get_mut(i)?)));
        match slot {
            Some((i, seen)) if !*seen => {
                *seen = true;
                self.consumed += 1;
                if let (true, Some(sent)) = (self.timed, shared.sent_ns.get(i)) {
                    let us = shared.since_t0_ns().saturating_sub(sent.get()) / 1000;
                    self.delivery_us.saturating_record(us.max(1));
                }
                shared.progress.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => self.redelivered += 1,
            None => self.foreign += 1,
        }
    }

    /// One pull request for up to `want` messages: waiting up to `expires`
    /// on the server for them, or (`None`) answered at once with what is
    /// there. Every message is counted and acked; a failed request is
    /// counted and kept as `last_error`.
    async fn pull(
        &mut self,
        consumer: &consumer::PullConsumer,
        want: usize,
        expires: Option<Duration>,
        shared: &Shared,
    ) -> Result<(), BenchError> {
        let request = match expires {
            Some(expires) => consumer.batch().max_messages(want).expires(expires).messages().await,
            None => consumer.fetch().max_messages(want).messages().await,
        };
        let mut batch = match request {
            Ok(batch) => batch,
            Err(e) => {
                self.failed(e);
                return Ok(());
            }
        };
        while let Some(delivery) = batch.next().await {
            match delivery {
                Ok(m) => {
                    self.take(&m.payload, shared);
                    m.ack().await.map_err(|e| nats("ack a message".into(), e))?;
                }
                Err(e) => {
                    self.failed(e);
                    break;
                }
            }
        }
        Ok(())
    }

    fn failed(&mut self, e: impl std::fmt::Display) {
        self.fetch_errors += 1;
        self.last_error = Some(e.to_string());
    }
}

/// Pulls and acks until every job was delivered, or nothing new came for
/// [`DRAIN_TIMEOUT`] (the rest are then lost). `timed`: record delivery
/// latency. Failed pull requests are retried after a pause and counted;
/// when they are why nothing came, the last one is the error.
async fn consume_all(
    consumer: &consumer::PullConsumer,
    jobs: u64,
    timed: bool,
    shared: &Shared,
) -> Result<Consumed, BenchError> {
    let mut out = Consumed {
        consumed: 0,
        redelivered: 0,
        foreign: 0,
        fetch_errors: 0,
        last_error: None,
        delivery_us: histogram(),
        timed,
        seen: vec![false; jobs as usize],
    };
    let mut last_delivery = Instant::now();
    while !out.all_delivered() {
        let deliveries = out.deliveries();
        let want = (jobs - out.consumed).min(FETCH_BATCH as u64) as usize;
        out.pull(consumer, want, Some(FETCH_EXPIRES), shared).await?;
        if out.deliveries() > deliveries {
            last_delivery = Instant::now();
            out.last_error = None;
            continue;
        }
        if out.last_error.is_some() {
            tokio::time::sleep(RETRY_FIRST).await;
        }
        if last_delivery.elapsed() >= DRAIN_TIMEOUT {
            match out.last_error.take() {
                Some(e) => {
                    return Err(nats("pull messages".into(), format!("{e} (nothing delivered for {DRAIN_TIMEOUT:?})")))
                }
                None => break,
            }
        }
    }
    Ok(out)
}

/// Waits until the stream holds no message (the acks applied): for up to
/// [`DRAIN_TIMEOUT`] when every job was delivered, else it looks once.
/// Meanwhile it pulls, without waiting, what the stream delivers again
/// (jobs whose ack was lost, e.g. across a leader change, come back after
/// the consumer's 30 s ack wait) and acks it. Returns what the stream
/// still holds.
async fn wait_empty(
    stream: &mut stream::Stream,
    consumer: &consumer::PullConsumer,
    out: &mut Consumed,
    shared: &Shared,
) -> Result<u64, BenchError> {
    let deadline = Instant::now() + if out.all_delivered() { DRAIN_TIMEOUT } else { Duration::ZERO };
    loop {
        let left = match stream.info().await {
            Ok(info) => Ok(info.state.messages),
            Err(e) => Err(e.to_string()),
        };
        let late = Instant::now() >= deadline;
        match left {
            Ok(n) if n == 0 || late => return Ok(n),
            Err(e) if late => return Err(nats(format!("stream info of {}", stream.cached_info().config.name), e)),
            Ok(n) => out.pull(consumer, (n as usize).min(FETCH_BATCH), None, shared).await?,
            Err(_) => {}
        }
        tokio::time::sleep(EMPTY_POLL).await;
    }
}
