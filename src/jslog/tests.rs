//! The replicated log without a NATS server: the durable mark, what a
//! commit hands the NATS thread, replay of what it handed, and purges.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bridge::{Cmd, Publisher};
use super::log::{JsLog, LogParams};
use super::message::Header;
use super::shared::JsShared;
use super::{last_whole_snapshot, replay, StreamRead};
use crate::ids::JobId;
use crate::job::{Job, JobFrames, Origin};
use crate::joblog::fake::OneQueue;
use crate::joblog::{Commit, Durable, JobLog, StoreFault, Ticket};
use crate::wal::record;

fn job(seq: u64, body: &[u8]) -> Job {
    let frames = JobFrames::new(b"m", b"q", b"", body, &[] as &[&[u8]]).expect("frames");
    let now = Instant::now();
    Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, now, now)
}

fn log(max_part: usize, chunk_bytes: u64) -> (JsLog, Arc<JsShared>, tokio::sync::mpsc::UnboundedReceiver<Cmd>) {
    let (publisher, rx) = Publisher::for_test();
    let shared = Arc::new(JsShared::new(0, "S".into(), "s".into()));
    let params = LogParams {
        shard: 0,
        shards: 1,
        boot: 7,
        subject: "s".into(),
        max_part,
        give_up: Duration::from_millis(50),
        chunk_bytes,
    };
    (JsLog::new(params, publisher, shared.clone(), BTreeMap::new(), 1, BTreeMap::new(), 1), shared, rx)
}

/// A publish as handed over: ticket, part, payload.
type Sent = (u64, u16, Vec<u8>);

/// What the log handed over: publishes and purges.
fn sent(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Cmd>) -> (Vec<Sent>, Vec<u64>) {
    let (mut pubs, mut purges) = (Vec::new(), Vec::new());
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Cmd::Publish(p) => pubs.push((p.ticket, p.part, p.payload.to_vec())),
            Cmd::Purge { below, .. } => purges.push(below),
            _ => {}
        }
    }
    (pubs, purges)
}

#[test]
fn the_durable_mark_is_the_unbroken_acknowledged_prefix() {
    let s = JsShared::new(0, "S".into(), "s".into());
    for t in 1..=3 {
        s.handed(t, 1);
    }
    s.acked(3, 0, 30, Duration::from_micros(5));
    s.acked(2, 0, 20, Duration::from_micros(5));
    assert!(!s.make_durable(Ticket(2)), "ticket 1 is not in");
    s.acked(1, 0, 10, Duration::from_micros(5));
    assert_eq!(s.durable_upto(), Ticket(3));
    // Two parts: durable only with both.
    s.handed(4, 2);
    s.acked(4, 1, 41, Duration::from_micros(5));
    assert!(!s.make_durable(Ticket(4)));
    s.acked(4, 0, 40, Duration::from_micros(5));
    assert!(s.make_durable(Ticket(4)));
}

