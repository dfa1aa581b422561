//! Random message sequences to 1 to 3 shards (the unit tests' harness, no
//! sockets, a hand-made clock), checked after every step:
//!
//! * every accepted job is exactly once waiting, in flight, offered,
//!   waiting for a retry or in the dead set until it ends, and never comes
//!   back once gone; jobs vanish only by a completing (not failed) REPLY, a
//!   text ACK or DEL, or dropped from a full dead set, each counted;
//! * `accepted_jobs` counts the jobs accepted; every REQUEST gets exactly
//!   one answer (REPLY or ERROR);
//! * each shard's snapshot counts the jobs it holds (waiting and offered
//!   per queue, in flight per worker) and no worker has negative slots.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arbitrary::Arbitrary;
use emq::broker::text_port::{TextAnswer, TextCmd, TextOutcome};
use emq::broker::shard::harness::Harness;
use emq::ids::OfferId;
use emq::protocol::text::ErrorCode;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
const QUEUES: [&str; 4] = ["a", "b", "default", "x"];
const WEIGHTS: [i64; 3] = [1, 5, 10];
const SCHEDULERS: [&str; 2] = ["s0", "s1"];
/// Text connections 0..CONNS; SCHEDs come from SCHED_CONN.
const CONNS: u8 = 3;
const SCHED_CONN: u64 = 99;
const MAX_OPS: usize = 48;

#[derive(Debug, Arbitrary)]
enum Op {
    Inform { w: u8, queues: Vec<(u8, u8)> },
    Ready { w: u8, n: u8 },
    Unready { w: u8 },
    Request { q: u8, msgid: u8 },
    Reply { w: u8, pick: u8, failed: bool },
    Heartbeat { w: u8 },
    Kbye { w: u8 },
    SendFailed { w: u8, pick: u8, unreachable: bool },
    Advance { ms: u16 },
    Sched { q: u8 },
    Ask { conn: u8, q: u8 },
    AskWait { conn: u8, q: u8, ms: u16 },
    Answer { conn: u8, answer: u8 },
    Close { conn: u8 },
    StaleAnswer { conn: u8, pick: u8, foreign: bool },
    SchedulerInform { s: u8 },
    SchedulerHeartbeat { s: u8 },
    SchedulerKbye { s: u8 },
    Schedule { msgid: u8, unschedule: bool },
    Drain,
}

#[derive(Debug, Arbitrary)]
struct Run {
    shards: u8,
    seed: Option<u64>,
    small_limits: bool,
    ops: Vec<Op>,
}

/// The driver: the shards and what it saw them accept and end.
struct Driver {
    h: Harness,
    accepted: BTreeSet<String>,
    ended: BTreeSet<String>,
    present: BTreeSet<String>,
    /// Offer held per connection: `(offer, body)`.
    offers: BTreeMap<u64, (OfferId, String)>,
    /// Connections waiting on a long-poll ASK: the queue.
    waiting: BTreeMap<u64, &'static str>,
    /// Every offer id seen (for stale answers).
    seen_offers: Vec<OfferId>,
    next: u64,
    /// Jobs ended by this step's text ACK/DEL.
    text_ends: u64,
    /// REPLYs marked failed this step that answered a job in flight (the
    /// job is retried or dead, not ended).
    failed_replies: u64,
}

fn pick<T: Copy>(items: &[T], i: u8) -> T {
    items[usize::from(i) % items.len()]
}

