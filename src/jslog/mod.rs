//! `durability = "replicated"`: each shard's job log on a NATS JetStream
//! stream, replicated by the cluster's Raft groups (`nats_replicas`,
//! default 3), so an acknowledged job survives the loss of the router's
//! machine and of one of three NATS servers. The replicated implementation
//! of [`crate::joblog::JobLog`]; the queue semantics stay the shard's.
//!
//! * [`bridge`]: the one thread that talks to NATS (async-nats on a
//!   current-thread runtime); publishes, retries, purges.
//! * [`log`]: a shard's log ([`JsLog`]): batches, chunks, compaction,
//!   repair after a give-up.
//! * [`shared`]: a shard's durable mark and figures, shared with its
//!   release thread and STATUS.
//! * [`message`]: the stream messages' header.
//! * [`owner`]: the lease on the router name and the streams' layout.
//!
//! # Streams
//!
//! Shard `i` of router name `N` writes stream `<prefix>_<N>_<gen>_<i>`
//! (subject `<prefix>.<N>.<gen>.<i>.<epoch>`, see "Fencing"), file
//! storage, `nats_replicas`
//! copies, duplicate window `nats_dedup_window`, limits retention (the log
//! purges what is done itself). [`open`] takes the name's lease, reads the
//! layout, replays every stream (in parallel) and hands each shard its
//! facts, as the local log does. A changed shard count writes a new
//! generation with every live job re-hashed to its queue's shard under a
//! fresh id; the layout key then moves to it and the old streams go.
//!
//! # Fencing
//!
//! Two routers may run with one name: a standby that took it once the
//! owner's lease expired, and the old owner, paused past its lease (a
//! SIGSTOP, a long GC-like stall, a network cut) and running again. The
//! old one must store nothing the new one's replay missed, and so
//! acknowledge no such job (docs/replicated.md, "Failover").
//!
//! * Each start that takes the name has an **epoch**: the revision of the
//!   lease key it created ([`owner::Lease::epoch`]; unique, and higher for
//!   every later start). It publishes on `<prefix>.<N>.<gen>.<i>.<epoch>`
//!   only, and a stream takes exactly one subject.
//! * After taking the lease and before reading a stream, the start sets
//!   the stream's subjects to its own ([`fence_streams`]: a stream config
//!   update). From then on the stream does not listen on the old owner's
//!   subject: its publishes get "no responders" and are never stored.
//! * Then it publishes one **marker** on its subject (header
//!   [`message::FENCE_HEADER`], no batch; replay skips it), waits for its
//!   PubAck sequence `S`, and reads the stream up to at least `S`. Why: a
//!   publish of the old owner that the stream's leader proposed before it
//!   applied the config change may still commit after the start read the
//!   stream's state; it is ordered before the marker in the stream's Raft
//!   log, so reading up to `S` includes it. Without the marker the old
//!   owner could get a PubAck (and acknowledge a job) the replay missed.
//! * The old owner learns it is fenced when a publish finds no responders
//!   and the stream's subjects no longer include its own
//!   ([`bridge::still_takes`]), or when a lease renewal finds another
//!   holder ([`owner`]): its shards are fenced (`FaultKind::Fenced`): they
//!   acknowledge and append nothing more, refuse producers
//!   (`STORE_FAILED`), and the router stays up saying `fenced` until it
//!   is stopped.
//! * Publishes carry no `Nats-Expected-*` condition, so any number are in
//!   flight at once.

pub mod bridge;
pub mod connect;
pub mod log;
pub mod message;
pub mod owner;
pub mod ownership;
pub mod peers;
pub mod shared;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, StorageType};
use async_nats::jetstream::ErrorCode;
use futures_util::StreamExt;

use crate::config::{NatsConfig, RouterConfig};
use crate::ids::shard_of;
use crate::joblog::{JobState, Recovered};
use crate::wal::recover::{Replayed, ShardReplay};
use crate::wal::{record, RecoveryReport};
use bridge::Bridge;
use log::{JsLog, LogParams};
use message::{Header, HEADER_BYTES};
use owner::{Layout, Lease};
use shared::JsShared;

