//! [`JsLog`]: one shard's job log on a JetStream stream, the replicated
//! implementation of [`JobLog`].
//!
//! The hooks append the same records as the local log (`crate::wal::record`)
//! to a batch; [`JobLog::commit`] hands the batch to the NATS thread as one
//! message (several when it passes the server's max payload) under a new
//! ticket and returns [`Commit::After`] it: what the batch promised leaves
//! once the store acknowledged every ticket up to it (`jslog::shared`).
//! While [`limits::NATS_SHARD_BATCHES_IN_FLIGHT`] of the shard's batches
//! await their PubAcks, a commit holds its records back instead and the
//! next commits add theirs: they go out together under the next ticket
//! (which is what their commits return) once one of those is confirmed
//! (the shard looks every [`limits::NATS_HELD_RECHECK`]), so a busy shard
//! sends fewer, larger messages rather than queueing many small ones.
//!
//! # Chunks and purging
//!
//! Tickets are grouped into chunks of about [`limits::NATS_CHUNK_BYTES`] of
//! records; a job's [`Job::log_tag`] is the chunk of its latest `Accepted`
//! record, and each chunk counts its live jobs. The log knows the stream
//! sequence of every acknowledged message; the stream is purged below the
//! first sequence that is unknown or belongs to a chunk with a live job,
//! so a purge never removes a record a live job needs, nor a message whose
//! PubAck has not arrived. Compaction copies
//! waiting and dead jobs forward out of old chunks (a new `Accepted`
//! record, and `Buried` for a dead one) when the stream holds more than
//! [`limits::WAL_DISK_FACTOR`] × the live jobs' records plus one chunk, so
//! the old chunks die and are purged; jobs in flight are copied too (with a
//! `Dispatched` record after), since a purge stops at the first live chunk.
//! A pass follows the last one once half a chunk more is logged, or once
//! the log has written nothing for [`limits::NATS_COMPACT_REST`]: a stream
//! at rest is within the bound.
//!
//! # Faults
//!
//! A batch the store did not confirm within `nats_give_up` makes the log
//! faulty (`Unreachable`): new jobs are refused (`STORE_FAILED`), the
//! acceptances waiting for the batch are refused, and [`JobLog::maintain`]
//! repairs the log: it publishes a snapshot of every live job (from the
//! shard's memory and its copies of dispatched jobs), and once the snapshot
//! is acknowledged everything before it is superseded and purged; a
//! snapshot the store gives up on too (the cluster is still unreachable)
//! is published again, after a back-off doubling from 1 s to 60 s. Meanwhile
//! consumers are served from memory and their records are published as
//! usual (a crash before the store confirms them may redeliver a job: at
//! least once).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::bridge::{Publish, Publisher};
use super::message::{Header, HEADER_BYTES};
use super::shared::JsShared;
use crate::ids::{FastMap, JobId, QueueName};
use crate::job::{DeadJob, Job};
use crate::joblog::{Commit, Durable, FaultKind, Holdings, JobLog, LogStatus, StoreFault, Ticket};
use crate::limits;
use crate::wal::record;

/// What a shard's log is told once, at its making.
#[derive(Debug, Clone)]
pub struct LogParams {
    /// The shard.
    pub shard: usize,
    /// The layout's shard count.
    pub shards: usize,
    /// This start's boot number (see `jslog::message`).
    pub boot: u32,
    /// The subject this start publishes on: the stream's only subject,
    /// `<prefix>.<name>.<gen>.<shard>.<epoch>` (`jslog` module docs,
    /// "Fencing").
    pub subject: Arc<str>,
    /// Largest part of a batch in one message (the server's max payload
    /// less the header and room for NATS headers): a larger batch, or a
    /// record larger than this, is cut into parts.
    pub max_part: usize,
    /// `nats_give_up` (how long [`JobLog::sync_all`] may wait).
    pub give_up: Duration,
    /// Record bytes per chunk ([`limits::NATS_CHUNK_BYTES`]).
    pub chunk_bytes: u64,
}

/// One chunk's counts.
#[derive(Debug, Default, Clone)]
struct Chunk {
    /// Jobs whose latest `Accepted` record is here, and their bytes.
    live: u64,
    live_bytes: u64,
}