impl Driver {
    fn counter(&self, which: fn(&emq::metrics::counters::Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
        self.h.counter(which)
    }

    fn step(&mut self, op: &Op) {
        let completed = self.counter(|c| &c.completed_jobs);
        let dead = self.counter(|c| &c.dead_evicted);
        (self.text_ends, self.failed_replies) = (0, 0);
        self.apply(op);
        self.collect_text();
        self.h.emqp.clear();
        self.check(completed, dead);
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("J{}", self.next)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Inform { w, ref queues } => {
                let mut list: Vec<(i64, &str)> = Vec::new();
                for &(weight, q) in queues.iter().take(4) {
                    let name = pick(&QUEUES, q);
                    if !list.iter().any(|(_, n)| *n == name) {
                        list.push((pick(&WEIGHTS, weight), name));
                    }
                }
                if !list.is_empty() {
                    self.h.inform(pick(&WORKERS, w), &list);
                }
            }
            Op::Ready { w, n } => self.h.ready(pick(&WORKERS, w), usize::from(n % 4) + 1),
            Op::Unready { w } => self.h.unready(pick(&WORKERS, w), "u"),
            Op::Request { q, msgid } => {
                let body = self.fresh();
                let msgid = format!("m{}", msgid % 4);
                // One client identity per REQUEST: msgids repeat (workers
                // answer by msgid), and a key (identity, msgid) seen before
                // would be a duplicate, answered with no new job (the
                // router's window, tested in its own unit tests).
                let client = format!("c-{body}");
                self.h.request(&client, &msgid, pick(&QUEUES, q), &body);
                let answers = self.h.take_to(&client);
                assert_eq!(answers.len(), 1, "one answer per REQUEST");
                let frames = answers[0].frames();
                match frames.get(2).map(Vec::as_slice) {
                    Some(b"REPLY") => {
                        self.accepted.insert(body);
                    }
                    Some(b"ERROR") => {}
                    other => panic!("a REQUEST answered {other:?}"),
                }
            }
            Op::Reply { w, pick: p, failed } => {
                let id = pick(&WORKERS, w);
                let held = self.h.inflight(id);
                let msgid = held.get(usize::from(p) % held.len().max(1)).cloned().unwrap_or_else(|| "nosuch".into());
                if failed && held.contains(&msgid) {
                    self.failed_replies += 1;
                }
                self.h.reply_failed(id, &msgid, failed);
            }
            Op::Heartbeat { w } => self.h.heartbeat(pick(&WORKERS, w)),
            Op::Kbye { w } => self.h.kbye(pick(&WORKERS, w)),
            Op::SendFailed { w, pick: p, unreachable } => {
                let id = pick(&WORKERS, w);
                let held = self.h.inflight(id);
                let msgid = held.get(usize::from(p) % held.len().max(1)).cloned().unwrap_or_else(|| "m0".into());
                self.h.send_failed(id, &msgid, unreachable);
            }
            Op::Advance { ms } => self.h.advance(Duration::from_millis(u64::from(ms) * 4)),
            Op::Sched { q } => {
                let body = self.fresh();
                match self.h.text_sched(SCHED_CONN, pick(&QUEUES, q), &body) {
                    TextOutcome::Done => {
                        self.accepted.insert(body);
                    }
                    TextOutcome::Refused(_) => {}
                    other => panic!("SCHED answered {other:?}"),
                }
            }
            Op::Ask { conn, q } => {
                let conn = u64::from(conn % CONNS);
                if self.offers.contains_key(&conn) || self.waiting.contains_key(&conn) {
                    return; // the front end answers these itself
                }
                let outcome = self.h.text_ask(conn, pick(&QUEUES, q));
                self.outcome(conn, outcome);
            }
            Op::AskWait { conn, q, ms } => {
                let conn = u64::from(conn % CONNS);
                if self.offers.contains_key(&conn) || self.waiting.contains_key(&conn) {
                    return;
                }
                let queue = pick(&QUEUES, q);
                match self.h.text_ask_wait(conn, queue, Duration::from_millis(u64::from(ms))) {
                    Some(outcome) => self.outcome(conn, outcome),
                    None => {
                        self.waiting.insert(conn, queue);
                    }
                }
            }
            Op::Answer { conn, answer } => {
                let conn = u64::from(conn % CONNS);
                let Some((id, body)) = self.offers.remove(&conn) else { return };
                let answer = pick(&[TextAnswer::Ack, TextAnswer::Dcl, TextAnswer::Del], answer);
                match self.h.text_answer(conn, id, answer) {
                    TextOutcome::Done => {
                        if answer != TextAnswer::Dcl {
                            self.text_ends += 1;
                            assert!(self.present.contains(&body), "{body} answered but not held");
                        }
                    }
                    // A lapsed offer (its timeout ran out in an Advance).
                    TextOutcome::Refused(ErrorCode::NoTask) => {}
                    other => panic!("an answer answered {other:?}"),
                }
            }
            Op::Close { conn } => {
                let conn = u64::from(conn % CONNS);
                if let Some((id, _)) = self.offers.remove(&conn) {
                    self.h.text_release(conn, id);
                }
                // A waiting long poll is answered NOPE at once (collected
                // with the other text answers).
                if let Some(&queue) = self.waiting.get(&conn) {
                    let index = self.h.shard_of(queue);
                    self.h.text_cancel(index, conn);
                    let answers = self.h.text_answers(conn);
                    assert_eq!(answers, [TextOutcome::Nope], "a cancelled long poll is answered NOPE");
                    self.waiting.remove(&conn);
                }
            }
            Op::StaleAnswer { conn, pick: p, foreign } => {
                let conn = u64::from(conn % CONNS);
                let Some(&id) = self.seen_offers.get(usize::from(p) % self.seen_offers.len().max(1)) else { return };
                let named = if foreign { OfferId { shard: id.shard + 1, seq: id.seq } } else { id };
                if self.offers.values().any(|(o, _)| *o == named) || self.waiting.contains_key(&conn) {
                    return;
                }
                let cmd = TextCmd::Answer { offer: named, answer: TextAnswer::Ack };
                let got = self.h.text_cmd(id.shard, conn, cmd);
                assert_eq!(got, Some(TextOutcome::Refused(ErrorCode::NoTask)), "a stale offer id");
            }
            Op::SchedulerInform { s } => self.h.scheduler_inform(pick(&SCHEDULERS, s)),
            Op::SchedulerHeartbeat { s } => self.h.scheduler_heartbeat(pick(&SCHEDULERS, s)),
            Op::SchedulerKbye { s } => self.h.scheduler_kbye(pick(&SCHEDULERS, s)),
            Op::Schedule { msgid, unschedule } => {
                self.h.schedule("sc", &format!("s{}", msgid % 4), unschedule);
            }
            Op::Drain => self.h.set_draining(true),
        }
    }

