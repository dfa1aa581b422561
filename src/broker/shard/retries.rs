//! [`RetryTable`]: jobs of a shard's queues waiting out their back-off
//! before their next try (README "Retries and the dead set"). Data only:
//! `dead.rs` puts jobs in and takes the due ones back to their queues.
//!
//! Its size is bounded by the jobs admitted (each job is here, in a queue,
//! in flight or offered, never two of them), and so by `max_memory_bytes`.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::ids::{FastMap, JobId, QueueName};
use crate::job::Job;

/// Jobs waiting for their retry time, earliest first.
#[derive(Debug, Default)]
pub struct RetryTable {
    by_due: BTreeMap<(Instant, JobId), Job>,
    per_queue: FastMap<QueueName, usize>,
}

impl RetryTable {
    /// `job` is tried again at `at`.
    pub fn insert(&mut self, at: Instant, job: Job) {
        *self.per_queue.entry(job.queue()).or_default() += 1;
        self.by_due.insert((at, job.id), job);
    }

    /// Takes every job due at `now`, earliest first.
    pub fn take_due(&mut self, now: Instant) -> Vec<Job> {
        let mut due = Vec::new();
        while let Some(entry) = self.by_due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let job = entry.remove();
            let queue = job.queue();
            if let Some(n) = self.per_queue.get_mut(&queue) {
                *n -= 1;
                if *n == 0 {
                    self.per_queue.remove(&queue);
                }
            }
            due.push(job);
        }
        due
    }

    /// When the next job is due, if any is waiting.
    pub fn next_due(&self) -> Option<Instant> {
        self.by_due.keys().next().map(|(at, _)| *at)
    }

    /// Jobs of `queue` waiting.
    pub fn count(&self, queue: &QueueName) -> usize {
        self.per_queue.get(queue).copied().unwrap_or(0)
    }

    /// `(queue, jobs waiting)` for every queue with some.
    pub fn per_queue(&self) -> impl Iterator<Item = (&QueueName, usize)> {
        self.per_queue.iter().map(|(q, n)| (q, *n))
    }

    /// Every waiting job with its due time, earliest first.
    pub fn iter(&self) -> impl Iterator<Item = (Instant, &Job)> {
        self.by_due.iter().map(|((at, _), job)| (*at, job))
    }

    /// Calls `f` on every waiting job, earliest first (the job log's
    /// repair rewrites them; their order and due times stay).
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Job)) {
        for job in self.by_due.values_mut() {
            f(job);
        }
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.by_due.len()
    }

    /// Whether no job waits.
    pub fn is_empty(&self) -> bool {
        self.by_due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobFrames, Origin};
    use std::time::Duration;

    #[test]
    fn due_jobs_come_out_earliest_first_and_counts_follow() {
        let t0 = Instant::now();
        let job = |seq: u64, q: &str| {
            let frames = JobFrames::new(b"m", q.as_bytes(), b"", b"", &[] as &[&[u8]]).unwrap();
            Job::new(JobId::new(0, seq), frames, Origin::Emqp, false, t0, t0)
        };
        let mut t = RetryTable::default();
        t.insert(t0 + Duration::from_secs(3), job(1, "a"));
        t.insert(t0 + Duration::from_secs(1), job(2, "a"));
        t.insert(t0 + Duration::from_secs(2), job(3, "b"));
        assert_eq!((t.len(), t.count(&QueueName::named("a"))), (3, 2));
        assert_eq!(t.next_due(), Some(t0 + Duration::from_secs(1)));
        let due = t.take_due(t0 + Duration::from_secs(2));
        assert_eq!(due.iter().map(|j| j.id.seq()).collect::<Vec<_>>(), [2, 3]);
        assert_eq!((t.count(&QueueName::named("b")), t.per_queue().count()), (0, 1));
        assert!(t.take_due(t0).is_empty());
        assert_eq!(t.iter().count(), 1);
        assert!(!t.is_empty());
    }
}
