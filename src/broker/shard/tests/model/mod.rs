//! The model-based property test: random runs of worker, client and text
//! operations on 1 to 3 shards with a random interleaving, checked after
//! every step against a small reference model.
//!
//! The model records what it did and saw: which jobs were accepted (each
//! has a unique body), which queue each belongs to, what each worker
//! registration was sent and still holds, the READYs it was given, its
//! KBYE, and the text offers each connection holds. It does not re-run the
//! broker's rules; it checks their consequences (`checks.rs`):
//!
//! * credit: a worker's free slots are never negative and equal the READYs
//!   it was given (while live) minus the jobs sent to it; a live worker
//!   with a free slot never idles while one of its queues holds jobs;
//! * every accepted job is exactly once waiting, in flight, offered, or
//!   ended (completed by a REPLY, ACKed or DELeted, dead-lettered after
//!   more than `MAX_RETRIES` deliveries), and stays in its queue (the
//!   named one, or `default` when no worker ever declared it, no text
//!   client ASKed for it within `text_ask_grace`, and it held
//!   no jobs);
//! * the jobs a removed worker held (or that were on their way to it) that
//!   wait again keep their relative order, ahead of the jobs that waited
//!   in their queue before;
//! * a job goes only to a worker that declared its queue, with frame 4 as the
//!   client named it and `reply-requested` in its headers;
//! * after its KBYE a worker gets nothing (but the router's KBYE);
//! * admission, ASK and answers give the outcomes the state calls for.
//!
//! `EMQ_SHARD_PROPTEST_CASES` sets the number of runs (10,000 by default);
//! raise it for a soak.

mod checks;
mod ops;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::harness::{done, refused, Harness};
use super::observe::{shape, Jobs};
use crate::broker::text_port::{TextAnswer, TextOutcome};
use crate::ids::{OfferId, WorkerKey};
use crate::protocol::text::ErrorCode;
use ops::{Op, Run, DECLARABLE, NAMED, SHARED_MSGIDS, WEIGHTS, WORKERS};

/// Waiting jobs per queue before admission refuses: small, so runs meet it.
const MAX_QUEUE_LEN: usize = 6;
const KBYE_GRACE: Duration = Duration::from_secs(8);
const OFFER_TIMEOUT: Duration = Duration::from_secs(4);
/// Runs in the default `cargo test`.
const DEFAULT_CASES: u32 = 10_000;

/// One worker registration as the model knows it.
#[derive(Debug)]
struct Reg {
    id: String,
    /// The INFORM that made it, as generated.
    inform: Vec<(usize, usize)>,
    queues: Vec<String>,
    /// READYs given while live.
    readies: i64,
    /// Jobs sent to it.
    dispatched: i64,
    kbye: bool,
    /// `(body, msgid)` it holds, in the home shard's dispatch order.
    held: Vec<(String, String)>,
}

/// An accepted job.
#[derive(Debug)]
struct Accepted {
    /// The queue it must live in.
    queue: String,
    /// The queue the client named (REQUEST frame 4).
    named: String,
}

/// A text offer a connection holds.
#[derive(Debug, Clone)]
struct LiveOffer {
    id: OfferId,
    body: String,
    deadline: Instant,
}

/// What one step is allowed or bound to change.
#[derive(Debug, Default)]
struct Step {
    /// Bodies the operation ends (REPLY, ACK, DEL): exactly these vanish,
    /// besides dead letters.
    ends: Vec<String>,
    /// Of those, the jobs completed by a REPLY.
    completed: u64,
    /// The worker informed by this step (its ACK may follow an old KBYE).
    informed: Option<String>,
    /// A body DCLed (back of its queue) or released (front of its queue).
    declined: Option<String>,
    released: Option<String>,
    /// A stale answer: nothing may change.
    unchanged: bool,
}

/// The shards under test and the reference model.
struct Model {
    h: Harness,
    accepted: BTreeMap<String, Accepted>,
    ended: BTreeSet<String>,
    /// Queues some INFORM declared.
    declared: BTreeSet<String>,
    /// Until when an ASK keeps each queue known (`text_ask_grace`).
    asked: BTreeMap<String, std::time::Instant>,
    regs: BTreeMap<WorkerKey, Reg>,
    offers: BTreeMap<u64, LiveOffer>,
    offer_ids: Vec<OfferId>,
    /// Times each body was sent to a worker.
    deliveries: BTreeMap<String, u32>,
    draining: bool,
    next: u64,
    /// The jobs sent to workers in this step, in order: `(body, registration)`.
    sends: Vec<(String, WorkerKey)>,
}