    fn outcome(&mut self, conn: u64, outcome: TextOutcome) {
        match outcome {
            TextOutcome::Offer { id, data, .. } => {
                let body = String::from_utf8_lossy(&data).into_owned();
                assert!(self.accepted.contains(&body), "offered {body}, never accepted");
                self.seen_offers.push(id);
                assert!(self.offers.insert(conn, (id, body)).is_none(), "two offers on one connection");
            }
            TextOutcome::Nope | TextOutcome::Refused(_) => {}
            TextOutcome::Done => panic!("ASK answered Done"),
            // Only a durable log that gave a batch up says "not confirmed"; this
            // harness has none.
            TextOutcome::NotConfirmed(code) => panic!("not confirmed ({code:?}) without a log"),
        }
    }

    /// Long-poll answers that came later.
    fn collect_text(&mut self) {
        for conn in 0..u64::from(CONNS) {
            for outcome in self.h.text_answers(conn) {
                assert!(self.waiting.remove(&conn).is_some(), "an answer to {conn}, which waits for none");
                self.outcome(conn, outcome);
            }
        }
        self.h.text_answers(SCHED_CONN);
        // Offers whose time ran out went back to their queue.
        let held: Vec<OfferId> = self.h.jobs().offered.iter().map(|o| o.id).collect();
        self.offers.retain(|_, (id, _)| held.contains(id));
    }

    fn check(&mut self, completed: u64, dead: u64) {
        let jobs = self.h.jobs();
        let mut now = BTreeSet::new();
        let mut places = jobs.places();
        for (what, map) in [("retrying", &jobs.retrying), ("dead", &jobs.dead)] {
            for (q, bodies) in map {
                places.extend(bodies.iter().map(|b| (b.clone(), format!("{what}:{q}"))));
            }
        }
        for (body, place) in places {
            assert!(self.accepted.contains(&body), "{body} at {place} was never accepted");
            assert!(!self.ended.contains(&body), "{body} at {place} came back after it ended");
            assert!(now.insert(body.clone()), "{body} held twice ({place})");
        }
        for body in &self.accepted {
            if !now.contains(body) && !self.ended.contains(body) && self.present.contains(body) {
                self.ended.insert(body.clone());
            }
        }
        let vanished = self.present.difference(&now).count() as u64;
        let completed = self.counter(|c| &c.completed_jobs) - completed - self.failed_replies;
        let dropped = self.counter(|c| &c.dead_evicted) - dead;
        assert_eq!(vanished, completed + dropped + self.text_ends, "vanished = completed + dropped dead + ACK/DEL");
        // A job accepted in this step and already gone (completed at once is
        // impossible: a REPLY needs a step of its own).
        for body in &self.accepted {
            assert!(now.contains(body) || self.ended.contains(body), "{body} accepted but nowhere");
        }
        self.present = now;
        assert_eq!(self.counter(|c| &c.accepted_jobs), self.accepted.len() as u64, "accepted_jobs");
        for index in 0..self.h.shards.len() {
            let snap = self.h.snapshot(index);
            for q in &snap.queues {
                let waiting = jobs.waiting.get(&q.name).map_or(0, Vec::len);
                assert_eq!(q.waiting, waiting, "waiting count of {}", q.name);
                let offered = jobs.offered.iter().filter(|o| o.queue == q.name).count();
                assert_eq!(q.offered, offered, "offered count of {}", q.name);
            }
            for w in &snap.workers {
                assert!(w.slots >= 0, "{} has {} slots", w.id, w.slots);
                let held = jobs.inflight.values().filter(|(id, _)| *id == w.id).map(|(_, h)| h.len()).sum::<usize>();
                assert_eq!(w.inflight.len(), held, "in flight on {}", w.id);
            }
        }
    }
}

fuzz_target!(|run: Run| common::timed(|| {
    let shards = usize::from(run.shards % 3) + 1;
    let mut h = Harness::with_config(shards, |c| {
        if run.small_limits {
            c.max_queue_len = 4;
            c.kbye_grace = Duration::from_secs(8);
            c.text.offer_timeout = Duration::from_secs(4);
            c.max_retries = 1;
            c.dead_max_jobs = 2;
            c.retry_backoff = Duration::from_secs(2);
        }
    });
    h.seed = run.seed.map(|s| s | 1);
    let mut d = Driver {
        h,
        accepted: BTreeSet::new(),
        ended: BTreeSet::new(),
        present: BTreeSet::new(),
        offers: BTreeMap::new(),
        waiting: BTreeMap::new(),
        seen_offers: Vec::new(),
        next: 0,
        text_ends: 0,
        failed_replies: 0,
    };
    for op in run.ops.iter().take(MAX_OPS) {
        d.step(op);
    }
}));