/// A compaction pass (as the local log's).
#[derive(Debug)]
struct Pass {
    /// Chunks to empty: every chunk older than the current one when the
    /// pass began.
    below: u32,
    queues: Vec<QueueName>,
    at: usize,
    pos: usize,
    dead_at: u64,
}

/// One shard's replicated log (module docs).
#[derive(Debug)]
pub struct JsLog {
    params: LogParams,
    publisher: Publisher,
    shared: Arc<JsShared>,
    /// The batch's records.
    buf: Vec<u8>,
    /// The last ticket handed out.
    ticket: u64,
    /// Chunks by number, and the current one.
    chunks: BTreeMap<u32, Chunk>,
    current: u32,
    /// Record bytes logged into the current chunk.
    current_bytes: u64,
    /// Unacknowledged tickets: their chunk and bytes.
    tickets: BTreeMap<u64, (u32, u64)>,
    /// Acknowledged messages not purged: sequence → (chunk, bytes).
    seqs: BTreeMap<u64, (u32, u64)>,
    /// Bytes of `seqs`.
    stream_bytes: u64,
    /// Bytes handed out and not acknowledged.
    unconfirmed_bytes: u64,
    /// Everything below this sequence is purged (or asked to be).
    purged_below: u64,
    last_purge: Option<Instant>,
    /// When the purge to `purged_below` was last asked for, while the NATS
    /// thread has not reported it done (asked again after
    /// [`limits::NATS_PURGE_RETRY`]).
    purge_unconfirmed: Option<Instant>,
    /// Dispatched jobs not back, by id (as the local log's `lent`).
    lent: FastMap<JobId, Job>,
    pass: Option<Pass>,
    logged: u64,
    last_pass_at: u64,
    /// When a commit last published records.
    last_logged: Option<Instant>,
    last_commit: Option<Instant>,
    /// Something died or was acknowledged since the last look for a purge.
    dirty: bool,
    /// The repair's snapshot ticket and chunk while it is in flight.
    snapshot: Option<(u64, u32)>,
    /// When a repair may be tried next, and the wait after a failed one.
    next_repair: Option<Instant>,
    repair_backoff: Duration,
}

impl JsLog {
    /// A log appending to `params.subject` through `publisher`, starting
    /// with what recovery found: `chunks` (live jobs and their bytes by
    /// chunk), the next chunk number `next`, the stream's messages
    /// (sequence → chunk and bytes) and the sequence its next message gets.
    pub fn new(
        params: LogParams,
        publisher: Publisher,
        shared: Arc<JsShared>,
        chunks: BTreeMap<u32, (u64, u64)>,
        next: u32,
        seqs: BTreeMap<u64, (u32, u64)>,
        next_seq: u64,
    ) -> JsLog {
        let stream_bytes = seqs.values().map(|(_, b)| b).sum();
        let purged_below = seqs.keys().next().copied().unwrap_or(next_seq);
        let chunks = chunks.into_iter().map(|(n, (live, live_bytes))| (n, Chunk { live, live_bytes })).collect();
        let mut log = JsLog {
            params,
            publisher,
            shared,
            buf: Vec::new(),
            ticket: 0,
            chunks,
            current: next,
            current_bytes: 0,
            tickets: BTreeMap::new(),
            seqs,
            stream_bytes,
            unconfirmed_bytes: 0,
            purged_below,
            last_purge: None,
            purge_unconfirmed: None,
            lent: FastMap::default(),
            pass: None,
            logged: 0,
            last_pass_at: 0,
            last_logged: None,
            last_commit: None,
            dirty: true,
            snapshot: None,
            next_repair: None,
            repair_backoff: Duration::from_secs(1),
        };
        log.chunks.entry(next).or_default();
        log.update_stats();
        log
    }

    /// Knows `job` as dispatched without logging it again (in flight when
    /// the log was last open).
    pub fn lend(&mut self, job: &Job) {
        self.lent.insert(job.id, job.clone());
    }

    /// The shared state (for the router: the lease, STATUS).
    pub fn shared(&self) -> &Arc<JsShared> {
        &self.shared
    }

    fn append_accepted(&mut self, job: &mut Job) {
        let len = record::accepted_len(job);
        record::encode_accepted(job, &mut self.buf);
        job.set_log_tag(self.current);
        let c = self.chunks.entry(self.current).or_default();
        c.live += 1;
        c.live_bytes += len as u64;
        self.logged += len as u64;
        self.current_bytes += len as u64;
    }