pub use log::JsLog as Log;

#[cfg(test)]
mod tests;

/// Why the replicated log cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum JsError {
    /// No NATS server could be reached (or TLS, credentials failed).
    #[error("cannot connect to the NATS JetStream cluster at {urls}: {why}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// What failed.
        why: String,
    },
    /// A secret file (`nats_password_file`, `nats_token_file`,
    /// `nats_nkey_file`) is missing, unreadable, empty, too large or, for
    /// an NKey, not a user seed. The message names the setting and the
    /// file, never the file's contents.
    #[error("setting {setting}: {path}: {why}")]
    Secret {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A live router holds the name.
    #[error(
        "router name {name:?} is held by a live emq-router ({holder}); give this router another router_name, or \
             stop that one (its lease expires nats_lease after it stops renewing)"
    )]
    Held {
        /// The name.
        name: String,
        /// What the holder wrote of itself.
        holder: String,
    },
    /// A stop signal ended a standby's wait for the name
    /// ([`ownership::stop_waiting`]): nothing was taken.
    #[error("stopped while waiting as a standby for router name {name:?}")]
    Stopped {
        /// The name.
        name: String,
    },
    /// A JetStream request failed.
    #[error("JetStream: {what}: {why}")]
    Store {
        /// What was being done.
        what: String,
        /// The error.
        why: String,
    },
    /// A message of a stream is not an emq log message or is damaged.
    #[error(
        "stream {stream}, sequence {seq}: {why}; the job log on JetStream is damaged (was the stream written by \
             something else?)"
    )]
    Damaged {
        /// The stream.
        stream: String,
        /// The message's sequence.
        seq: u64,
        /// What is wrong.
        why: String,
    },
    /// The servers' `max_payload` is too small for a useful part.
    #[error(
        "the NATS servers' max_payload ({max_payload} bytes) is below {needed} bytes: raise max_payload in the \
             nats-server configuration"
    )]
    TooBig {
        /// The server's limit.
        max_payload: usize,
        /// The least emq needs.
        needed: usize,
    },
    /// A thread or runtime could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The store for the router's life: the NATS thread and the lease. A
/// clean stop frees the name ([`Store::close`], also on drop: a start that
/// fails after taking the name frees it too).
pub struct Store {
    bridge: Bridge,
    lease: Option<Lease>,
}

impl Store {
    /// The NATS thread.
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// Frees the router name and stops the NATS thread (after the
    /// publishes in flight end).
    pub fn close(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release(&self.bridge);
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shut();
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("jslog::Store")
    }
}

/// What one shard starts with.
#[derive(Debug)]
pub struct ShardStart {
    /// Its log.
    pub log: JsLog,
    /// What the stream held: facts, no policy applied.
    pub recovered: Recovered,
}

/// The opened replicated log.
pub struct Opened {
    /// The store (keep it for the router's life).
    pub store: Store,
    /// Shard by shard.
    pub shards: Vec<ShardStart>,
    /// What recovery found.
    pub report: RecoveryReport,
    /// The server the router is connected to, for the start-up line.
    pub server: String,
}

/// One stream as read at start.
struct StreamRead {
    /// Its messages: header, sequence, records.
    msgs: Vec<(Header, u64, Vec<u8>)>,
    /// The headers of the messages of repairs' snapshots (they carry
    /// [`message::SNAPSHOT_HEADER`]).
    snapshot_parts: Vec<Header>,
    /// The sequences of the markers ([`message::FENCE_HEADER`]): no
    /// batch, dead for the log (purged with the prefix before them).
    markers: Vec<u64>,
}

fn stream_name(c: &NatsConfig, gen: u32, shard: usize) -> String {
    format!("{}_{}_{gen}_{shard}", c.stream_prefix, c.router_name)
}

fn subject(c: &NatsConfig, gen: u32, shard: usize) -> String {
    format!("{}.{}.{gen}.{shard}", c.stream_prefix, c.router_name)
}

