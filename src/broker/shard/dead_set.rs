//! [`DeadSet`]: the jobs of a shard's queues that ran out of retries
//! (README "Retries and the dead set"), kept for an operator to list, show,
//! retry or delete (`emq-cli dead`). Data and its rules only: the handlers
//! in `dead.rs` decide what goes in and out, and keep the router-wide
//! `dead_max_jobs` and `dead_max_bytes` by taking out the oldest
//! ([`DeadSet::pop_oldest`]). Every operation costs time linear in what it
//! returns, plus a logarithm: a queue's jobs are found through their own
//! index, never by a scan of the whole set, so the admin commands on a
//! shard take bounded steps ([`DeadSet::take_step`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{FastMap, JobId, QueueName};
use crate::job::DeadJob;

/// The dead jobs of one shard, oldest burial first.
#[derive(Debug, Default)]
pub struct DeadSet {
    /// By burial number, oldest first.
    by_seq: BTreeMap<u64, DeadJob>,
    /// Burial number of each job.
    seq_of: FastMap<JobId, u64>,
    /// Burial numbers of each queue's dead jobs (queues with none are not
    /// kept).
    per_queue: FastMap<QueueName, BTreeSet<u64>>,
    next_seq: u64,
    bytes: usize,
}

impl DeadSet {
    /// Adds `dead` as the newest burial.
    pub fn insert(&mut self, dead: DeadJob) {
        self.next_seq += 1;
        self.bytes += dead.job.frames.len();
        self.per_queue.entry(dead.job.queue()).or_default().insert(self.next_seq);
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
        let seq = self.seq_of.remove(&dead.job.id);
        self.bytes -= dead.job.frames.len();
        let queue = dead.job.queue_bytes();
        if let (Some(seqs), Some(seq)) = (self.per_queue.get_mut(queue), seq) {
            seqs.remove(&seq);
            if seqs.is_empty() {
                self.per_queue.remove(queue);
            }
        }
    }

    /// Job `id`, if it is here.
    pub fn get(&self, id: JobId) -> Option<&DeadJob> {
        self.seq_of.get(&id).and_then(|seq| self.by_seq.get(seq))
    }

    /// The jobs, oldest burial first, of `queue` only when given (through
    /// the queue's index: taking the first `n` costs `n` steps, whatever
    /// the other queues hold).
    pub fn iter<'a>(&'a self, queue: Option<&[u8]>) -> Box<dyn Iterator<Item = &'a DeadJob> + 'a> {
        match queue {
            None => Box::new(self.by_seq.values()),
            Some(q) => {
                let seqs = self.per_queue.get(q).into_iter().flatten();
                Box::new(seqs.filter_map(|seq| self.by_seq.get(seq)))
            }
        }
    }

    /// The ids of the jobs, oldest burial first, of `queue` only when given
    /// (tests).
    #[cfg(test)]
    pub fn ids(&self, queue: Option<&[u8]>) -> Vec<JobId> {
        self.iter(queue).map(|d| d.job.id).collect()
    }

    /// The burial number of the newest job buried so far (0 before any):
    /// [`DeadSet::take_step`] up to it takes the jobs buried by now, none
    /// buried later.
    pub fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// Takes out at most `max` jobs, oldest burial first, of `queue` only
    /// when given, whose burial numbers are from `from` through `upto`;
    /// returns them and the burial number to go on from when more are
    /// left in that range (`None`: done). Costs time linear in `max`, plus
    /// a logarithm: a long operation on the set goes in steps of this.
    pub fn take_step(&mut self, from: u64, upto: u64, queue: Option<&[u8]>, max: usize) -> (Vec<DeadJob>, Option<u64>) {
        if from > upto {
            return (Vec::new(), None);
        }
        let mut seqs: Vec<u64> = match queue {
            None => self.by_seq.range(from..=upto).map(|(seq, _)| *seq).take(max + 1).collect(),
            Some(q) => {
                self.per_queue.get(q).into_iter().flat_map(|s| s.range(from..=upto)).copied().take(max + 1).collect()
            }
        };
        let next = (seqs.len() > max).then(|| seqs[max]);
        seqs.truncate(max);
        let mut taken = Vec::with_capacity(seqs.len());
        for seq in seqs {
            if let Some(dead) = self.by_seq.remove(&seq) {
                self.forget(&dead);
                taken.push(dead);
            }
        }
        (taken, next)
    }

    /// Dead jobs of `queue`.
    pub fn count(&self, queue: &QueueName) -> usize {
        self.per_queue.get(queue).map_or(0, BTreeSet::len)
    }

    /// `(queue, dead jobs)` for every queue holding some.
    pub fn per_queue(&self) -> impl Iterator<Item = (&QueueName, usize)> {
        self.per_queue.iter().map(|(q, seqs)| (q, seqs.len()))
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

    #[test]
    fn steps_take_at_most_their_share_in_burial_order_up_to_a_mark() {
        let mut set = DeadSet::default();
        for seq in 1..=10 {
            set.insert(dead(seq, if seq % 2 == 0 { "even" } else { "odd" }, 1));
        }
        let upto = set.last_seq();
        set.insert(dead(11, "odd", 1));
        let seqs = |jobs: Vec<DeadJob>| jobs.iter().map(|d| d.job.id.seq()).collect::<Vec<_>>();
        // Of one queue: 3 at a time, the burial after the mark left alone.
        let (jobs, next) = set.take_step(0, upto, Some(b"odd"), 3);
        assert_eq!((seqs(jobs), next), (vec![1, 3, 5], Some(7)));
        let (jobs, next) = set.take_step(7, upto, Some(b"odd"), 3);
        assert_eq!((seqs(jobs), next), (vec![7, 9], None));
        assert_eq!(set.count(&QueueName::named("odd")), 1, "the one buried after the mark");
        assert_eq!(set.ids(Some(b"odd")), [JobId::new(0, 11)]);
        // Of all queues: a step of exactly what is left says it is done.
        let (jobs, next) = set.take_step(0, upto, None, 5);
        assert_eq!((seqs(jobs), next), (vec![2, 4, 6, 8, 10], None));
        assert_eq!((set.len(), set.count(&QueueName::named("even"))), (1, 0));
        assert_eq!(set.take_step(5, 4, None, 5).0.len(), 0, "an empty range");
    }
}