#[test]
fn a_give_up_refuses_what_waits_until_a_snapshot_is_stored() {
    let s = JsShared::new(0, "S".into(), "s".into());
    s.handed(1, 1);
    s.handed(2, 1);
    s.acked(2, 0, 5, Duration::from_micros(5));
    s.not_confirmed(1, 0);
    assert_eq!(s.gave_up(Ticket(1)), Some(StoreFault::Failed));
    assert_eq!(s.gave_up(Ticket(2)), Some(StoreFault::Failed), "behind the given-up one");
    assert!(s.faulty());
    s.handed(3, 1);
    assert_eq!(s.gave_up(Ticket(3)), None, "handed after the give-up: waits for the repair");
    s.snapshot(4, 1);
    s.acked(3, 0, 6, Duration::from_micros(5));
    assert!(!s.make_durable(Ticket(3)));
    s.acked(4, 0, 7, Duration::from_micros(5));
    assert!(s.make_durable(Ticket(4)), "the snapshot supersedes everything before it");
    assert!(!s.faulty());
    assert_eq!(s.stats.repairs.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn a_batch_larger_than_a_part_is_cut_and_replay_joins_it() {
    let (mut log, shared, mut rx) = log(4096, 1 << 20);
    let mut jobs: Vec<Job> = (1..=3).map(|i| job(i, &vec![b'a' + i as u8; 3000])).collect();
    for j in &mut jobs {
        log.accepted(j);
    }
    log.dispatched(&jobs[1]);
    log.done(&jobs[2]);
    assert_eq!(log.commit(Instant::now()), Commit::After(Ticket(1)));
    let (pubs, _) = sent(&mut rx);
    assert!(pubs.len() >= 3, "about 9 KB in parts of at most 4 KB: {}", pubs.len());
    assert!(pubs.iter().all(|(t, _, p)| *t == 1 && p.len() <= 4096 + super::message::HEADER_BYTES));
    // Stored out of order, one part twice (a retry after the window).
    let mut msgs: Vec<(Header, u64, Vec<u8>)> = pubs
        .iter()
        .enumerate()
        .map(|(i, (_, _, p))| {
            let (h, rec) = Header::decode(p).expect("header");
            (h, 100 - i as u64, rec.to_vec())
        })
        .collect();
    msgs.push(msgs[0].clone());
    msgs[0].1 = 200;
    msgs.reverse();
    let now = Instant::now();
    let r = replay("S", StreamRead { msgs, snapshot_parts: Vec::new(), markers: Vec::new() }, 0, now, now)
        .expect("replays");
    let mut ids: Vec<u64> = r.state.jobs.keys().map(|id| id.seq()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2], "job 3 is done");
    assert!(r.state.jobs[&JobId::new(0, 2)].in_flight);
    assert_eq!(r.state.jobs[&JobId::new(0, 1)].job.frames.body(), &[b'b'; 3000][..]);
    drop(shared);
}

#[test]
fn a_batch_with_a_part_missing_is_skipped() {
    let (mut log, _shared, mut rx) = log(4096, 1 << 20);
    let mut j = job(1, &[b'x'; 6000]);
    log.accepted(&mut j);
    log.commit(Instant::now());
    let mut k = job(2, b"small");
    log.accepted(&mut k);
    log.commit(Instant::now());
    let (mut pubs, _) = sent(&mut rx);
    pubs.remove(1);
    assert_eq!(replayed_ids(&pubs), [2]);
}

#[test]
fn the_stream_is_purged_below_the_first_live_or_unknown_message() {
    // A chunk per batch: liveness is counted per chunk.
    let (mut log, shared, mut rx) = log(1 << 20, 1);
    let mut jobs: Vec<Job> = (1..=3).map(|i| job(i, b"body")).collect();
    for (t, j) in jobs.iter_mut().enumerate() {
        log.accepted(j);
        log.commit(Instant::now());
        shared.acked(t as u64 + 1, 0, t as u64 + 1, Duration::from_micros(5));
    }
    let t0 = Instant::now();
    log.maintain(t0, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "every job is live");
    // Done: job 1, then job 3; job 2 keeps its message.
    log.done(&jobs[0]);
    log.done(&jobs[2]);
    log.commit(t0);
    shared.acked(4, 0, 4, Duration::from_micros(5));
    log.maintain(t0, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, [2], "below job 2's message");
    log.done(&jobs[1]);
    log.commit(t0);
    // Ticket 5's PubAck has not arrived: its message may be stored
    // anywhere above 4; nothing past what is known goes.
    log.maintain(t0 + Duration::from_secs(2), &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, [5], "up to the last known message");
    shared.acked(5, 0, 5, Duration::from_micros(5));
    log.maintain(t0 + Duration::from_secs(4), &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, [6]);
}

/// A log of two jobs, each in its own chunk and message (sequences 1 and
/// 2), the first done (message 3): the purge below message 2 is asked for
/// at `t0` and not reported done. Returns the log, its shared state, its
/// commands, the jobs and `t0`.
#[allow(clippy::type_complexity)]
fn log_with_an_unconfirmed_purge(
) -> (JsLog, Arc<JsShared>, tokio::sync::mpsc::UnboundedReceiver<Cmd>, Vec<Job>, Instant) {
    let (mut log, shared, mut rx) = log(1 << 20, 1);
    let mut jobs: Vec<Job> = (1..=2).map(|i| job(i, b"body")).collect();
    for (t, j) in jobs.iter_mut().enumerate() {
        log.accepted(j);
        log.commit(Instant::now());
        shared.acked(t as u64 + 1, 0, t as u64 + 1, Duration::from_micros(5));
    }
    let t0 = Instant::now();
    log.done(&jobs[0]);
    log.commit(t0);
    shared.acked(3, 0, 3, Duration::from_micros(5));
    log.maintain(t0, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, [2], "below job 2's message");
    (log, shared, rx, jobs, t0)
}

#[test]
fn a_purge_not_reported_done_is_asked_again_until_it_is() {
    let (mut log, shared, mut rx, _jobs, t0) = log_with_an_unconfirmed_purge();
    // The NATS thread did not report it done (it failed): nothing more
    // died, so only the retry asks for it again, once per retry time.
    let retry = crate::limits::NATS_PURGE_RETRY;
    let at = log.next_deadline().expect("a deadline for the retry");
    assert!(at <= Instant::now() + retry, "the retry is due within {retry:?}");
    log.maintain(t0 + retry / 2, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "not before the retry time");
    log.maintain(t0 + retry * 2, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, [2], "asked again");
    log.maintain(t0 + retry * 5 / 2, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "once per retry time");
    // Done: never asked again.
    shared.stats.purged_below.store(2, std::sync::atomic::Ordering::Relaxed);
    log.maintain(t0 + retry * 10, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "done");
    log.maintain(t0 + retry * 20, &mut OneQueue(Vec::new()));
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "done");
}

