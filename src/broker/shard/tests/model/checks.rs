//! The checks the model runs after every step, and how it then catches up
//! with what it saw.

use std::collections::{BTreeMap, BTreeSet};

use super::super::observe::Jobs;
use super::{Model, Step};
use crate::broker::egress::{Dest, OnFail, Outgoing};
use crate::ids::WorkerKey;
use crate::limits::MAX_RETRIES;
use crate::protocol::headers;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Bodies present and how often each appears.
fn present(jobs: &Jobs) -> BTreeMap<String, usize> {
    let mut count = BTreeMap::new();
    for (body, _) in jobs.places() {
        *count.entry(body).or_insert(0) += 1;
    }
    count
}

impl Model {
    /// Frames the step sent to workers: only ACK, HEARTBEAT and jobs, and
    /// DISCONNECT to a worker with no registration; after a KBYE nothing
    /// (not even HEARTBEAT) but the router's own KBYE; each job checked
    /// and recorded as held.
    pub(super) fn check_frames(&mut self, step: &Step) {
        for o in std::mem::take(&mut self.h.emqp) {
            let (peer, word) = (text(&o.peer.0), text(&o.msg.to_frames()[2]));
            assert_eq!(o.dest, Dest::Backend, "only workers hear from the shards here: {word} to {peer}");
            let kbye = self.h.key_of(&peer).and_then(|k| self.regs.get(&k)).is_some_and(|r| r.kbye);
            if kbye && step.informed.as_deref() != Some(peer.as_str()) {
                assert!(word == "KBYE", "{word} sent to {peer} after its KBYE");
            }
            match word.as_str() {
                "REQUEST" => self.dispatched(&peer, &o),
                "ACK" | "HEARTBEAT" => {}
                // A worker the router does not know is told to register again.
                "DISCONNECT" => assert!(self.h.key_of(&peer).is_none(), "DISCONNECT sent to registered worker {peer}"),
                other => panic!("{other} sent to worker {peer}"),
            }
        }
    }

    fn dispatched(&mut self, peer: &str, o: &Outgoing) {
        let OnFail::Job { home, key } = o.on_fail else { panic!("a job without its OnFail::Job") };
        assert_eq!(home, self.h.shard_of(peer));
        let reg = self.regs.get_mut(&key).expect("jobs go to registrations made by an INFORM");
        assert_eq!(reg.id, peer);
        assert!(!reg.kbye, "a job sent to {peer} after its KBYE");
        let (msgid, body) = (text(&o.msg.to_frames()[3]), text(&o.msg.to_frames()[6]));
        let job = self.accepted.get(&body).unwrap_or_else(|| panic!("{body} sent but never accepted"));
        assert!(!self.ended.contains(&body), "{body} sent after it ended");
        assert_eq!(text(&o.msg.to_frames()[4]), job.named, "frame 4 is the queue the client named");
        assert!(reg.queues.contains(&job.queue), "{body} of {} sent to {peer} serving {:?}", job.queue, reg.queues);
        assert!(headers::has(&o.msg.to_frames()[5], headers::REPLY_REQUESTED));
        reg.held.push((body.clone(), msgid));
        reg.dispatched += 1;
        self.sends.push((body.clone(), key));
        *self.deliveries.entry(body).or_insert(0) += 1;
    }

    /// Every accepted job exactly once somewhere or ended, in its queue;
    /// only the step's own ends and dead letters vanish.
    pub(super) fn check_jobs(&mut self, before: &Jobs, after: &Jobs, step: &Step, counts: (u64, u64)) {
        let (was, is) = (present(before), present(after));
        for (body, n) in &is {
            assert_eq!(*n, 1, "{body} is in {n} places: {:?}", after.places());
            assert!(!self.ended.contains(body), "{body} came back after it ended");
        }
        for (body, queue) in after.queues() {
            let job = self.accepted.get(body).unwrap_or_else(|| panic!("{body} is held but was never accepted"));
            assert_eq!(job.queue, queue, "{body} (named {}) is in the wrong queue", job.named);
        }
        let vanished: BTreeSet<&String> = was.keys().filter(|b| !is.contains_key(*b)).collect();
        for end in &step.ends {
            assert!(vanished.contains(end), "{end} was ended but is still held");
        }
        let dead: Vec<&&String> = vanished.iter().filter(|b| !step.ends.contains(b)).collect();
        for body in &dead {
            let n = self.deliveries.get(**body).copied().unwrap_or(0);
            assert!(n > MAX_RETRIES, "{body} vanished after {n} deliveries");
        }
        let (dead_before, completed_before) = counts;
        let (dead_now, completed_now) = self.counts();
        assert_eq!(dead_now - dead_before, dead.len() as u64, "dead letters counted");
        assert_eq!(completed_now - completed_before, step.completed, "completions counted");
        self.ended.extend(vanished.into_iter().cloned());
        for body in self.accepted.keys() {
            assert!(is.contains_key(body) != self.ended.contains(body), "{body} is lost");
        }
        if step.unchanged {
            assert_eq!(before.places(), after.places(), "a stale answer changed nothing");
        }
    }

