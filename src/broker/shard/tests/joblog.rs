//! The shard against its job log's contract, with a fake log
//! ([`crate::joblog::fake`]) that can be told to fail, fill up or stall:
//! acknowledgements wait for their ticket; a log that cannot keep new jobs
//! refuses producers with its code while consumers are served from memory;
//! the shard applies its retry rule to what a log recovers, in one place.

use std::sync::Arc;
use std::time::Duration;

use super::harness::{done, offer_id, peer, refused, Harness};
use crate::broker::egress::{OutMsg, Outgoing};
use crate::broker::inbox::ShardMsg;
use crate::broker::outbox::Outbox;
use crate::broker::shard::Shard;
use crate::broker::text_port::{TextAnswer, TextCmd, TextPort, TextReply};
use crate::ids::{JobId, QueueName};
use crate::job::{Job, JobFrames, Origin, Setback};
use crate::joblog::fake::{Event, FakeControl, FakeLog};
use crate::joblog::{Durable, JobState, RecoveredJob, StoreFault, Ticket};
use crate::limits;
use crate::protocol::text::ErrorCode;

impl Harness {
    /// Gives every shard a fake log (nothing recovered); their controls.
    pub fn attach_fakes(&mut self) -> Vec<Arc<FakeControl>> {
        let mut ctls = Vec::new();
        for shard in &mut self.shards {
            let (log, ctl) = FakeLog::new();
            shard.attach_log(Box::new(log), FakeLog::recovered(Vec::new()));
            ctls.push(ctl);
        }
        ctls
    }

    /// A batch end on every shard (what the router's shard loop does after
    /// each batch): commits, asks the log to make the batch's ticket
    /// durable (what the router's release step does), then lets the log do
    /// its housekeeping.
    pub fn end_batches(&mut self) {
        for i in 0..self.shards.len() {
            let mut out = Ends::default();
            self.shards[i].end_batch(self.now, &mut out);
            if let Some(ticket) = out.ticket {
                self.shards[i].log().durable().make_durable(ticket);
            }
            for (to, msg) in out.out.shards {
                self.inbox[to].push_back(msg);
            }
        }
        self.run();
    }
}

/// A [`crate::broker::outbox::VecOutbox`] that keeps the ticket its batch ended with.
#[derive(Default)]
struct Ends {
    out: crate::broker::outbox::VecOutbox,
    ticket: Option<Ticket>,
}

impl Outbox for Ends {
    fn emqp(&mut self, out: Outgoing) {
        self.out.emqp(out);
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        self.out.shard(index, msg);
    }

    fn text(&mut self, port: &TextPort, reply: TextReply) {
        self.out.text(port, reply);
    }

    fn flush_after(&mut self, ticket: Ticket) {
        self.ticket = Some(ticket);
    }
}

/// The words an ERROR to `client` carried: `(code, text)` of each.
fn errors_to(h: &mut Harness, client: &str) -> Vec<String> {
    h.take_to(client)
        .iter()
        .map(|o| o.frames())
        .filter(|f| f[2] == b"ERROR")
        .map(|f| String::from_utf8_lossy(&f[5]).into_owned())
        .collect()
}

/// An outbox that releases what a batch promised the way the router does
/// (`router::outbox`): acceptance REPLYs and answers to stored SCHEDs wait
/// until the log holds the batch's ticket; everything else leaves at once.
#[derive(Default)]
struct Holding {
    durable: Option<Arc<dyn Durable>>,
    now_emqp: Vec<Outgoing>,
    now_text: Vec<TextReply>,
    held: Vec<(Ticket, Vec<Outgoing>, Vec<TextReply>)>,
    sent: Vec<Outgoing>,
    answered: Vec<TextReply>,
    shards: Vec<(usize, ShardMsg)>,
}

impl Holding {
    fn release_ready(&mut self) {
        let Some(durable) = &self.durable else { return };
        while let Some((ticket, ..)) = self.held.first() {
            if !durable.make_durable(*ticket) {
                return;
            }
            let (_, emqp, text) = self.held.remove(0);
            self.sent.extend(emqp);
            self.answered.extend(text);
        }
    }

    fn words(&self) -> Vec<String> {
        self.sent.iter().map(|o| String::from_utf8_lossy(&o.frames()[2]).into_owned()).collect()
    }
}

impl Outbox for Holding {
    fn emqp(&mut self, out: Outgoing) {
        self.now_emqp.push(out);
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        self.shards.push((index, msg));
    }