    fn append_id(&mut self, encode: impl FnOnce(&mut Vec<u8>), len: usize) {
        encode(&mut self.buf);
        self.logged += len as u64;
        self.current_bytes += len as u64;
    }

    fn count_out(&mut self, chunk: u32, bytes: usize) {
        self.dirty = true;
        if let Some(c) = self.chunks.get_mut(&chunk) {
            c.live = c.live.saturating_sub(1);
            c.live_bytes = c.live_bytes.saturating_sub(bytes as u64);
        }
    }

    /// A job the log saw dispatched comes back: its tag is its copy's.
    fn returned(&mut self, job: &mut Job) {
        if let Some(copy) = self.lent.remove(&job.id) {
            job.set_log_tag(copy.log_tag());
        }
    }

    /// A new `Accepted` record of `job` in the current chunk (compaction).
    fn copy_forward(&mut self, job: &mut Job) {
        let (from, len) = (job.log_tag(), record::accepted_len(job));
        self.append_accepted(job);
        self.count_out(from, len);
        self.shared.stats.relocated_jobs.fetch_add(1, Ordering::Relaxed);
    }

    fn append_buried(&mut self, dead: &DeadJob) {
        let job = &dead.job;
        let (id, redeliveries, why, at) = (job.id, job.redeliveries(), dead.why, dead.at_unix_ms);
        self.append_id(|b| record::encode_buried(id, redeliveries, why, at, b), record::BURIED_RECORD_BYTES);
    }

    /// Hands the batch to the NATS thread under a new ticket.
    fn publish_batch(&mut self, snapshot: bool) {
        if self.buf.is_empty() {
            return;
        }
        self.ticket += 1;
        let ticket = self.ticket;
        let buf = std::mem::take(&mut self.buf);
        // Parts are cut anywhere: replay joins them before decoding.
        let part_bytes = self.params.max_part.max(buf.len().div_ceil(usize::from(u16::MAX))).max(1);
        let mut bounds: Vec<usize> = (0..buf.len()).step_by(part_bytes).collect();
        bounds.push(buf.len());
        let parts = (bounds.len() - 1) as u16;
        if snapshot {
            self.shared.snapshot(ticket, parts);
        } else {
            self.shared.handed(ticket, parts);
        }
        self.tickets.insert(ticket, (self.current, buf.len() as u64));
        self.unconfirmed_bytes += buf.len() as u64;
        for (part, w) in bounds.windows(2).enumerate() {
            let header = Header {
                shard: self.params.shard as u16,
                shards: self.params.shards as u16,
                boot: self.params.boot,
                ticket,
                part: part as u16,
                parts,
            };
            let mut payload = Vec::with_capacity(HEADER_BYTES + w[1] - w[0]);
            header.encode(&mut payload);
            payload.extend_from_slice(&buf[w[0]..w[1]]);
            let sent = self.publisher.publish(Publish {
                shard: self.params.shard,
                ticket,
                part: part as u16,
                subject: self.params.subject.clone(),
                msg_id: format!("{}.{}.{}", self.params.boot, ticket, part),
                payload: Bytes::from(payload),
                snapshot,
            });
            if !sent {
                tracing::error!(
                    shard = self.params.shard,
                    "the NATS thread is gone: a batch of the job log is not published"
                );
            }
        }
        if self.current_bytes >= self.params.chunk_bytes {
            self.current += 1;
            self.current_bytes = 0;
            self.chunks.entry(self.current).or_default();
        }
    }