impl Model {
    fn new(run: &Run) -> Model {
        let mut h = Harness::with_config(run.shards, |c| {
            c.max_queue_len = MAX_QUEUE_LEN;
            c.kbye_grace = KBYE_GRACE;
            c.text.offer_timeout = OFFER_TIMEOUT;
        });
        h.seed = run.seed;
        Model {
            h,
            accepted: BTreeMap::new(),
            ended: BTreeSet::new(),
            declared: BTreeSet::new(),
            asked: BTreeMap::new(),
            regs: BTreeMap::new(),
            offers: BTreeMap::new(),
            offer_ids: Vec::new(),
            deliveries: BTreeMap::new(),
            draining: false,
            next: 0,
            sends: Vec::new(),
        }
    }

    /// Runs `op`, then checks everything.
    fn step(&mut self, op: &Op) {
        let before = self.h.jobs();
        self.sends.clear();
        let counts_before = self.counts();
        let step = self.apply(op, &before);
        self.check_frames(&step);
        let after = self.h.jobs();
        self.check_jobs(&before, &after, &step, counts_before);
        self.check_workers(&before, &after);
        self.check_offers(&after, &step);
        self.settle(&after);
    }

    /// `(dead_lettered, completed_jobs)`.
    fn counts(&self) -> (u64, u64) {
        (self.h.counter(|c| &c.dead_lettered), self.h.counter(|c| &c.completed_jobs))
    }