    /// Credit (and no free slot idles while its queues hold jobs), what each
    /// worker holds, and the order of requeued jobs.
    pub(super) fn check_workers(&self, before: &Jobs, after: &Jobs) {
        let registered = self.h.registered();
        for (id, key) in &registered {
            let reg = self.regs.get(key).expect("every registration came from an INFORM");
            let slots = self.h.slots(id);
            assert!(slots >= 0, "{id} has {slots} slots");
            assert_eq!(slots, reg.readies - reg.dispatched, "{id}: slots = READYs given - jobs sent");
            if slots > 0 && !reg.kbye {
                let waiting = reg.queues.iter().find(|q| after.waiting.contains_key(*q));
                assert_eq!(waiting, None, "{id} has {slots} free slots while its queue holds jobs");
            }
            let mut held: Vec<&(String, String)> = reg.held.iter().collect();
            let mut recorded: Vec<(String, String)> = after
                .inflight
                .get(key)
                .map_or(Vec::new(), |(_, h)| h.iter().map(|j| (j.body.clone(), j.msgid.clone())).collect());
            held.sort();
            recorded.sort();
            assert_eq!(held, recorded.iter().collect::<Vec<_>>(), "{id} holds what it was sent");
        }
        let removed = self.regs.iter().filter(|(key, reg)| registered.get(&reg.id) != Some(key));
        for (key, reg) in removed {
            // What it held when it went: not the jobs sent on to another
            // worker after it (they may come back with that one).
            let sent_on =
                |body: &String| self.sends.iter().rev().find(|(b, _)| b == body).is_some_and(|(_, k)| k != key);
            let back: Vec<&String> = reg.held.iter().map(|(b, _)| b).filter(|b| !sent_on(b)).collect();
            self.requeued_in_order(&reg.id, &back, before, after);
        }
    }

    /// The jobs `back` (in dispatch order) of a removed worker that wait
    /// again keep their order, ahead of every job of their queue that
    /// waited before the step and was not sent to a worker since.
    fn requeued_in_order(&self, id: &str, back: &[&String], before: &Jobs, after: &Jobs) {
        for (queue, waiting) in &after.waiting {
            let mine: Vec<usize> = back.iter().filter_map(|body| waiting.iter().position(|b| b == *body)).collect();
            assert!(mine.windows(2).all(|p| p[0] < p[1]), "{id}'s jobs requeued out of order in {queue}: {waiting:?}");
            let stayed = |b: &String| {
                before.waiting.get(queue).is_some_and(|w| w.contains(b)) && !self.sends.iter().any(|(s, _)| s == b)
            };
            if let (Some(last), Some(first_old)) = (mine.last(), waiting.iter().position(stayed)) {
                assert!(*last < first_old, "{id}'s jobs requeued behind older ones in {queue}: {waiting:?}");
            }
        }
    }

    /// Live offers are the model's; DCL goes to the back, release to the front.
    pub(super) fn check_offers(&self, after: &Jobs, step: &Step) {
        let now = self.h.now;
        let mut held: Vec<(u64, String, String)> =
            after.offered.iter().map(|o| (o.conn.0, format!("{:?}", o.id), o.body.clone())).collect();
        let mut live: Vec<(u64, String, String)> = self
            .offers
            .iter()
            .filter(|(_, o)| o.deadline > now)
            .map(|(c, o)| (*c, format!("{:?}", o.id), o.body.clone()))
            .collect();
        held.sort();
        live.sort();
        assert_eq!(held, live, "the offers held are the live ones");
        assert!(after.offered.iter().all(|o| o.deadline > now), "a lapsed offer is still held");
        let waiting_place =
            |body: &str| after.waiting.values().find_map(|w| w.iter().position(|b| b == body).map(|at| (at, w.len())));
        if let Some((at, len)) = step.declined.as_deref().and_then(waiting_place) {
            assert_eq!(at, len - 1, "a DCLed job goes to the back");
        }
        if let Some((at, _)) = step.released.as_deref().and_then(waiting_place) {
            assert_eq!(at, 0, "a released job goes to the front");
        }
    }

    /// Forgets registrations that are gone and offers that lapsed, and
    /// takes the home shards' dispatch order for what each worker holds
    /// (two shards dispatching to one worker in one step may record their
    /// jobs in either order).
    pub(super) fn settle(&mut self, after: &Jobs) {
        let registered: BTreeSet<WorkerKey> = self.h.registered().into_values().collect();
        self.regs.retain(|key, _| registered.contains(key));
        for (key, reg) in &mut self.regs {
            let held = after.inflight.get(key).map_or(&[][..], |(_, h)| h.as_slice());
            reg.held = held.iter().map(|j| (j.body.clone(), j.msgid.clone())).collect();
        }
        let now = self.h.now;
        self.offers.retain(|_, o| o.deadline > now);
    }
}
