//! Setbacks and dead jobs: why a delivery of a job came to nothing
//! ([`Setback`]) and a job kept in the dead set ([`DeadJob`]). Plain data:
//! the retry policy that counts setbacks is the broker's
//! (`crate::broker::retry`); the log records them (`crate::wal::record`).

use super::Job;

/// Why a delivery of a job came to nothing. Each counts one setback
/// ([`Job::redeliveries`]); past its allowed retries
/// (`crate::broker::retry::allowed_retries`) the job goes to the dead set
/// with the last one as its reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setback {
    /// Its worker answered with a REPLY marked `failed` (`emq-worker`'s
    /// command exited non-zero or timed out; a Rust worker's job returned
    /// an error). Retried after a back-off (`crate::broker::retry::backoff`).
    Failed,
    /// It passed its deadline on a worker that still heartbeats
    /// (`src/broker/shard/deadline.rs`). Retried after a back-off (`crate::broker::retry::backoff`).
    Deadline,
    /// Its worker went away holding it (expired, DISCONNECT, a send
    /// failure). Back at the front of its queue at once: the job did not
    /// fail, its worker did.
    WorkerGone,
    /// A text consumer holding it disconnected or let its offer time out.
    /// Back at the front at once, like [`Setback::WorkerGone`].
    Returned,
    /// It was in flight when the router stopped without draining (found
    /// at recovery). Back at the front at once.
    Crash,
}

impl Setback {
    /// Every setback, in code order ([`Setback::code`]).
    pub const ALL: [Setback; 5] =
        [Setback::Failed, Setback::Deadline, Setback::WorkerGone, Setback::Returned, Setback::Crash];

    /// The reason as `emq-cli dead list` and the JSON show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Setback::Failed => "failed",
            Setback::Deadline => "deadline",
            Setback::WorkerGone => "worker_gone",
            Setback::Returned => "text_returned",
            Setback::Crash => "in_flight_at_crash",
        }
    }

    /// Its one-byte code in the write-ahead log (`crate::wal::record`).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The setback of log code `code`, if any.
    pub fn from_code(code: u8) -> Option<Setback> {
        Setback::ALL.get(usize::from(code)).copied()
    }

    /// Whether the next try waits for a back-off (`crate::broker::retry::backoff`) (a failure of the job
    /// itself) rather than going back to the front of its queue at once
    /// (a failure of whoever held it).
    pub fn backs_off(self) -> bool {
        matches!(self, Setback::Failed | Setback::Deadline)
    }
}

/// A job in the dead set: the job (its [`Job::redeliveries`] are its
/// setbacks), its last setback and when it was buried, in milliseconds
/// since the Unix epoch.
#[derive(Debug, Clone)]
pub struct DeadJob {
    /// The job, as it was when it was last tried.
    pub job: Job,
    /// Why its last try came to nothing.
    pub why: Setback,
    /// When it was buried (ms since the Unix epoch, the router's clock).
    pub at_unix_ms: u64,
}

/// The wall clock now, in milliseconds since the Unix epoch (burial times;
/// 0 for a clock before 1970).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setback_codes_round_trip() {
        for s in Setback::ALL {
            assert_eq!(Setback::from_code(s.code()), Some(s));
        }
        assert_eq!(Setback::from_code(200), None);
    }
}
