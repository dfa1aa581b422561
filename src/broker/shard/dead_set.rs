//! [`DeadSet`]: the jobs of a shard's queues that ran out of retries
//! (README "Retries and the dead set"), kept for an operator to list, show,
//! retry or delete (`emq-cli dead`). Data and its rules only: the handlers
//! in `dead.rs` decide what goes in and out.
//!
//! Bounded by count and bytes (each shard holds its share of the router's
//! `dead_max_jobs` and `dead_max_bytes`): past either, the jobs buried
//! longest ago are evicted for good, as Faktory's dead set drops its oldest.
//! Every operation costs time linear in what it returns, plus a logarithm.

use std::collections::BTreeMap;

use crate::broker::retry::DeadJob;
use crate::ids::{FastMap, JobId, QueueName};

/// The dead jobs of one shard, oldest burial first.
#[derive(Debug)]
pub struct DeadSet {
    /// By burial number, oldest first.
    by_seq: BTreeMap<u64, DeadJob>,
    /// Burial number of each job.
    seq_of: FastMap<JobId, u64>,
    /// Dead jobs per queue (queues with none are not kept).
    per_queue: FastMap<QueueName, usize>,
    next_seq: u64,
    bytes: usize,
    max_jobs: usize,
    max_bytes: usize,
}

impl DeadSet {
    /// An empty set holding at most `max_jobs` jobs and `max_bytes` bytes
    /// of job frames (each at least 1).
    pub fn new(max_jobs: usize, max_bytes: usize) -> DeadSet {
        DeadSet {
            by_seq: BTreeMap::new(),
            seq_of: FastMap::default(),
            per_queue: FastMap::default(),
            next_seq: 0,
            bytes: 0,
            max_jobs: max_jobs.max(1),
            max_bytes: max_bytes.max(1),
        }
    }

    /// Adds `dead`; returns the jobs evicted to stay within the limits,
    /// oldest first (`dead` itself when it alone is over the byte limit).
    pub fn insert(&mut self, dead: DeadJob) -> Vec<DeadJob> {
        if dead.job.frames.len() > self.max_bytes {
            return vec![dead];
        }
        self.next_seq += 1;
        self.bytes += dead.job.frames.len();
        *self.per_queue.entry(dead.job.queue()).or_default() += 1;
        self.seq_of.insert(dead.job.id, self.next_seq);
        self.by_seq.insert(self.next_seq, dead);
        let mut evicted = Vec::new();
        while self.by_seq.len() > self.max_jobs || self.bytes > self.max_bytes {
            let Some((_, oldest)) = self.by_seq.pop_first() else { break };
            self.forget(&oldest);
            evicted.push(oldest);
        }
        evicted
    }

    /// Takes job `id` out, if it is here.
    pub fn remove(&mut self, id: JobId) -> Option<DeadJob> {
        let seq = self.seq_of.get(&id).copied()?;
        let dead = self.by_seq.remove(&seq)?;
        self.forget(&dead);
        Some(dead)
    }

    fn forget(&mut self, dead: &DeadJob) {
        self.seq_of.remove(&dead.job.id);
        self.bytes -= dead.job.frames.len();
        let queue = dead.job.queue();
        if let Some(n) = self.per_queue.get_mut(&queue) {
            *n -= 1;
            if *n == 0 {
                self.per_queue.remove(&queue);
            }
        }
    }

    /// Job `id`, if it is here.
    pub fn get(&self, id: JobId) -> Option<&DeadJob> {
        self.seq_of.get(&id).and_then(|seq| self.by_seq.get(seq))
    }