    fn text(&mut self, _: &TextPort, reply: TextReply) {
        self.now_text.push(reply);
    }

    fn flush(&mut self) {
        self.release_ready();
        self.sent.append(&mut self.now_emqp);
        self.answered.append(&mut self.now_text);
    }

    fn flush_after(&mut self, ticket: Ticket) {
        self.release_ready();
        let (wait, go): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.now_emqp).into_iter().partition(|o| matches!(o.msg, OutMsg::Accepted(_)));
        let (wait_text, go_text): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.now_text).into_iter().partition(|r| r.stored);
        self.sent.extend(go);
        self.answered.extend(go_text);
        self.held.push((ticket, wait, wait_text));
    }
}

/// One shard with a fake log, driven by hand through a [`Holding`] outbox.
fn one_shard() -> (Shard, Arc<FakeControl>, Holding, Harness) {
    let h = Harness::new(1);
    let mut shard = Shard::new(0, h.ctx.clone(), h.now);
    let (log, ctl) = FakeLog::new();
    shard.attach_log(Box::new(log), FakeLog::recovered(Vec::new()));
    let out = Holding { durable: Some(ctl.clone()), ..Holding::default() };
    (shard, ctl, out, h)
}

fn request(queue: &str, msgid: &str, body: &str) -> ShardMsg {
    let frames = JobFrames::new(msgid.as_bytes(), queue.as_bytes(), b"", body.as_bytes(), &[] as &[&[u8]]).unwrap();
    ShardMsg::Request { client: peer("c"), frames, fallback_done: false }
}

#[test]
fn an_acceptance_waits_until_the_log_holds_its_ticket() {
    let (mut shard, ctl, mut out, h) = one_shard();
    let (tx, _rx) = crossbeam_channel::unbounded();
    let port = TextPort { id: 1, tx, wake: None };
    ctl.set_stalled(true);
    shard.handle(request("q", "m1", "j1"), h.now, &mut out);
    let sched = TextCmd::Sched { queue: QueueName::named("q"), data: b"t1".to_vec() };
    let ask = TextCmd::Ask { queue: QueueName::named("empty") };
    let cmds = vec![
        crate::broker::text_port::TextRequest { conn: crate::ids::ConnId(1), cmd: sched },
        crate::broker::text_port::TextRequest { conn: crate::ids::ConnId(2), cmd: ask },
    ];
    shard.handle(ShardMsg::Text { port, cmds }, h.now, &mut out);
    shard.end_batch(h.now, &mut out);
    assert!(matches!(ctl.events()[..], [Event::Accepted(..), Event::Accepted(..)]), "{:?}", ctl.events());
    let ticket = out.held.last().map(|(t, ..)| *t).expect("a ticket");
    assert_eq!(ticket, Ticket(2), "the ticket covers both jobs' records");
    assert!(out.sent.is_empty(), "no acceptance before the log holds it: {:?}", out.words());
    assert_eq!(out.answered.len(), 1, "the consumer's NOPE leaves at once");
    // Still stalled: more batches release nothing.
    shard.end_batch(h.now, &mut out);
    assert!(out.sent.is_empty());
    ctl.set_stalled(false);
    shard.end_batch(h.now, &mut out);
    assert_eq!(out.words(), ["REPLY"], "released once durable");
    assert_eq!(out.answered.len(), 2, "and the stored SCHED's answer");
    assert!(out.answered[1].stored && out.answered[1].outcome == done());
}