    /// Takes the PubAcks that arrived: the sequences of the messages.
    fn take_acks(&mut self) {
        // Read before the take: every part of a ticket up to this mark was
        // reported before the mark passed it, so its acks are in this take
        // or an earlier one. (Read after it, a ticket whose ack came in
        // meanwhile was dropped before its ack was counted: its bytes stayed
        // unconfirmed for good, and its sequence unknown.)
        let durable = self.shared.durable_upto().0;
        for a in self.shared.take_acked() {
            self.dirty = true;
            let Some((chunk, bytes)) = self.tickets.get_mut(&a.ticket) else { continue };
            let chunk = *chunk;
            // A ticket's bytes are counted once, on its first part.
            let counted = if a.part == 0 { std::mem::take(bytes) } else { 0 };
            if a.seq >= self.purged_below && self.seqs.insert(a.seq, (chunk, counted)).is_none() {
                self.stream_bytes += counted;
            }
            self.unconfirmed_bytes = self.unconfirmed_bytes.saturating_sub(counted);
            if self.snapshot.is_some_and(|(t, _)| t == a.ticket) && self.shared.make_durable(Ticket(a.ticket)) {
                self.snapshot_done();
            }
        }
        // The tickets the mark passed are done with. One whose first part
        // was never acknowledged (given up, then superseded by a repair's
        // snapshot) is no longer unconfirmed either.
        while let Some((&t, &(_, bytes))) = self.tickets.first_key_value() {
            if t > durable {
                break;
            }
            self.unconfirmed_bytes = self.unconfirmed_bytes.saturating_sub(bytes);
            self.tickets.remove(&t);
        }
    }

    /// The repair's snapshot is stored: every older message is superseded.
    fn snapshot_done(&mut self) {
        let Some((_, chunk)) = self.snapshot.take() else { return };
        let first = self.seqs.iter().find(|(_, (c, _))| *c >= chunk).map(|(s, _)| *s);
        if let Some(first) = first {
            let old: Vec<u64> = self.seqs.range(..first).map(|(s, _)| *s).collect();
            for s in old {
                if let Some((_, b)) = self.seqs.remove(&s) {
                    self.stream_bytes = self.stream_bytes.saturating_sub(b);
                }
            }
            self.purge_below(first, Instant::now());
        }
        self.repair_backoff = Duration::from_secs(1);
        self.next_repair = None;
    }

    fn purge_below(&mut self, below: u64, now: Instant) {
        if below > self.purged_below {
            self.purged_below = below;
            self.last_purge = Some(now);
            self.purge_unconfirmed = Some(now);
            self.publisher.purge(self.params.shard, below);
        }
    }

    /// Asks again for a purge not reported done within
    /// [`limits::NATS_PURGE_RETRY`] (the NATS thread counts a failed one in
    /// `purge_errors` and does not try it again itself).
    fn purge_again(&mut self, now: Instant) {
        let Some(asked) = self.purge_unconfirmed else { return };
        if self.shared.stats.purged_below.load(Ordering::Relaxed) >= self.purged_below {
            self.purge_unconfirmed = None;
        } else if now.saturating_duration_since(asked) >= limits::NATS_PURGE_RETRY {
            self.purge_unconfirmed = Some(now);
            self.publisher.purge(self.params.shard, self.purged_below);
        }
    }

    /// Purges the stream below the first message that is unknown or holds
    /// a live chunk (module docs), at most once a second.
    fn purge_dead_prefix(&mut self, now: Instant) {
        if !self.dirty || self.last_purge.is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        self.dirty = false;
        // With nothing unconfirmed every message the store holds is known:
        // a gap is a message this log does not count (given up, then
        // stored late), and dead.
        let quiet = self.shared.unconfirmed() == 0;
        let mut expect = self.purged_below;
        let mut gone = Vec::new();
        for (&seq, &(chunk, _)) in &self.seqs {
            if seq != expect && !quiet {
                break;
            }
            // The current chunk too: a job accepted into it later is in a
            // later message, which this purge does not reach.
            let live = self.chunks.get(&chunk).is_some_and(|c| c.live > 0);
            if live {
                expect = seq;
                break;
            }
            gone.push(seq);
            expect = seq + 1;
        }
        for s in &gone {
            if let Some((_, b)) = self.seqs.remove(s) {
                self.stream_bytes = self.stream_bytes.saturating_sub(b);
            }
        }
        let dead_chunks: Vec<u32> = self
            .chunks
            .iter()
            .filter(|(n, c)| **n < self.current && c.live == 0)
            .map(|(n, _)| *n)
            .filter(|n| !self.seqs.values().any(|(c, _)| c == n) && !self.tickets.values().any(|(c, _)| c == n))
            .collect();
        for n in dead_chunks {
            self.chunks.remove(&n);
        }
        self.purge_below(expect, now);
    }

