//! [`DeadSet`]: the jobs of a shard's queues that ran out of retries
//! (README "Retries and the dead set"), kept for an operator to list, show,
//! retry or delete (`emq-cli dead`). Data and its rules only: the handlers
//! in `dead.rs` decide what goes in and out, and keep the router-wide
//! `dead_max_jobs` and `dead_max_bytes` by taking out the oldest
//! ([`DeadSet::pop_oldest`]). Every operation costs time linear in what it
//! returns, plus a logarithm.

use std::collections::BTreeMap;

use crate::ids::{FastMap, JobId, QueueName};
use crate::job::DeadJob;

/// The dead jobs of one shard, oldest burial first.
#[derive(Debug, Default)]
pub struct DeadSet {
    /// By burial number, oldest first.
    by_seq: BTreeMap<u64, DeadJob>,
    /// Burial number of each job.
    seq_of: FastMap<JobId, u64>,
    /// Dead jobs per queue (queues with none are not kept).
    per_queue: FastMap<QueueName, usize>,
    next_seq: u64,
    bytes: usize,
}

impl DeadSet {
    /// Adds `dead` as the newest burial.
    pub fn insert(&mut self, dead: DeadJob) {
        self.next_seq += 1;
        self.bytes += dead.job.frames.len();
        *self.per_queue.entry(dead.job.queue()).or_default() += 1;
        self.seq_of.insert(dead.job.id, self.next_seq);
        self.by_seq.insert(self.next_seq, dead);
    }

    /// Takes the oldest burial out, if any.
    pub fn pop_oldest(&mut self) -> Option<DeadJob> {
        let (_, oldest) = self.by_seq.pop_first()?;
        self.forget(&oldest);
        Some(oldest)
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
    use crate::job::Setback;
    use crate::job::{Job, JobFrames, Origin};
    use std::time::Instant;

    fn dead(seq: u64, queue: &str, body: usize) -> DeadJob {
        let frames = JobFrames::new(b"m", queue.as_bytes(), b"", &vec![b'x'; body], &[] as &[&[u8]]).unwrap();
        let now = Instant::now();
        let job = Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, now, now);
        DeadJob { job, why: Setback::Failed, at_unix_ms: seq }
    }

    #[test]
    fn the_oldest_comes_out_first_and_counts_follow() {
        let mut set = DeadSet::default();
        for (seq, q) in [(1, "a"), (2, "b"), (3, "a")] {
            set.insert(dead(seq, q, 10));
        }
        let per_job = dead(9, "a", 10).job.frames.len();
        assert_eq!((set.len(), set.bytes()), (3, 3 * per_job));
        assert_eq!(set.pop_oldest().map(|d| d.job.id.seq()), Some(1));
        assert_eq!((set.len(), set.count(&QueueName::named("a")), set.count(&QueueName::named("b"))), (2, 1, 1));
        assert_eq!(set.bytes(), 2 * per_job);
    }

    #[test]
    fn remove_get_and_filter_by_queue() {
        let mut set = DeadSet::default();
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
        while set.pop_oldest().is_some() {}
        assert_eq!((set.len(), set.bytes(), set.per_queue().count()), (0, 0, 0));
    }
}