#[test]
fn a_faulty_log_never_asks_to_be_woken_in_the_past() {
    // A purge was asked for and never reported done; then the store
    // failed. Woken in the past, a shard thread spins.
    let (mut log, shared, mut rx, jobs, t0) = log_with_an_unconfirmed_purge();
    let retry = crate::limits::NATS_PURGE_RETRY;
    // Unreachable: a batch given up; the repair's snapshot is in flight.
    log.done(&jobs[1]);
    log.commit(t0);
    shared.not_confirmed(4, 0);
    log.maintain(t0 + retry, &mut OneQueue(Vec::new()));
    assert!(shared.repairing(), "a repair's snapshot in flight");
    for k in 2..=4 {
        let now = t0 + retry * k;
        log.maintain(now, &mut OneQueue(Vec::new()));
        assert!(log.next_deadline().is_some_and(|d| d > now), "unreachable: woken at once, round {k}");
    }
    assert_eq!(sent(&mut rx).1, Vec::<u64>::new(), "no purge asked while faulty");
    // Fenced: nothing to repair, nothing in flight wakes it.
    shared.fence("a test");
    for k in 5..=7 {
        let now = t0 + retry * k;
        log.maintain(now, &mut OneQueue(Vec::new()));
        assert!(log.next_deadline().is_none_or(|d| d > now), "fenced: woken at once, round {k}");
    }
}

fn replayed_ids(pubs: &[Sent]) -> Vec<u64> {
    let msgs: Vec<(Header, u64, Vec<u8>)> = pubs
        .iter()
        .enumerate()
        .map(|(i, (_, _, p))| {
            let (h, rec) = Header::decode(p).expect("header");
            (h, i as u64 + 1, rec.to_vec())
        })
        .collect();
    let now = Instant::now();
    let r = replay("S", StreamRead { msgs, snapshot_parts: Vec::new(), markers: Vec::new() }, 0, now, now)
        .expect("replays");
    let mut ids: Vec<u64> = r.state.jobs.keys().map(|id| id.seq()).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn after_a_give_up_the_log_refuses_then_publishes_every_live_job_again() {
    let (mut log, shared, mut rx) = log(1 << 20, 1 << 20);
    let mut waiting = job(1, b"waits");
    let mut out = job(2, b"runs");
    log.accepted(&mut waiting);
    log.accepted(&mut out);
    log.dispatched(&out);
    log.commit(Instant::now());
    shared.not_confirmed(1, 0);
    assert_eq!(log.refusal(), Some(StoreFault::Failed));
    let mut holdings = OneQueue(vec![waiting]);
    log.maintain(Instant::now(), &mut holdings);
    let (pubs, _) = sent(&mut rx);
    assert_eq!(pubs.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2], "the lost batch, then the snapshot");
    assert_eq!(replayed_ids(&pubs[1..]), [1, 2], "the snapshot alone holds both");
    assert_eq!(log.refusal(), Some(StoreFault::Failed), "until the snapshot is stored");
    shared.acked(2, 0, 9, Duration::from_micros(5));
    log.maintain(Instant::now(), &mut holdings);
    assert_eq!(log.refusal(), None);
    assert_eq!(sent(&mut rx).1, [9], "everything before the snapshot is purged");
}

