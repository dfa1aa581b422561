//! Per-queue job counters, declared once in `queue_counters!`: each line
//! makes a [`QueueCounter`], its slot in [`QueueCounts`], its STATUS key and
//! its `emq-cli status` column. The queue's shard counts for both
//! protocols; adding a counter is one line in the table below (then bump it
//! where the event happens).

macro_rules! queue_counters {
    ($( $(#[doc = $doc:literal])+ $name:ident => $key:literal, $header:literal; )*) => {
        /// One per-queue counter.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum QueueCounter {
            $( $(#[doc = $doc])+ $name, )*
        }

        impl QueueCounter {
            /// Every counter, in column order.
            pub const ALL: &'static [QueueCounter] = &[$(QueueCounter::$name),*];

            /// Its STATUS key (a map of queue → count, like EventMQ's
            /// `processed_messages_by_queue`).
            pub fn status_key(self) -> &'static str {
                match self { $(QueueCounter::$name => $key,)* }
            }

            /// Its `emq-cli status` column.
            pub fn header(self) -> &'static str {
                match self { $(QueueCounter::$name => $header,)* }
            }
        }
    };
}

queue_counters! {
    /// Jobs the queue accepted (REQUEST or SCHED admitted; a job put on
    /// `default` counts there).
    Accepted => "accepted_messages_by_queue", "ACCEPTED";
    /// Jobs handed to an eMQP worker or offered to a text consumer (`WANT?`);
    /// a job handed out again after a requeue counts again.
    Dispatched => "dispatched_messages_by_queue", "DISPATCHED";
    /// Jobs whose worker reported a result (job-result REPLY) or that a text
    /// consumer took (`ACK`).
    Completed => "completed_messages_by_queue", "COMPLETED";
    /// Jobs an emq worker reported as failed (a job-result REPLY marked
    /// `failed`; a Python jobmanager's failures cannot be told from
    /// results) or that a text consumer deleted (`DEL`).
    Failed => "failed_messages_by_queue", "FAILED";
    /// Jobs set back for another try after a back-off, following a failed
    /// result or a deadline (README "Retries and the dead set"): counted
    /// when the back-off begins, so those still waiting it out are in
    /// STATUS's `retrying_messages_by_queue` too.
    Retried => "retried_messages_by_queue", "RETRIED";
    /// Jobs moved to the dead set since start: out of retries
    /// (`max_retries` or `retry:N`). Not the dead set now (STATUS's
    /// `dead_messages_by_queue`, the `DEAD` column): a job retried or
    /// deleted from the set stays counted, and a restart starts at 0.
    DeadLettered => "dead_lettered_messages_by_queue", "DEAD-LETTERED";
}

/// The counts of one queue since the router started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts([u64; QueueCounter::ALL.len()]);

impl QueueCounts {
    /// Adds one to `counter`.
    pub fn bump(&mut self, counter: QueueCounter) {
        self.0[counter as usize] += 1;
    }

    /// Adds `n` to `counter`.
    pub fn add(&mut self, counter: QueueCounter, n: u64) {
        self.0[counter as usize] += n;
    }

    /// The count of `counter`.
    pub fn get(&self, counter: QueueCounter) -> u64 {
        self.0[counter as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_have_distinct_keys_and_slots() {
        let mut c = QueueCounts::default();
        c.bump(QueueCounter::Completed);
        c.bump(QueueCounter::Completed);
        assert_eq!(c.get(QueueCounter::Completed), 2);
        assert_eq!(QueueCounter::ALL.iter().map(|k| c.get(*k)).sum::<u64>(), 2);
        let keys: std::collections::HashSet<_> = QueueCounter::ALL.iter().map(|k| k.status_key()).collect();
        assert_eq!(keys.len(), QueueCounter::ALL.len());
    }
}