    fn compact_step(&mut self, now: Instant, holdings: &mut dyn Holdings) {
        if self.pass.is_none() {
            self.pass = self.plan(holdings, now);
        }
        let Some(mut pass) = self.pass.take() else { return };
        let (mut looked, start) = (0, self.logged);
        while looked < limits::WAL_COMPACT_STEP_JOBS && self.logged - start < limits::WAL_COMPACT_STEP_BYTES as u64 {
            let max = limits::WAL_COMPACT_STEP_JOBS - looked;
            let below = pass.below;
            let Some(queue) = pass.queues.get(pass.at).cloned() else {
                let (seen, next) = holdings.visit_dead(pass.dead_at, max, &mut |d| {
                    if d.job.log_tag() < below {
                        self.copy_forward(&mut d.job);
                        self.append_buried(d);
                    }
                });
                looked += seen.max(1);
                match next {
                    Some(at) => pass.dead_at = at,
                    None => {
                        self.relocate_lent(below);
                        self.last_pass_at = self.logged;
                        return;
                    }
                }
                continue;
            };
            let (seen, next) = holdings.visit_waiting(&queue, pass.pos, max, &mut |job| {
                if job.log_tag() < below {
                    self.copy_forward(job);
                }
            });
            looked += seen.max(1);
            match next {
                Some(pos) => pass.pos = pos,
                None => (pass.at, pass.pos) = (pass.at + 1, 0),
            }
        }
        self.pass = Some(pass);
    }

    /// Copies the jobs in flight whose record lies below chunk `below`
    /// forward (`Accepted` and `Dispatched`): a job held for hours must not
    /// keep every later record in the stream (the purge stops at the first
    /// live chunk).
    fn relocate_lent(&mut self, below: u32) {
        let ids: Vec<JobId> = self.lent.iter().filter(|(_, j)| j.log_tag() < below).map(|(id, _)| *id).collect();
        for id in ids {
            if let Some(mut job) = self.lent.remove(&id) {
                self.copy_forward(&mut job);
                self.append_id(|b| record::encode_dispatched(id, b), record::ID_RECORD_BYTES);
                self.lent.insert(id, job);
            }
        }
    }

    /// Whether the stream holds more than the factor allows while a chunk
    /// older than the current one has live jobs (a pass could empty it).
    fn over_bound(&self) -> bool {
        let live: u64 = self.chunks.values().map(|c| c.live_bytes).sum();
        let held = self.stream_bytes + self.unconfirmed_bytes;
        held > limits::WAL_DISK_FACTOR * live + self.params.chunk_bytes
            && self.chunks.iter().any(|(n, c)| *n < self.current && c.live > 0)
    }

    /// When a pass may run at rest ([`limits::NATS_COMPACT_REST`] after
    /// the last records), if the stream is over its bound and something
    /// was logged since the last pass (so a log at rest runs one).
    fn rest_pass_at(&self) -> Option<Instant> {
        let due = self.logged > self.last_pass_at && self.shared.fault().is_none() && self.over_bound();
        self.last_logged.filter(|_| due).map(|t| t + limits::NATS_COMPACT_REST)
    }

    /// A pass when the stream holds more than the factor allows, at most
    /// one per half chunk logged unless the log is at rest.
    fn plan(&self, holdings: &dyn Holdings, now: Instant) -> Option<Pass> {
        if !self.over_bound() {
            return None;
        }
        let soon = self.last_pass_at > 0 && self.logged < self.last_pass_at + self.params.chunk_bytes / 2;
        if soon && self.rest_pass_at().is_none_or(|t| now < t) {
            return None;
        }
        tracing::debug!(shard = self.params.shard, held = self.stream_bytes, "replicated log compaction pass");
        Some(Pass { below: self.current, queues: holdings.queues(), at: 0, pos: 0, dead_at: 0 })
    }