#[test]
fn compaction_copies_old_waiting_and_held_jobs_forward_so_their_chunk_dies() {
    let (mut log, shared, mut rx) = log(1 << 20, 64 * 1024);
    let mut old = job(1, b"old");
    log.accepted(&mut old);
    // And a job held by a worker all along.
    let mut held = job(2000, b"held");
    log.accepted(&mut held);
    log.dispatched(&held);
    // Each batch confirmed at once (stream sequence = ticket).
    let commit = |log: &mut JsLog| {
        if let Commit::After(Ticket(t)) = log.commit(Instant::now()) {
            shared.acked(t, 0, t, Duration::from_micros(5));
        }
    };
    commit(&mut log);
    // Far more than two chunks of jobs accepted and done behind it.
    for seq in 2..2000u64 {
        let mut j = job(seq, &[b'x'; 100]);
        log.accepted(&mut j);
        log.done(&j);
        commit(&mut log);
    }
    let t = shared.durable_upto().0;
    assert_eq!(t, 1999, "a batch each");
    let mut holdings = OneQueue(vec![old]);
    let t0 = Instant::now();
    log.maintain(t0, &mut holdings);
    log.commit(t0);
    assert_ne!(holdings.0[0].log_tag(), 1, "copied forward out of chunk 1");
    shared.acked(t + 1, 0, t + 1, Duration::from_micros(5));
    log.maintain(t0 + Duration::from_secs(2), &mut holdings);
    let (_, purges) = sent(&mut rx);
    // Up to the chunk the copy went to (it also holds the last done jobs).
    let below = purges.last().copied().unwrap_or(0);
    assert!(below > t / 2 && below <= t + 1, "old chunks purged: below {below} of {}", t + 1);
    // The held job is still known as in flight where it moved.
    log.done(&held);
    log.commit(t0);
    let (pubs, _) = sent(&mut rx);
    assert_eq!(pubs.len(), 1, "its Done");
}

proptest::proptest! {
    /// A stream is data from the network: whatever its messages hold,
    /// replay answers (jobs, or an error naming the message), never panics.
    #[test]
    fn replay_of_arbitrary_messages_never_panics(
        raw in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..200), 0..8),
        parts in proptest::num::u16::ANY,
        flip in proptest::num::usize::ANY,
    ) {
        // Half the messages get a valid header (so the records are read).
        let msgs: Vec<(Header, u64, Vec<u8>)> = raw
            .into_iter()
            .enumerate()
            .filter_map(|(i, mut bytes)| {
                if i % 2 == 0 {
                    let h = Header { shard: 0, shards: 1, boot: 1, ticket: i as u64, part: 0, parts: parts.max(1) };
                    let mut m = Vec::new();
                    h.encode(&mut m);
                    let at = flip % bytes.len().max(1);
                    if let Some(b) = bytes.get_mut(at) {
                        *b ^= 0x5a;
                    }
                    m.append(&mut bytes);
                    Header::decode(&m).ok().map(|(h, r)| (h, i as u64 + 1, r.to_vec()))
                } else {
                    Header::decode(&bytes).ok().map(|(h, r)| (h, i as u64 + 1, r.to_vec()))
                }
            })
            .collect();
        let now = Instant::now();
        let _ = replay("S", StreamRead { msgs, snapshot_parts: Vec::new(), markers: Vec::new() }, 0, now, now);
    }
}

fn snap_header(ticket: u64) -> Header {
    Header { shard: 0, shards: 1, boot: 7, ticket, part: 0, parts: 1 }
}