#[test]
fn a_failing_or_full_log_refuses_producers_and_serves_consumers() {
    for fault in [StoreFault::Failed, StoreFault::Full] {
        for mut h in Harness::setups(|_| {}) {
            let ctls = h.attach_fakes();
            let code = match fault {
                StoreFault::Full => ErrorCode::StoreFull,
                StoreFault::Failed => ErrorCode::StoreFailed,
            };
            h.inform("w1", &[(10, "q")]);
            h.take_to("w1");
            for i in 1..=3 {
                h.request("c", &format!("m{i}"), "q", &format!("j{i}"));
            }
            assert_eq!(h.text_sched(1, "t", "x1"), done());
            h.take_to("c");
            for ctl in &ctls {
                ctl.set_fault(Some(fault));
            }
            // Producers: refused with the log's code, nothing logged.
            let before: usize = ctls.iter().map(|c| c.events().len()).sum();
            h.request("c", "m4", "q", "j4");
            assert_eq!(errors_to(&mut h, "c"), [code.as_str()], "{}", h.setup());
            assert_eq!(h.text_sched(1, "t", "x2"), refused(code));
            assert_eq!(ctls.iter().map(|c| c.events().len()).sum::<usize>(), before, "a refusal logs nothing");
            // Consumers: served from memory, their ends logged.
            h.ready("w1", 3);
            assert_eq!(h.take_bodies("w1"), ["j1", "j2", "j3"], "{}", h.setup());
            h.reply("w1", "m1");
            let offer = offer_id(&h.text_ask(2, "t")).expect("an offer");
            assert_eq!(h.text_answer(2, offer, TextAnswer::Ack), done());
            h.end_batches();
            let events: Vec<Event> = ctls.iter().flat_map(|c| c.events()).collect();
            let ended = events.iter().filter(|e| matches!(e, Event::Done(_) | Event::DoneElsewhere(_))).count();
            assert_eq!(ended, 2, "the worker's result and the ACK: {events:?}");
            let counter = match fault {
                StoreFault::Full => h.counter(|c| &c.rejected_store_full),
                StoreFault::Failed => h.counter(|c| &c.rejected_store_failed),
            };
            assert_eq!(counter, 2);
            // The log comes back: producers are accepted again.
            for ctl in &ctls {
                ctl.set_fault(None);
            }
            h.request("c", "m5", "q", "j5");
            assert_eq!(h.take_commands("c"), ["REPLY"], "{}", h.setup());
            assert_eq!(h.text_sched(1, "t", "x3"), done());
        }
    }
}

/// A log with a longer stall bound of its own (the replicated log rides
/// out a stream leader's election) is not stalled at the disk's bound.
#[test]
fn a_log_with_its_own_stall_bound_refuses_only_after_it() {
    let own = limits::NATS_STALL_TIMEOUT;
    for mut h in Harness::setups(|_| {}) {
        let ctls = h.attach_fakes();
        for ctl in &ctls {
            ctl.set_stalled(true);
            ctl.with(|s| s.stall_timeout = Some(own));
        }
        h.inform("w1", &[(10, "q")]);
        h.request("c", "m1", "q", "j1");
        h.end_batches();
        h.advance(limits::LOG_STALL_TIMEOUT + Duration::from_millis(1));
        h.end_batches();
        h.request("c", "m2", "q", "j2");
        assert!(errors_to(&mut h, "c").is_empty(), "not stalled at the disk's bound ({})", h.setup());
        h.advance(own - limits::LOG_STALL_TIMEOUT);
        h.end_batches();
        h.request("c", "m3", "q", "j3");
        assert_eq!(errors_to(&mut h, "c"), ["STORE_FAILED"], "{}", h.setup());
        assert_eq!(h.counter(|c| &c.log_stalls), 1);
    }
}

#[test]
fn a_stalled_log_refuses_producers_after_the_stall_timeout() {
    for mut h in Harness::setups(|_| {}) {
        let ctls = h.attach_fakes();
        for ctl in &ctls {
            ctl.set_stalled(true);
        }
        h.inform("w1", &[(10, "q")]);
        h.request("c", "m1", "q", "j1");
        h.end_batches();
        h.advance(limits::LOG_STALL_TIMEOUT - Duration::from_millis(1));
        h.end_batches();
        h.request("c", "m2", "q", "j2");
        assert!(errors_to(&mut h, "c").is_empty(), "not stalled yet ({})", h.setup());
        h.advance(Duration::from_millis(2));
        h.end_batches();
        h.request("c", "m3", "q", "j3");
        assert_eq!(errors_to(&mut h, "c"), ["STORE_FAILED"], "{}", h.setup());
        assert_eq!(h.text_sched(1, "q", "t1"), refused(ErrorCode::StoreFailed));
        assert_eq!(h.counter(|c| &c.log_stalls), 1);
        // Consumers go on (a worker registered now: the clock moved past
        // the first one's heartbeat timeout).
        h.inform("w2", &[(10, "q")]);
        h.ready("w2", 2);
        assert_eq!(h.take_bodies("w2"), ["j1", "j2"]);
        // The log moves again: accepted.
        for ctl in &ctls {
            ctl.set_stalled(false);
        }
        h.end_batches();
        h.request("c", "m4", "q", "j4");
        assert!(errors_to(&mut h, "c").is_empty(), "{}", h.setup());
    }
}

/// A job as a log recovers it.
fn recovered(seq: u64, queue: &str, body: &str, headers: &[u8], setbacks: u32, state: JobState) -> RecoveredJob {
    let frames = JobFrames::new(b"m", queue.as_bytes(), headers, body.as_bytes(), &[] as &[&[u8]]).unwrap();
    let now = std::time::Instant::now();
    let mut job = Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, now, now);
    job.set_redeliveries(setbacks);
    RecoveredJob { job, state }
}