    /// The jobs, oldest burial first, of `queue` only when given.
    pub fn iter<'a>(&'a self, queue: Option<&'a [u8]>) -> impl Iterator<Item = &'a DeadJob> + 'a {
        self.by_seq.values().filter(move |d| queue.is_none_or(|q| d.job.queue_bytes() == q))
    }

    /// The ids of the jobs, oldest burial first, of `queue` only when given.
    pub fn ids(&self, queue: Option<&[u8]>) -> Vec<JobId> {
        self.iter(queue).map(|d| d.job.id).collect()
    }

    /// Dead jobs of `queue`.
    pub fn count(&self, queue: &QueueName) -> usize {
        self.per_queue.get(queue).copied().unwrap_or(0)
    }

    /// `(queue, dead jobs)` for every queue holding some.
    pub fn per_queue(&self) -> impl Iterator<Item = (&QueueName, usize)> {
        self.per_queue.iter().map(|(q, n)| (q, *n))
    }

    /// Jobs held.
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// Whether it holds no job.
    pub fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// Bytes of the jobs' frames held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Calls `f` on at most `max` jobs from burial number `from` on
    /// (compaction moves their log records); returns how many it saw and
    /// where to go on, `None` at the end.
    pub fn visit_mut(&mut self, from: u64, max: usize, mut f: impl FnMut(&mut DeadJob)) -> (usize, Option<u64>) {
        let mut seen = 0;
        for (seq, dead) in self.by_seq.range_mut(from..) {
            if seen == max {
                return (seen, Some(*seq));
            }
            f(dead);
            seen += 1;
        }
        (seen, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::job::{Job, JobFrames, Origin};
    use crate::broker::retry::Setback;
    use std::time::Instant;

    fn dead(seq: u64, queue: &str, body: usize) -> DeadJob {
        let frames = JobFrames::new(b"m", queue.as_bytes(), b"", &vec![b'x'; body], &[] as &[&[u8]]).unwrap();
        let now = Instant::now();
        let job = Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, now, now);
        DeadJob { job, why: Setback::Failed, at_unix_ms: seq }
    }

    #[test]
    fn the_oldest_go_first_past_either_limit() {
        let mut set = DeadSet::new(2, 10_000);
        assert!(set.insert(dead(1, "a", 10)).is_empty());
        assert!(set.insert(dead(2, "b", 10)).is_empty());
        let out = set.insert(dead(3, "a", 10));
        assert_eq!(out.iter().map(|d| d.job.id.seq()).collect::<Vec<_>>(), [1]);
        assert_eq!((set.len(), set.count(&QueueName::named("a")), set.count(&QueueName::named("b"))), (2, 1, 1));
        let per_job = dead(9, "a", 100).job.frames.len();
        let mut set = DeadSet::new(100, 2 * per_job);
        for seq in 1..=3 {
            set.insert(dead(seq, "a", 100));
        }
        assert_eq!(set.ids(None), [JobId::new(0, 2), JobId::new(0, 3)]);
        assert_eq!(set.bytes(), 2 * per_job);
        let too_big = set.insert(dead(4, "a", 1000));
        assert_eq!(too_big.len(), 1, "a job over the byte limit alone is not kept");
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn remove_get_and_filter_by_queue() {
        let mut set = DeadSet::new(10, 10_000);
        for (seq, q) in [(1, "a"), (2, "b"), (3, "a")] {
            set.insert(dead(seq, q, 1));
        }
        assert_eq!(set.ids(Some(b"a")), [JobId::new(0, 1), JobId::new(0, 3)]);
        assert!(set.get(JobId::new(0, 2)).is_some());
        assert_eq!(set.remove(JobId::new(0, 2)).map(|d| d.job.id), Some(JobId::new(0, 2)));
        assert!(set.remove(JobId::new(0, 2)).is_none());
        assert_eq!(set.per_queue().count(), 1, "a queue with no dead job is not kept");
        let (mut seen, mut at) = (0, Some(0));
        while let Some(from) = at {
            let (n, next) = set.visit_mut(from, 1, |_| {});
            seen += n;
            at = next;
        }
        assert_eq!(seen, 2);
        assert_eq!(set.len(), 2);
        assert!(!set.is_empty());
    }
}
