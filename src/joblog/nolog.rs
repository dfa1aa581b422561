//! [`NoLog`]: the job log of `durability = "memory"`, which keeps nothing
//! (EventMQ's behaviour): every hook does nothing, every batch is released
//! at once, and new jobs are never refused for the log's sake.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Commit, Durable, Holdings, JobLog, LogFigures, LogStatus, StoreFault, Ticket};
use crate::ids::JobId;
use crate::job::{DeadJob, Job};

/// No log (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoLog;

/// Everything is as durable as it will ever be.
#[derive(Debug)]
struct Nothing;

impl Durable for Nothing {
    fn make_durable(&self, _: Ticket) -> bool {
        true
    }

    fn wait(&self, _: Ticket, _: Duration) -> bool {
        true
    }

    fn durable_upto(&self) -> Ticket {
        Ticket(u64::MAX)
    }
}

impl LogStatus for Nothing {
    fn figures(&self) -> LogFigures {
        LogFigures::default()
    }

    fn to_json(&self, shard: usize) -> serde_json::Value {
        serde_json::json!({ "shard": shard, "state": "ok" })
    }

    fn take_sync_histogram(&self) -> Option<hdrhistogram::Histogram<u64>> {
        None
    }
}

impl JobLog for NoLog {
    fn accepted(&mut self, _: &mut Job) {}

    fn dispatched(&mut self, _: &Job) {}

    fn requeued(&mut self, _: &mut Job) {}

    fn buried(&mut self, _: &mut DeadJob) {}

    fn unburied(&mut self, _: &mut Job) {}

    fn done(&mut self, _: &Job) {}

    fn done_elsewhere(&mut self, _: JobId) {}

    fn commit(&mut self, _: Instant) -> Commit {
        Commit::Release
    }

    fn durable(&self) -> Arc<dyn Durable> {
        Arc::new(Nothing)
    }

    fn refusal(&self) -> Option<StoreFault> {
        None
    }

    fn keeps_jobs(&self) -> bool {
        false
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn maintain(&mut self, _: Instant, _: &mut dyn Holdings) {}

    fn sync_all(&mut self) -> bool {
        true
    }

    fn status(&self) -> Arc<dyn LogStatus> {
        Arc::new(Nothing)
    }
}