    /// Publishes a snapshot of every live job (module docs, "Faults").
    fn repair(&mut self, now: Instant, holdings: &mut dyn Holdings) {
        tracing::warn!(shard = self.params.shard, "repairing the replicated job log: publishing every live job again");
        self.pass = None;
        // A chunk of its own, which every live job moves to.
        self.publish_batch(false);
        self.current += 1;
        self.current_bytes = 0;
        let chunk = self.current;
        self.chunks = BTreeMap::new();
        self.chunks.insert(chunk, Chunk::default());
        for queue in holdings.queues() {
            let mut from = 0;
            loop {
                let (_, next) = holdings.visit_waiting(&queue, from, usize::MAX, &mut |job| self.append_accepted(job));
                match next {
                    Some(at) => from = at,
                    None => break,
                }
            }
        }
        holdings.visit_retrying(&mut |job| self.append_accepted(job));
        let mut at = 0;
        loop {
            let (_, next) = holdings.visit_dead(at, usize::MAX, &mut |d| {
                self.append_accepted(&mut d.job);
                self.append_buried(d);
            });
            match next {
                Some(n) => at = n,
                None => break,
            }
        }
        let mut lent: Vec<Job> = self.lent.values().cloned().collect();
        for job in &mut lent {
            self.append_accepted(job);
            let id = job.id;
            self.append_id(|b| record::encode_dispatched(id, b), record::ID_RECORD_BYTES);
        }
        for job in lent {
            self.lent.insert(job.id, job);
        }
        if self.buf.is_empty() {
            // Nothing live: an empty snapshot still marks the point.
            self.append_id(|b| record::encode_done(JobId(0), b), record::ID_RECORD_BYTES);
        }
        self.publish_batch(true);
        self.snapshot = Some((self.ticket, chunk));
        self.next_repair = Some(now + self.repair_backoff);
        self.repair_backoff = (self.repair_backoff * 2).min(Duration::from_secs(60));
        self.update_stats();
    }

    /// Whether the batch's records wait for the next commit, gathered
    /// with its records into one message: while
    /// [`limits::NATS_SHARD_BATCHES_IN_FLIGHT`] batches of this shard wait
    /// for their PubAcks, and the records are less than a part. Never
    /// while the log is faulty (the repair publishes what it holds).
    fn hold_back(&self) -> bool {
        self.buf.len() < self.params.max_part
            && self.shared.unconfirmed() >= limits::NATS_SHARD_BATCHES_IN_FLIGHT
            && self.shared.fault().is_none()
    }

    fn update_stats(&self) {
        let s = &self.shared.stats;
        s.stream_bytes.store(self.stream_bytes + self.unconfirmed_bytes, Ordering::Relaxed);
        s.unconfirmed_bytes.store(self.unconfirmed_bytes, Ordering::Relaxed);
        s.live_jobs.store(self.chunks.values().map(|c| c.live).sum(), Ordering::Relaxed);
        s.live_bytes.store(self.chunks.values().map(|c| c.live_bytes).sum(), Ordering::Relaxed);
    }
}

impl JobLog for JsLog {
    fn fenced(&self) -> bool {
        self.shared.fault() == Some(FaultKind::Fenced)
    }

    fn accepted(&mut self, job: &mut Job) {
        self.append_accepted(job);
    }

    fn client_key(&mut self, id: JobId, at_unix_ms: u64, client: &[u8], msgid: &[u8]) {
        let len = record::client_key_len(client, msgid);
        self.append_id(
            |b| {
                let _ = record::encode_client_key(id, at_unix_ms, client, msgid, b);
            },
            len,
        );
    }

    fn dispatched(&mut self, job: &Job) {
        self.lent.insert(job.id, job.clone());
        let id = job.id;
        self.append_id(|b| record::encode_dispatched(id, b), record::ID_RECORD_BYTES);
    }

    fn requeued(&mut self, job: &mut Job) {
        self.returned(job);
        let (id, n) = (job.id, job.redeliveries());
        self.append_id(|b| record::encode_requeued(id, n, b), record::ID_RECORD_BYTES + 1);
    }

    fn buried(&mut self, dead: &mut DeadJob) {
        self.returned(&mut dead.job);
        self.append_buried(dead);
    }

    /// A fresh `Accepted` record (its setbacks reset) supersedes `Buried`.
    fn unburied(&mut self, job: &mut Job) {
        self.copy_forward(job);
    }

    fn done(&mut self, job: &Job) {
        let (tag, bytes) = match self.lent.remove(&job.id) {
            Some(copy) => (copy.log_tag(), record::accepted_len(&copy)),
            None => (job.log_tag(), record::accepted_len(job)),
        };
        let id = job.id;
        self.append_id(|b| record::encode_done(id, b), record::ID_RECORD_BYTES);
        self.count_out(tag, bytes);
    }