/// The subject the start with `epoch` publishes shard `shard`'s log on:
/// [`subject`]`.<epoch>` (module docs, "Fencing").
fn epoch_subject(c: &NatsConfig, gen: u32, shard: usize, epoch: u64) -> String {
    format!("{}.{epoch}", subject(c, gen, shard))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// Connects to the cluster, takes the router name, replays every shard's
/// stream and opens `config.shards` logs, each with what it recovered (see
/// the module docs). Jobs are stamped as accepted at `now` by a router
/// started at `epoch`. `ownership` hears the wait for the name, its taking and
/// the replay's progress (STATUS; the caller says when it serves).
///
/// # Errors
/// [`JsError`]: no server reachable, the name held by a live router, a
/// stream unreadable or damaged, a server `max_payload` too small, a
/// standby's wait stopped ([`JsError::Stopped`]).
pub fn open(
    config: &RouterConfig,
    epoch: Instant,
    now: Instant,
    ownership: Arc<ownership::Ownership>,
) -> Result<Opened, JsError> {
    let t0 = Instant::now();
    let nats = &config.nats;
    let bridge = Bridge::start(nats)?;
    let info = bridge.client().server_info();
    let server = format!("{} ({}:{}, nats-server {})", info.server_name, info.host, info.port, info.version);
    let max_part = info.max_payload.saturating_sub(HEADER_BYTES + 1024);
    if max_part < 4096 {
        return Err(JsError::TooBig { max_payload: info.max_payload, needed: 4096 + HEADER_BYTES + 1024 });
    }
    let holder = peers::holder_record(config, &hostname());
    let lease = owner::acquire(&bridge, nats, holder.clone(), ownership.clone())?;
    let own = lease.epoch();
    let store = Store { bridge, lease: Some(lease) };
    let bridge = &store.bridge;
    let layout = owner::read_layout(bridge, nats)?;
    // Fenced before they are read, and read up to this start's marker: a
    // previous holder still running (paused past its lease) stores nothing
    // the replay below misses (module docs, "Fencing").
    let markers = match layout {
        Some(l) => fence_streams(bridge, nats, l.gen, usize::from(l.shards), own, &holder)?,
        None => Vec::new(),
    };
    let old: Vec<(usize, StreamRead)> = match layout {
        Some(l) => read_streams(bridge, nats, l, &markers, ownership)?,
        None => Vec::new(),
    };
    let shards = config.shards;
    let boot = old
        .iter()
        .flat_map(|(_, r)| r.msgs.iter().map(|(h, _, _)| h.boot))
        .max()
        .map_or(0, |b| b.saturating_add(1))
        .max((crate::job::unix_ms_now() / 1000) as u32);
    let mut replays: Vec<(usize, Replay)> = std::thread::scope(|s| {
        let handles: Vec<_> = old
            .into_iter()
            .map(|(i, read)| {
                let name = layout.map(|l| stream_name(nats, l.gen, i)).unwrap_or_default();
                (i, s.spawn(move || replay(&name, read, i, epoch, now)))
            })
            .collect();
        handles
            .into_iter()
            .map(|(i, h)| match h.join() {
                Ok(r) => r.map(|r| (i, r)),
                Err(_) => Err(JsError::Io {
                    what: "replay".into(),
                    source: std::io::Error::other("a replay thread panicked"),
                }),
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let same = layout.is_some_and(|l| usize::from(l.shards) == shards)
        && replays.iter().all(|(i, r)| r.state.jobs.values().all(|j| shard_of(j.job.queue_bytes(), shards) == *i));
    let gen = match layout {
        Some(l) if same => l.gen,
        Some(l) => l.gen + 1,
        None => 1,
    };
    let streams: Vec<String> = (0..shards).map(|i| stream_name(nats, gen, i)).collect();
    if !same {
        // Streams of this generation before the layout names it are left
        // by a start that stopped half-way: never holders of acknowledged
        // jobs (the layout key moves only once they are written).
        clear_unnamed(bridge, nats, gen, shards, layout.is_none())?;
    }
    // A new generation's streams are made with this start's subject: no
    // earlier owner ever wrote them.
    let mut next_seqs = make_streams(bridge, nats, gen, own, &streams)?;
    if same {
        for (next, m) in next_seqs.iter_mut().zip(&markers) {
            *next = (*next).max(m + 1);
        }
    }
    let params = |i: usize| LogParams {
        shard: i,
        shards,
        boot,
        subject: epoch_subject(nats, gen, i, own).into(),
        max_part,
        give_up: nats.give_up,
        chunk_bytes: crate::limits::NATS_CHUNK_BYTES,
    };
    let shared: Vec<Arc<JsShared>> = streams
        .iter()
        .enumerate()
        .map(|(i, n)| Arc::new(JsShared::new(i, n.clone(), epoch_subject(nats, gen, i, own))))
        .collect();
    bridge.attach(shared.clone());
    let mut report = RecoveryReport::default();
    for (_, r) in &replays {
        report.records += r.state.records;
        report.bytes += r.state.bytes;
    }
    let mut starts = Vec::with_capacity(shards);
    if same {
        for i in 0..shards {
            let at = replays.iter().position(|(j, _)| *j == i);
            let r = at.map(|k| replays.swap_remove(k).1).unwrap_or_default();
            let mut live: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
            for j in r.state.jobs.values() {
                let e = live.entry(j.job.log_tag()).or_default();
                e.0 += 1;
                e.1 += record::accepted_len(&j.job) as u64;
            }
            let max_seq = r.state.max_seq;
            let keys = Vec::from(r.state.keys);
            let jobs = crate::wal::facts(r.state.jobs.into_values());
            let mut log =
                JsLog::new(params(i), bridge.publisher(), shared[i].clone(), live, r.next_chunk, r.seqs, next_seqs[i]);
            for j in jobs.iter().filter(|j| matches!(j.state, JobState::InFlight)) {
                log.lend(&j.job);
            }
            starts.push(ShardStart { log, recovered: Recovered { jobs, accepted: max_seq, keys } });
        }
    } else {
        let old_gen = layout.map(|l| (l.gen, usize::from(l.shards)));
        if let Some((g, n)) = old_gen {
            tracing::warn!(
                old_shards = n,
                shards,
                old_gen = g,
                gen,
                "the log's layout changes (shard count): rewriting it into new streams"
            );
        }
        let mut per_shard: Vec<Vec<Replayed>> = (0..shards).map(|_| Vec::new()).collect();
        for (_, r) in replays {
            for (_, rep) in r.state.jobs {
                per_shard[shard_of(rep.job.queue_bytes(), shards)].push(rep);
            }
        }
        for (i, jobs) in per_shard.into_iter().enumerate() {
            let mut jobs = crate::wal::facts(jobs);
            jobs.sort_by_key(|r| matches!(r.state, JobState::Dead { .. }));
            let mut log = JsLog::new(
                params(i),
                bridge.publisher(),
                shared[i].clone(),
                BTreeMap::new(),
                1,
                BTreeMap::new(),
                next_seqs[i],
            );
            if !crate::joblog::relog(&mut log, i, &mut jobs) {
                return Err(JsError::Store {
                    what: format!("writing the new layout into {}", streams[i]),
                    why: "the store did not confirm it within nats_give_up".into(),
                });
            }
            let accepted = jobs.len() as u64;
            starts.push(ShardStart { log, recovered: Recovered { jobs, accepted, keys: Vec::new() } });
        }
        owner::write_layout(bridge, nats, Layout { gen, shards: shards as u16 })?;
        if let Some((g, n)) = old_gen {
            let names: Vec<String> = (0..n).map(|i| stream_name(nats, g, i)).collect();
            delete_streams(bridge, names);
        }
        report.relayout = old_gen.is_some();
    }
    report.millis = t0.elapsed().as_millis() as u64;
    for s in &starts {
        let stats = &s.log.shared().stats;
        stats.jobs_recovered.store(s.recovered.jobs.len() as u64, Ordering::Relaxed);
        stats.recovery_ms.store(report.millis, Ordering::Relaxed);
        report.count(&s.recovered.jobs);
    }
    if let Some(lease) = &store.lease {
        lease.attach(shared);
    }
    tracing::info!(
        router_name = %nats.router_name,
        server = %server,
        gen,
        epoch = own,
        boot,
        jobs = report.jobs,
        in_flight = report.in_flight,
        dead = report.dead,
        records = report.records,
        bytes = report.bytes,
        relayout = report.relayout,
        millis = report.millis,
        "replicated job log recovered from JetStream"
    );
    Ok(Opened { store, shards: starts, report, server })
}

/// Reads every stream of `layout` (concurrently, on the NATS thread),
/// stream `i` up to at least sequence `markers[i]` (this start's marker,
/// module docs "Fencing"; 0: none), each tried again from its start for
/// up to `nats_give_up` while it fails for a passing reason
/// ([`read_stream_within`]).
fn read_streams(
    bridge: &Bridge,
    nats: &NatsConfig,
    layout: Layout,
    markers: &[u64],
    own: Arc<ownership::Ownership>,
) -> Result<Vec<(usize, StreamRead)>, JsError> {
    let names: Vec<String> = (0..usize::from(layout.shards)).map(|i| stream_name(nats, layout.gen, i)).collect();
    let markers: Vec<u64> = (0..names.len()).map(|i| markers.get(i).copied().unwrap_or(0)).collect();
    let (idle, within) = (nats.ack_timeout * 5, nats.give_up);
    own.streams_to_read(names.len());
    bridge.call(move |ctx| async move {
        let mut set = tokio::task::JoinSet::new();
        for ((i, name), at_least) in names.into_iter().enumerate().zip(markers) {
            let js = ctx.js.clone();
            set.spawn(async move { read_stream_within(js, name, idle, within, at_least).await.map(|r| (i, r)) });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok(r) => {
                    let r = r?;
                    own.stream_read(r.1.msgs.len() as u64);
                    out.push(r);
                }
                Err(e) => return Err(JsError::Store { what: "reading the log streams".into(), why: e.to_string() }),
            }
        }
        out.sort_by_key(|(i, _)| *i);
        Ok(out)
    })?
}

/// Why one read of a stream failed.
enum ReadFailed {
    /// The stream is gone or holds what no emq router wrote: reading it
    /// again changes nothing.
    For(JsError),
    /// A request timed out or found no responders (a stream leader being
    /// elected, a server restarting): worth reading again.
    Passing(JsError),
}

/// [`read_stream`] (up to at least sequence `at_least`) again from the
/// start, with the publishes' back-off,
/// while it fails for a passing reason and `within` has not passed: a
/// router restarted while its streams elect a leader (a server of the
/// cluster lost with the router's machine) waits for the election rather
/// than failing its start.
///
/// # Errors
/// [`JsError::Store`] for a stream that is gone or a read still failing
/// at `within`; [`JsError::Damaged`] for a message emq cannot read.
async fn read_stream_within(
    js: async_nats::jetstream::Context,
    name: String,
    idle: Duration,
    within: Duration,
    at_least: u64,
) -> Result<StreamRead, JsError> {
    let deadline = Instant::now() + within;
    let mut backoff = crate::limits::NATS_RETRY_MIN;
    loop {
        match read_stream(&js, &name, idle, at_least).await {
            Ok(read) => return Ok(read),
            Err(ReadFailed::Passing(e)) if Instant::now() + backoff < deadline => {
                crate::log_limited!(warn, stream = %name, error = %e, "reading a log stream at start failed; reading it again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(crate::limits::NATS_RETRY_MAX);
            }
            Err(ReadFailed::Passing(e) | ReadFailed::For(e)) => return Err(e),
        }
    }
}

/// Every message of stream `name` up to its last sequence when asked, and
/// at least up to `at_least`; markers ([`message::FENCE_HEADER`]) are
/// only noted.
async fn read_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    idle: Duration,
    at_least: u64,
) -> Result<StreamRead, ReadFailed> {
    let err = |why: String| ReadFailed::Passing(JsError::Store { what: format!("reading stream {name}"), why });
    let mut stream = js.get_stream(name).await.map_err(|e| match e.kind() {
        GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
            ReadFailed::For(JsError::Store {
                what: format!("reading stream {name}"),
                why: format!("{e} (the layout names this stream: was it deleted by hand? its jobs are gone)"),
            })
        }
        _ => err(e.to_string()),
    })?;
    let state = stream.info().await.map_err(|e| err(e.to_string()))?.state.clone();
    let mut read = StreamRead { msgs: Vec::new(), snapshot_parts: Vec::new(), markers: Vec::new() };
    if state.messages == 0 && at_least == 0 {
        return Ok(read);
    }
    let last = state.last_sequence.max(at_least);
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut msgs = consumer.messages().await.map_err(|e| err(e.to_string()))?;
    loop {
        let m = match tokio::time::timeout(idle, msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(err(e.to_string())),
            Ok(None) => break,
            Err(_) => return Err(err(format!("no message for {idle:?} before the last sequence {last}"))),
        };
        let seq = m.info().map_err(|e| err(e.to_string()))?.stream_sequence;
        if m.headers.as_ref().is_some_and(|h| h.get(message::FENCE_HEADER).is_some()) {
            // A marker (of this start or an earlier one): no batch.
            read.markers.push(seq);
            if seq >= last {
                break;
            }
            continue;
        }
        let (header, records) = Header::decode(&m.payload)
            .map_err(|why| ReadFailed::For(JsError::Damaged { stream: name.to_string(), seq, why }))?;
        if m.headers.as_ref().is_some_and(|h| h.get(message::SNAPSHOT_HEADER).is_some()) {
            read.snapshot_parts.push(header);
        }
        read.msgs.push((header, seq, records.to_vec()));
        if seq >= last {
            break;
        }
    }
    Ok(read)
}

/// Makes the layout's streams, taking this start's subjects (`epoch`), or
/// finds them (fenced already, [`fence_streams`]); each one's next
/// sequence. Each is tried for `nats_give_up` ([`bridge::retried`]).
fn make_streams(
    bridge: &Bridge,
    nats: &NatsConfig,
    gen: u32,
    epoch: u64,
    names: &[String],
) -> Result<Vec<u64>, JsError> {
    let configs: Vec<stream::Config> = names
        .iter()
        .enumerate()
        .map(|(i, name)| stream::Config {
            name: name.clone(),
            subjects: vec![epoch_subject(nats, gen, i, epoch)],
            storage: StorageType::File,
            num_replicas: nats.replicas,
            duplicate_window: nats.dedup_window,
            description: Some(format!("emq job log: router {}, shard {i}", nats.router_name)),
            ..Default::default()
        })
        .collect();
    let within = nats.give_up;
    bridge.call(move |ctx| async move {
        let mut out = Vec::new();
        for c in configs {
            let what = format!("making stream {}", c.name);
            let s = bridge::retried(&what, within, || ctx.js.get_or_create_stream(c.clone()))
                .await
                .map_err(|e| JsError::Store { what, why: e.to_string() })?;
            // As made or found (the answer to the request holds its state).
            out.push(s.cached_info().state.last_sequence + 1);
        }
        Ok(out)
    })?
}

/// Fences generation `gen`'s `shards` streams for the start with `epoch`
/// (module docs, "Fencing"; docs/replicated.md, "Failover"): sets each
/// one's subjects to this start's alone (a config update, when they are
/// not so already), then publishes a marker on it ([`message::FENCE_HEADER`]
/// with `holder`) and waits for its PubAck. Each stream's marker sequence,
/// to read up to at least; 0 for a stream not found (its read says so).
/// Each stream is tried for `nats_give_up` ([`bridge::retried`]).
///
/// # Errors
/// [`JsError::Store`] when a stream cannot be updated or its marker is not
/// stored within `nats_give_up`.
fn fence_streams(
    bridge: &Bridge,
    nats: &NatsConfig,
    gen: u32,
    shards: usize,
    epoch: u64,
    holder: &str,
) -> Result<Vec<u64>, JsError> {
    let jobs: Vec<(String, String)> =
        (0..shards).map(|i| (stream_name(nats, gen, i), epoch_subject(nats, gen, i, epoch))).collect();
    let (within, holder) = (nats.give_up, holder.to_string());
    bridge.call(move |ctx| async move {
        let mut out = Vec::with_capacity(jobs.len());
        for (name, own) in jobs {
            let what = format!("fencing stream {name}");
            let seq = bridge::retried(&what, within, || fence_one(&ctx, &name, &own, &holder))
                .await
                .map_err(|why| JsError::Store { what, why })?;
            out.push(seq);
        }
        Ok(out)
    })?
}

/// [`fence_streams`] for one stream `name`: its subjects set to `[own]`,
/// then the marker's sequence (0: no such stream).
async fn fence_one(ctx: &bridge::Ctx, name: &str, own: &str, holder: &str) -> Result<u64, String> {
    let stream = match ctx.js.get_stream(name).await {
        Ok(s) => s,
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => return Ok(0),
            _ => return Err(e.to_string()),
        },
    };
    let config = &stream.cached_info().config;
    if config.subjects != [own] {
        let mut config = config.clone();
        let old = std::mem::replace(&mut config.subjects, vec![own.to_string()]);
        ctx.js.update_stream(config).await.map_err(|e| e.to_string())?;
        tracing::info!(stream = name, old_subjects = ?old, subject = own, "stream fenced: it takes this start's subject only");
    }
    let marker = PublishMessage::build().header(message::FENCE_HEADER, holder).payload(bytes::Bytes::new());
    let ack = ctx.js.send_publish(own.to_string(), marker).await.map_err(|e| e.to_string())?;
    Ok(ack.await.map_err(|e| e.to_string())?.sequence)
}

/// Deletes generation `gen`'s streams, which no layout names yet (module
/// docs). With no layout at all (`first`), a stream of the name holding
/// messages is refused instead: its layout key was lost, not its jobs.
fn clear_unnamed(bridge: &Bridge, nats: &NatsConfig, gen: u32, shards: usize, first: bool) -> Result<(), JsError> {
    let prefix = format!("{}_{}_{gen}_", nats.stream_prefix, nats.router_name);
    let (bucket, name) = (format!("{}_layouts", nats.stream_prefix), nats.router_name.clone());
    let found = bridge.call(move |ctx| async move {
        let mut names = ctx.js.stream_names();
        let mut found = Vec::new();
        while let Some(n) = names.next().await {
            match n {
                Ok(n) if n.starts_with(&prefix) => found.push(n),
                Ok(_) => {}
                Err(e) => return Err(JsError::Store { what: "listing streams".into(), why: e.to_string() }),
            }
        }
        let mut held = Vec::new();
        for n in &found {
            if let Ok(mut s) = ctx.js.get_stream(n).await {
                if s.info().await.is_ok_and(|i| i.state.messages > 0) {
                    held.push(n.clone());
                }
            }
        }
        Ok((found, held))
    })??;
    let (found, held) = found;
    if first && !held.is_empty() {
        return Err(JsError::Store {
            what: format!("router name {name}"),
            why: format!(
                "streams {held:?} hold jobs but the key-value bucket {bucket} has no layout for the name (deleted \
                 by hand?); put the key back ({{\"gen\":{gen},\"shards\":N}}) or delete the streams"
            ),
        });
    }
    if !found.is_empty() {
        tracing::warn!(streams = ?found, shards, "deleting streams a start that stopped half-way left behind");
        delete_streams(bridge, found);
    }
    Ok(())
}

fn delete_streams(bridge: &Bridge, names: Vec<String>) {
    let result = bridge.call(move |ctx| async move {
        for n in names {
            if let Err(e) = ctx.js.delete_stream(&n).await {
                tracing::warn!(stream = %n, error = %e, "could not delete a stream of the old layout; delete it by hand");
            }
        }
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not delete the old layout's streams");
    }
}

/// One stream replayed.
#[derive(Default)]
struct Replay {
    state: ShardReplay,
    /// Acknowledged messages: sequence → (chunk, bytes).
    seqs: BTreeMap<u64, (u32, u64)>,
    next_chunk: u32,
}

/// The `(boot, ticket)` of the last repair's snapshot whose every part is
/// among `parts` (the headers of the messages marked as snapshot parts).
fn last_whole_snapshot(parts: &[Header]) -> Option<(u32, u64)> {
    let mut seen: BTreeMap<(u32, u64), (u16, std::collections::BTreeSet<u16>)> = BTreeMap::new();
    for h in parts {
        seen.entry((h.boot, h.ticket)).or_insert((h.parts, Default::default())).1.insert(h.part);
    }
    seen.into_iter().rev().find(|(_, (parts, got))| got.len() == usize::from(*parts)).map(|(at, _)| at)
}

/// Applies a stream's batches in `(boot, ticket)` order (see [`message`]),
/// each one's parts joined, counting them into chunks as the log does. A
/// batch with a part missing was never acknowledged (a give-up): it is
/// skipped, counted and logged. A part stored twice (a publish retried
/// after its dedup window) counts once. Batches before the last whole
/// snapshot of a repair are superseded by it: skipped, and counted in a
/// dead chunk (0) so that the log purges them.
fn replay(name: &str, mut read: StreamRead, index: usize, epoch: Instant, now: Instant) -> Result<Replay, JsError> {
    read.msgs.sort_by_key(|(h, seq, _)| (h.boot, h.ticket, h.part, *seq));
    let mut out = Replay { state: ShardReplay { index, ..Default::default() }, ..Default::default() };
    // Markers hold no records: dead (chunk 0), purged with what precedes them.
    out.seqs.extend(read.markers.iter().map(|m| (*m, (0, 0))));
    let (mut chunk, mut in_chunk, mut incomplete) = (1u32, 0u64, 0u64);
    let barrier = last_whole_snapshot(&read.snapshot_parts);
    let (old, live): (Vec<_>, Vec<_>) =
        read.msgs.into_iter().partition(|(h, _, _)| barrier.is_some_and(|b| (h.boot, h.ticket) < b));
    for (_, seq, records) in &old {
        out.seqs.insert(*seq, (0, records.len() as u64));
        out.state.bytes += records.len() as u64;
    }
    if !old.is_empty() {
        tracing::info!(
            stream = name,
            messages = old.len(),
            "messages before the last repair's snapshot skipped: it supersedes them"
        );
    }
    let mut msgs = live.into_iter().peekable();
    let mut batch = Vec::new();
    while let Some((head, seq, records)) = msgs.next() {
        out.seqs.insert(seq, (chunk, records.len() as u64));
        out.state.bytes += records.len() as u64;
        let mut next_part = 1u16;
        let mut complete = head.part == 0;
        batch.clear();
        batch.extend_from_slice(&records);
        while let Some((h, _, _)) = msgs.peek() {
            if (h.boot, h.ticket) != (head.boot, head.ticket) {
                break;
            }
            let Some((h, seq, records)) = msgs.next() else { break };
            out.seqs.insert(seq, (chunk, records.len() as u64));
            out.state.bytes += records.len() as u64;
            if h.part == next_part {
                batch.extend_from_slice(&records);
                next_part += 1;
            } else if h.part >= next_part {
                complete = false;
            }
        }
        if !complete || next_part != head.parts {
            incomplete += 1;
            continue;
        }
        let mut at = 0;
        while at < batch.len() {
            let (rec, len) = record::decode(&batch[at..]).map_err(|e| JsError::Damaged {
                stream: name.to_string(),
                seq,
                why: format!("record at byte {at} of its batch: {e}"),
            })?;
            if let Err(why) = crate::wal::recover::apply(&rec, chunk, epoch, now, &mut out.state) {
                return Err(JsError::Damaged { stream: name.to_string(), seq, why });
            }
            at += len;
        }
        in_chunk += batch.len() as u64;
        if in_chunk >= crate::limits::NATS_CHUNK_BYTES {
            chunk += 1;
            in_chunk = 0;
        }
    }
    if incomplete > 0 {
        tracing::warn!(
            stream = name,
            batches = incomplete,
            "batches with a part missing skipped (never acknowledged: their publish was given up)"
        );
    }
    out.next_chunk = chunk + 1;
    Ok(out)
}