#[test]
fn recovery_applies_the_retry_rule_once_to_what_the_log_found() {
    let mut h = Harness::with_config(1, |c| c.max_retries = 2);
    let (log, ctl) = FakeLog::new();
    let dead = JobState::Dead { why: Setback::Failed, at_unix_ms: 5 };
    let jobs = vec![
        recovered(1, "q", "waits", b"", 0, JobState::Waiting),
        recovered(2, "q", "out-again", b"", 1, JobState::InFlight),
        recovered(3, "q", "out-last", b"", 2, JobState::InFlight),
        recovered(4, "q", "header-keeps-it", b"retry:5", 2, JobState::InFlight),
        recovered(5, "q", "was-dead", b"", 3, dead),
    ];
    h.shards[0].attach_log(Box::new(log), FakeLog::recovered(jobs));
    assert_eq!(h.waiting("q"), ["waits", "out-again", "header-keeps-it"], "in id order");
    assert_eq!(
        ctl.events(),
        [
            Event::Requeued(JobId::new(0, 2), 2),
            Event::Buried(JobId::new(0, 3), Setback::Crash),
            Event::Requeued(JobId::new(0, 4), 3),
        ],
        "one setback each for the crash; past max_retries (its retry:N header first) to the dead set"
    );
    assert_eq!(h.counter(|c| &c.dead_lettered), 1);
    let dead: Vec<(u64, u32)> = {
        let d = &h.shards[0].dead;
        d.ids(None).into_iter().filter_map(|id| d.get(id)).map(|d| (d.job.id.seq(), d.job.redeliveries())).collect()
    };
    assert_eq!(dead, [(5, 3), (3, 3)], "oldest burial first");
    assert_eq!(ctl.with(|s| s.durable), ctl.with(|s| s.logged), "what recovery decided is synced before serving");
    // New ids continue above the recovered ones.
    h.request("c", "m9", "q", "new");
    assert!(matches!(ctl.events().last(), Some(Event::Accepted(id, _)) if id.seq() == 6));
}

#[test]
fn a_job_done_on_another_shard_is_told_to_its_owners_log() {
    let mut h = Harness::new(3);
    let ctls = h.attach_fakes();
    let (worker, q) = (h.name_on(0, "w"), h.name_on(2, "q"));
    h.inform(&worker, &[(10, &q)]);
    h.request("c", "m1", &q, "j1");
    h.ready(&worker, 1);
    h.reply(&worker, "m1");
    let owner = ctls[2].events();
    assert!(
        matches!(owner[..], [Event::Accepted(..), Event::Dispatched(id), Event::DoneElsewhere(done)] if id == done),
        "{owner:?}"
    );
    assert!(ctls[0].events().is_empty(), "the worker's home shard logs nothing of it");
}

/// Black-box finding 9 (an fsfreeze stall): the stall verdict is looked
/// at again without new work, so a stall that resolves clears it (no
/// permanent refusal); and a ticket handed out after an idle spell is not
/// called stalled at once (its wait starts when it is handed out).
#[test]
fn a_stall_is_rechecked_without_new_work_and_an_idle_spell_is_not_a_stall() {
    let mut h = Harness::new(1);
    let ctls = h.attach_fakes();
    h.inform("w1", &[(10, "q")]);
    h.request("c", "m1", "q", "j1");
    h.end_batches();
    h.end_batches();
    // An idle hour, then a slow sync: the new job is not refused at once.
    h.advance(Duration::from_secs(3600));
    ctls[0].set_stalled(true);
    h.request("c", "m2", "q", "j2");
    h.end_batches();
    h.request("c", "m3", "q", "j3");
    assert!(errors_to(&mut h, "c").is_empty(), "an idle spell is no stall");
    assert_eq!(h.counter(|c| &c.log_stalls), 0);
    assert!(!h.shards[0].log_stalled());
    // The shard wakes by itself when the wait would pass the timeout.
    let due = h.shards[0].log_deadline().expect("a look at the stall is due");
    assert_eq!(due, h.now + limits::LOG_STALL_TIMEOUT, "counted from the first ticket's batch");
    h.advance(limits::LOG_STALL_TIMEOUT);
    h.end_batches();
    assert!(h.shards[0].log_stalled(), "stalled");
    assert_eq!(h.counter(|c| &c.log_stalls), 1);
    h.request("c", "m4", "q", "j4");
    assert_eq!(errors_to(&mut h, "c"), ["STORE_FAILED"]);
    // The file system thaws: the sync side catches up on its own. No
    // message comes; the shard's re-check clears the verdict.
    ctls[0].set_stalled(false);
    let durable = h.shards[0].log().durable();
    let _ = durable.make_durable(Ticket(u64::MAX));
    assert!(durable.wait(Ticket(durable.durable_upto().0), Duration::ZERO));
    let due = h.shards[0].log_deadline().expect("stalled: looked at again");
    assert_eq!(due, h.now + limits::WAL_CHECK_INTERVAL);
    h.advance(limits::WAL_CHECK_INTERVAL);
    let now = h.now;
    let mut out = Ends::default();
    h.shards[0].fire_timers(now, &mut out.out);
    h.shards[0].end_batch(now, &mut out.out);
    assert!(!h.shards[0].log_stalled(), "the stall resolved: the verdict is cleared");
    assert_eq!(h.shards[0].log_deadline(), None, "nothing waits: no more looks");
    h.request("c", "m5", "q", "j5");
    assert!(errors_to(&mut h, "c").is_empty(), "accepted again");
}