    fn done_elsewhere(&mut self, id: JobId) {
        match self.lent.remove(&id) {
            Some(copy) => {
                self.append_id(|b| record::encode_done(id, b), record::ID_RECORD_BYTES);
                self.count_out(copy.log_tag(), record::accepted_len(&copy));
            }
            None => {
                tracing::debug!(shard = self.params.shard, job = %id, "done elsewhere, but not known as dispatched")
            }
        }
    }

    fn commit(&mut self, now: Instant) -> Commit {
        self.last_commit = Some(now);
        if !self.buf.is_empty() {
            self.last_logged = Some(now);
        }
        self.take_acks();
        if !self.hold_back() {
            self.publish_batch(false);
        }
        self.update_stats();
        // Records held back go out under the next ticket.
        let last = self.ticket + u64::from(!self.buf.is_empty());
        if last > self.shared.durable_upto().0 {
            Commit::After(Ticket(last))
        } else {
            Commit::Release
        }
    }

    fn durable(&self) -> Arc<dyn Durable> {
        self.shared.clone()
    }

    fn refusal(&self) -> Option<StoreFault> {
        if let Some(kind) = self.shared.fault() {
            return Some(kind.refusal());
        }
        (self.unconfirmed_bytes > limits::NATS_MAX_UNCONFIRMED_BYTES).then_some(StoreFault::Failed)
    }

    /// Every 100 ms while batches wait for PubAcks (their sequences are
    /// taken and the stream purged), at once while compaction has work,
    /// when a pass at rest is due, when a repair is due, and when a purge
    /// not reported done is to be asked again.
    ///
    /// A faulty log runs no compaction and asks for no purge (`maintain`):
    /// it is woken only for a repair (an unreachable store) and every
    /// 100 ms while something is in flight. A fenced one is never repaired,
    /// so nothing else wakes it (it was woken at once, again and again).
    fn next_deadline(&self) -> Option<Instant> {
        let last = self.last_commit?;
        if let Some(kind) = self.shared.fault() {
            let repair =
                (kind == FaultKind::Unreachable && self.snapshot.is_none()).then(|| self.next_repair.unwrap_or(last));
            let busy = !self.tickets.is_empty() || self.snapshot.is_some() || !self.buf.is_empty();
            let poll = busy.then(|| last + Duration::from_millis(100));
            return repair.into_iter().chain(poll).min();
        }
        if self.pass.is_some() {
            return Some(last);
        }
        if !self.buf.is_empty() {
            return Some(last + limits::NATS_HELD_RECHECK);
        }
        let busy = !self.tickets.is_empty() || self.dirty || self.snapshot.is_some();
        let poll = busy.then(|| last + Duration::from_millis(100));
        let purge = self.purge_unconfirmed.map(|t| t + limits::NATS_PURGE_RETRY);
        poll.into_iter().chain(self.rest_pass_at()).chain(purge).min()
    }

    fn maintain(&mut self, now: Instant, holdings: &mut dyn Holdings) {
        self.last_commit = Some(now);
        self.take_acks();
        match self.shared.fault() {
            Some(FaultKind::Unreachable) => {
                // A snapshot the store gave up on is no repair: try again.
                if self.snapshot.is_some_and(|(t, _)| self.shared.snapshot_given_up(t)) {
                    self.snapshot = None;
                }
                if self.snapshot.is_none() && self.next_repair.is_none_or(|t| now >= t) {
                    self.repair(now, holdings);
                }
            }
            Some(_) => {}
            None => {
                self.compact_step(now, holdings);
                self.purge_dead_prefix(now);
                self.purge_again(now);
            }
        }
        self.update_stats();
    }

    fn sync_all(&mut self) -> bool {
        self.publish_batch(false);
        let deadline = Instant::now() + self.params.give_up + Duration::from_secs(5);
        let target = Ticket(self.ticket);
        loop {
            if self.shared.make_durable(target) {
                self.take_acks();
                self.update_stats();
                return true;
            }
            if self.shared.gave_up(target).is_some() || self.shared.fault().is_some() || Instant::now() >= deadline {
                return false;
            }
            self.shared.wait(target, Duration::from_millis(100));
        }
    }

    fn status(&self) -> Arc<dyn LogStatus> {
        self.shared.clone()
    }
}