    /// The current registration of `WORKERS[w]`.
    fn current(&mut self, w: usize) -> Option<&mut Reg> {
        let key = self.h.key_of(WORKERS[w])?;
        self.regs.get_mut(&key)
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn apply(&mut self, op: &Op, before: &Jobs) -> Step {
        let mut step = Step::default();
        match *op {
            Op::Inform { w, ref queues } => self.inform(w, queues, &mut step),
            Op::Ready { w, n } => {
                for _ in 0..n {
                    if let Some(reg) = self.current(w).filter(|r| !r.kbye) {
                        reg.readies += 1;
                    }
                    self.h.ready(WORKERS[w], 1);
                }
            }
            Op::Request { q, msgid } => self.request(NAMED[q], msgid, before),
            Op::Reply { w, pick } => self.reply(w, pick, &mut step),
            Op::Heartbeat { w } => self.h.heartbeat(WORKERS[w]),
            Op::Kbye { w } => {
                if let Some(reg) = self.current(w) {
                    reg.kbye = true;
                }
                self.h.kbye(WORKERS[w]);
            }
            Op::SendFailed { w, unreachable } => {
                let msgid = self.current(w).and_then(|r| r.held.first()).map_or("m".into(), |(_, m)| m.clone());
                self.h.send_failed(WORKERS[w], &msgid, unreachable);
            }
            Op::Restart { w, times } => {
                for _ in 0..times {
                    let Some(inform) = self.current(w).map(|r| r.inform.clone()) else { break };
                    self.apply(&Op::SendFailed { w, unreachable: true }, before);
                    step = self.apply(&Op::Inform { w, queues: inform }, before);
                    self.apply(&Op::Ready { w, n: 1 }, before);
                }
            }
            Op::Advance { ms } => self.h.advance(Duration::from_millis(ms)),
            Op::Sched { q } => self.sched(NAMED[q], before),
            Op::Ask { conn, q } => self.ask(conn, NAMED[q], before),
            Op::Answer { conn, answer } => self.answer(conn, answer, &mut step),
            Op::Release { conn } => {
                if let Some(offer) = self.offers.remove(&conn) {
                    self.h.text_release(conn, offer.id);
                    step.released = Some(offer.body);
                }
            }
            Op::StaleAnswer { conn, pick, foreign } => self.stale_answer(conn, pick, foreign, &mut step),
            Op::Drain => {
                self.h.set_draining(true);
                self.draining = true;
            }
        }
        step
    }

    fn inform(&mut self, w: usize, queues: &[(usize, usize)], step: &mut Step) {
        let mut list: Vec<(i64, &str)> = Vec::new();
        for &(weight, q) in queues {
            if !list.iter().any(|(_, name)| *name == DECLARABLE[q]) {
                list.push((WEIGHTS[weight], DECLARABLE[q]));
            }
        }
        self.h.inform(WORKERS[w], &list);
        let key = self.h.key_of(WORKERS[w]).expect("registered by its INFORM");
        let names: Vec<String> = list.iter().map(|(_, q)| q.to_string()).collect();
        self.declared.extend(names.iter().cloned());
        let id = WORKERS[w].to_string();
        let inform = queues.to_vec();
        let reg =
            Reg { id: id.clone(), inform, queues: names, readies: 0, dispatched: 0, kbye: false, held: Vec::new() };
        self.regs.insert(key, reg);
        step.informed = Some(id);
    }

    /// Records an accepted job.
    fn accept(&mut self, body: String, queue: &str, named: &str) {
        self.accepted.insert(body, Accepted { queue: queue.into(), named: named.into() });
    }

    /// Whether admission to `queue` must refuse, and with what.
    fn refusal(&self, queue: &str, before: &Jobs) -> Option<ErrorCode> {
        if self.draining {
            return Some(ErrorCode::ShuttingDown);
        }
        let full = before.waiting.get(queue).map_or(0, Vec::len) >= MAX_QUEUE_LEN;
        full.then_some(ErrorCode::QueueFull)
    }

    fn request(&mut self, named: &str, msgid: usize, before: &Jobs) {
        let body = self.fresh("J");
        let msgid = if msgid < SHARED_MSGIDS { format!("m{msgid}") } else { format!("u{}", self.next) };
        let asked = self.asked.get(named).is_some_and(|until| *until > self.h.now);
        let known = named == "default" || self.declared.contains(named) || before.waiting.contains_key(named) || asked;
        let queue = if known { named } else { "default" };
        let refusal = self.refusal(queue, before);
        // Each REQUEST from an identity of its own: a shared msgid is then
        // a job of its own too (the same identity and msgid would be a
        // duplicate, answered again without a job: `flow.rs` tests that),
        // and workers still get jobs with equal msgids.
        let client = format!("c{}", self.next);
        self.h.request(&client, &msgid, named, &body);
        let out = self.h.take_to(&client);
        assert_eq!(out.len(), 1, "one answer per REQUEST");
        let got = shape(&out[0]);
        match refusal {
            None => {
                assert_eq!(got, ["", "eMQP/1.0", "REPLY", "*", &msgid]);
                self.accept(body, queue, named);
            }
            Some(code) => assert_eq!(got[..6], ["", "eMQP/1.0", "ERROR", "*", &msgid, code.as_str()]),
        }
    }

    fn reply(&mut self, w: usize, pick: usize, step: &mut Step) {
        let Some(reg) = self.current(w) else { return self.h.reply(WORKERS[w], "m0") };
        let known = (pick < 4).then(|| reg.held.get(pick % reg.held.len().max(1))).flatten();
        let msgid = known.map_or("nosuch".to_string(), |(_, m)| m.clone());
        // The oldest job with that msgid is completed.
        if let Some(at) = reg.held.iter().position(|(_, m)| *m == msgid) {
            step.ends.push(reg.held.remove(at).0);
            step.completed += 1;
        }
        self.h.reply(WORKERS[w], &msgid);
    }

    fn sched(&mut self, queue: &str, before: &Jobs) {
        let body = self.fresh("T");
        let refusal = self.refusal(queue, before);
        let outcome = self.h.text_sched(9, queue, &body);
        match refusal {
            None => {
                assert_eq!(outcome, done());
                self.accept(body, queue, queue);
            }
            Some(code) => assert_eq!(outcome, refused(code)),
        }
    }

    fn ask(&mut self, conn: u64, queue: &str, before: &Jobs) {
        if self.offers.contains_key(&conn) {
            return; // the front end answers PENDING itself
        }
        self.asked.insert(queue.to_string(), self.h.now + self.h.ctx.config.text.ask_grace);
        match self.h.text_ask(conn, queue) {
            TextOutcome::Offer { id, data, deadline } => {
                let body = String::from_utf8_lossy(&data).into_owned();
                let front = before.waiting.get(queue).and_then(|w| w.first());
                assert_eq!(front, Some(&body), "ASK offers the oldest waiting job");
                assert_eq!((id.shard, deadline), (self.h.shard_of(queue), self.h.now + OFFER_TIMEOUT));
                // An offer is a delivery (a returned offer counts against
                // MAX_RETRIES like a dead worker's job).
                *self.deliveries.entry(body.clone()).or_insert(0) += 1;
                self.offers.insert(conn, LiveOffer { id, body, deadline });
                self.offer_ids.push(id);
            }
            TextOutcome::Nope => assert!(!before.waiting.contains_key(queue), "Nope while {queue} holds jobs"),
            other => panic!("ASK answered {other:?}"),
        }
    }

    fn answer(&mut self, conn: u64, answer: TextAnswer, step: &mut Step) {
        let Some(offer) = self.offers.remove(&conn) else { return };
        assert_eq!(self.h.text_answer(conn, offer.id, answer), done(), "a live offer is answered");
        match answer {
            TextAnswer::Ack | TextAnswer::Del => step.ends.push(offer.body),
            TextAnswer::Dcl => step.declined = Some(offer.body),
        }
    }

    fn stale_answer(&mut self, conn: u64, pick: usize, foreign: bool, step: &mut Step) {
        let Some(&id) = self.offer_ids.get(pick % self.offer_ids.len().max(1)) else { return };
        let named = if foreign { OfferId { shard: id.shard + 1, seq: id.seq } } else { id };
        if self.offers.get(&conn).is_some_and(|o| o.id == named) {
            return;
        }
        let cmd = crate::broker::text_port::TextCmd::Answer { offer: named, answer: TextAnswer::Ack };
        assert_eq!(self.h.text_cmd(id.shard, conn, cmd), Some(refused(ErrorCode::NoTask)), "a stale offer id");
        step.unchanged = true;
    }
}

fn cases() -> u32 {
    cases_from("EMQ_SHARD_PROPTEST_CASES", DEFAULT_CASES)
}

fn cases_from(var: &str, default: u32) -> u32 {
    match std::env::var(var) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{var}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Runs of the log's property test in the default `cargo test` (each run
/// writes and reads files); `EMQ_WAL_PROPTEST_CASES` sets it.
const DEFAULT_WAL_CASES: u32 = 200;

impl Model {
    /// The logs count as live exactly the jobs the shards hold (the dead
    /// set and jobs waiting for a retry included).
    fn check_log_counts(&self, after: &Jobs) {
        let held = after.waiting.values().map(Vec::len).sum::<usize>()
            + after.inflight.values().map(|(_, h)| h.len()).sum::<usize>()
            + after.offered.len()
            + after.retrying.values().map(Vec::len).sum::<usize>()
            + after.dead.values().map(Vec::len).sum::<usize>();
        assert_eq!(self.h.logged_live(), held as u64, "live jobs by the logs' count");
    }

    /// A restart now finds, per queue, every job the shards hold (waiting,
    /// in flight, offered) but those in flight at their last allowed
    /// delivery (the crash counts as one more: dead-lettered), with the
    /// jobs that never left their queue in their order.
    fn check_recovery(&self, dir: &std::path::Path, touched: &BTreeSet<String>) {
        let after = self.h.jobs();
        let mut held: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (q, bodies) in &after.waiting {
            held.entry(q.clone()).or_default().extend(bodies.iter().cloned());
        }
        for h in after.inflight.values().flat_map(|(_, h)| h) {
            held.entry(h.queue.clone()).or_default().insert(h.body.clone());
        }
        for o in &after.offered {
            held.entry(o.queue.clone()).or_default().insert(o.body.clone());
        }
        let last = self.h.at_last_delivery();
        for bodies in held.values_mut() {
            bodies.retain(|b| !last.contains(b));
        }
        held.retain(|_, b| !b.is_empty());
        // The running shards hold the data directory: recover a copy of
        // it, the disk as a crash would leave it.
        let copy = super::durable::crash_copy(dir);
        let got = super::durable::recover(copy.path(), self.h.shards.len());
        let got_sets: BTreeMap<String, BTreeSet<String>> =
            got.iter().map(|(q, b)| (q.clone(), b.iter().cloned().collect())).collect();
        assert_eq!(got_sets, held, "recovered jobs by queue");
        for (q, bodies) in &after.waiting {
            let fresh = |list: &[String]| list.iter().filter(|b| !touched.contains(*b)).cloned().collect::<Vec<_>>();
            assert_eq!(fresh(&got[q]), fresh(bodies), "queue {q}: the order of jobs that never left it");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// The shards agree with the model after every step of every run.
    #[test]
    fn shards_agree_with_the_model(run in ops::run()) {
        let mut model = Model::new(&run);
        for op in &run.ops {
            model.step(op);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases_from("EMQ_WAL_PROPTEST_CASES", DEFAULT_WAL_CASES), ..ProptestConfig::default() })]

    /// With logs (committed after every step, like batch ends): the logs'
    /// live counts match the shards after every step, and a restart at the
    /// end recovers every job the shards hold, in order.
    #[test]
    fn the_log_recovers_what_the_shards_hold(run in ops::run()) {
        let dir = tempfile::tempdir().unwrap();
        let mut model = Model::new(&run);
        model.h.attach_logs(dir.path());
        let mut touched = BTreeSet::new();
        for op in &run.ops {
            model.step(op);
            model.h.commit_logs();
            let after = model.h.jobs();
            touched.extend(after.inflight.values().flat_map(|(_, h)| h.iter().map(|h| h.body.clone())));
            touched.extend(after.offered.iter().map(|o| o.body.clone()));
            model.check_log_counts(&after);
        }
        model.check_recovery(dir.path(), &touched);
    }
}