/// New-user finding 2: a log that is full (or below `disk_free_limit`)
/// also stalls, its acknowledgements waiting for the disk; producers get
/// its own code, `STORE_FULL`, so the stall's line names that code, not
/// `STORE_FAILED`; a stall with no refusal of the log's own still names
/// `STORE_FAILED`. When the stall ends while the log still refuses, the
/// line does not say jobs are accepted.
#[test]
fn the_stall_line_names_the_code_producers_get() {
    let mut h = Harness::new(1);
    let ctls = h.attach_fakes();
    h.request("c", "m1", "q", "j1");
    h.end_batches();
    assert_eq!(h.take_commands("c"), ["REPLY"]);
    // A job accepted in the batch that finds the disk full: its ticket
    // waits (the fake makes nothing durable while faulty) past the stall
    // timeout.
    ctls[0].set_stalled(true);
    h.request("c", "m2", "q", "j2");
    h.end_batches();
    ctls[0].set_fault(Some(StoreFault::Full));
    ctls[0].set_stalled(false);
    h.advance(limits::LOG_STALL_TIMEOUT);
    let ((), said) = crate::logging::capture("warn", || h.end_batches());
    assert!(h.shards[0].log_stalled(), "stalled");
    assert!(
        said.contains(
            "has not made acknowledged work durable for 5 s: new jobs are refused (STORE_FULL, the log's own refusal; STORE_FAILED if that ends first) until it does"
        ),
        "{said}"
    );
    assert!(!said.contains("(STORE_FAILED) until it does"), "{said}");
    h.request("c", "m3", "q", "j3");
    assert_eq!(errors_to(&mut h, "c"), ["STORE_FULL"], "what the line says");
    // The disk takes the records again: durable (the release step after
    // one batch end), seen at the next, accepted, and said so.
    ctls[0].set_fault(None);
    let ((), said) = crate::logging::capture("warn", || {
        h.end_batches();
        h.end_batches();
    });
    assert!(!h.shards[0].log_stalled());
    assert!(said.contains("the job log makes work durable again: new jobs are accepted"), "{said}");
    // A plain stall (a hung sync): STORE_FAILED, as before.
    ctls[0].set_stalled(true);
    h.request("c", "m4", "q", "j4");
    h.end_batches();
    h.advance(limits::LOG_STALL_TIMEOUT);
    let ((), said) = crate::logging::capture("warn", || h.end_batches());
    assert!(said.contains("for 5 s: new jobs are refused (STORE_FAILED) until it does"), "{said}");
    h.request("c", "m5", "q", "j5");
    assert_eq!(errors_to(&mut h, "c"), ["STORE_FAILED"]);
    // It ends while the log refuses of its own (it filled meanwhile): the
    // line says what producers still get.
    ctls[0].set_fault(Some(StoreFault::Full));
    ctls[0].set_stalled(false);
    ctls[0].with(|s| s.durable = s.logged);
    let ((), said) = crate::logging::capture("warn", || h.end_batches());
    assert!(!h.shards[0].log_stalled());
    assert!(
        said.contains(
            "the job log makes work durable again; new jobs stay refused (STORE_FULL) by the log's own state"
        ),
        "{said}"
    );
    assert!(!said.contains("new jobs are accepted"), "{said}");
}