/// A batch given up before a repair and stored after its snapshot (a
/// publish that reached a server late): job 1 accepted and dispatched,
/// while the next batch, which said it was done, was lost. The
/// snapshot (job 2 alone) supersedes it; unmarked, job 1 comes back.
#[test]
fn the_last_whole_snapshot_supersedes_every_batch_before_it() {
    let mut lost_in_flight = Vec::new();
    record::encode_accepted(&job(1, b"body"), &mut lost_in_flight);
    record::encode_dispatched(JobId::new(0, 1), &mut lost_in_flight);
    let mut snapshot = Vec::new();
    record::encode_accepted(&job(2, b"body"), &mut snapshot);
    let msgs = vec![(snap_header(3), 1, snapshot), (snap_header(1), 2, lost_in_flight.clone())];
    let now = Instant::now();
    for marked in [true, false] {
        let snapshot_parts = if marked { vec![snap_header(3)] } else { Vec::new() };
        let read = StreamRead { msgs: msgs.clone(), snapshot_parts, markers: Vec::new() };
        let r = replay("S", read, 0, now, now).unwrap();
        let mut jobs: Vec<(u64, bool)> = r.state.jobs.values().map(|j| (j.job.id.seq(), j.in_flight)).collect();
        jobs.sort();
        if marked {
            assert_eq!(jobs, [(2, false)]);
            assert_eq!(r.seqs.get(&2), Some(&(0, lost_in_flight.len() as u64)), "counted dead, to be purged");
        } else {
            assert_eq!(jobs, [(1, true), (2, false)]);
        }
    }
    // A snapshot with a part missing is no barrier.
    let torn = Header { parts: 2, ..snap_header(3) };
    let read = StreamRead { msgs: msgs.clone(), snapshot_parts: vec![torn], markers: Vec::new() };
    assert_eq!(last_whole_snapshot(&read.snapshot_parts), None);
}

#[test]
fn markers_hold_no_batch_and_are_dead_for_the_log() {
    let now = Instant::now();
    let read = StreamRead { msgs: Vec::new(), snapshot_parts: Vec::new(), markers: vec![3, 7] };
    let r = replay("S", read, 0, now, now).expect("replays");
    assert!(r.state.jobs.is_empty());
    assert_eq!(r.state.bytes, 0);
    // Chunk 0 is the dead chunk: the log purges past them.
    assert_eq!(r.seqs.get(&3), Some(&(0, 0)));
    assert_eq!(r.seqs.get(&7), Some(&(0, 0)));
}

#[test]
fn a_fenced_shard_stays_fenced_and_acknowledges_nothing_handed_out() {
    let s = JsShared::new(0, "S".into(), "s.1".into());
    s.handed(1, 1);
    s.acked(1, 0, 4, Duration::from_micros(5));
    s.handed(2, 1);
    s.handed(3, 1);
    assert!(s.fenced(2, 0), "the first time");
    assert!(!s.taken(), "fenced already");
    assert_eq!(s.fault(), Some(crate::joblog::FaultKind::Fenced));
    assert!(s.make_durable(Ticket(1)), "acknowledged before the fence");
    assert_eq!(s.gave_up(Ticket(2)), Some(StoreFault::Failed));
    assert_eq!(s.gave_up(Ticket(3)), Some(StoreFault::Failed));
    // A give-up afterwards does not turn it into a fault a repair ends.
    s.not_confirmed(3, 0);
    assert_eq!(s.fault(), Some(crate::joblog::FaultKind::Fenced));
    // The lease path alone fences too.
    let t = JsShared::new(1, "T".into(), "t.1".into());
    t.handed(1, 1);
    assert!(t.taken());
    assert_eq!(t.fault(), Some(crate::joblog::FaultKind::Fenced));
    assert_eq!(t.gave_up(Ticket(1)), Some(StoreFault::Failed));
}

#[test]
fn a_fence_check_is_asked_once_per_gap_for_a_shard() {
    let s = JsShared::new(0, "S".into(), "s.1".into());
    let gap = Duration::from_millis(200);
    assert!(s.may_check_fence(gap));
    assert!(!s.may_check_fence(gap), "within the gap");
    std::thread::sleep(gap + Duration::from_millis(20));
    assert!(s.may_check_fence(gap), "after it");
}
