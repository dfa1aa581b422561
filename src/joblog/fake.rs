//! [`FakeLog`]: a job log for the shard tests that keeps nothing on disk. It records every
//! hook as an [`Event`], counts one ticket per event, and can be told,
//! through its [`FakeControl`], to fail (`STORE_FAILED`), fill up
//! (`STORE_FULL`) or stall (tickets never become durable), and to come
//! back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Commit, Durable, Holdings, JobLog, LogFigures, LogState, LogStatus, Recovered, StoreFault, Ticket};
use crate::ids::JobId;
use crate::job::{DeadJob, Job, Setback};

/// What a shard told its fake log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// [`JobLog::accepted`]: the job's id and body.
    Accepted(JobId, Vec<u8>),
    /// [`JobLog::dispatched`].
    Dispatched(JobId),
    /// [`JobLog::requeued`], with the job's setbacks.
    Requeued(JobId, u32),
    /// [`JobLog::buried`], with why.
    Buried(JobId, Setback),
    /// [`JobLog::unburied`].
    Unburied(JobId),
    /// [`JobLog::done`].
    Done(JobId),
    /// [`JobLog::done_elsewhere`].
    DoneElsewhere(JobId),
}

/// The state a test reads and changes.
#[derive(Debug, Default)]
pub struct FakeState {
    /// Every hook so far, in order.
    pub events: Vec<Event>,
    /// Tickets so far: one per event.
    pub logged: u64,
    /// The durable point.
    pub durable: u64,
    /// Tickets are never made durable while set (a hung disk).
    pub stalled: bool,
    /// New jobs are refused with this while set; nothing is made durable.
    pub fault: Option<StoreFault>,
    /// Calls of [`JobLog::maintain`] (a repair attempt while faulty).
    pub maintained: u64,
    /// Calls of [`JobLog::commit`].
    pub commits: u64,
    /// The log's own stall bound ([`Durable::stall_timeout`]); the
    /// default's when `None`.
    pub stall_timeout: Option<std::time::Duration>,
}

/// The test's handle on a [`FakeLog`] (shared with it).
#[derive(Debug, Default)]
pub struct FakeControl {
    state: Mutex<FakeState>,
}

impl FakeControl {
    /// Runs `f` on the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.with(|s| s.events.clone())
    }

    /// Sets or clears the fault.
    pub fn set_fault(&self, fault: Option<StoreFault>) {
        self.with(|s| s.fault = fault);
    }

    /// Stalls the log, or lets it go on.
    pub fn set_stalled(&self, stalled: bool) {
        self.with(|s| s.stalled = stalled);
    }
}

impl Durable for FakeControl {
    fn stall_timeout(&self) -> std::time::Duration {
        self.with(|s| s.stall_timeout).unwrap_or(crate::limits::LOG_STALL_TIMEOUT)
    }

    fn make_durable(&self, upto: Ticket) -> bool {
        self.with(|s| {
            if !s.stalled && s.fault.is_none() {
                s.durable = s.durable.max(upto.0.min(s.logged));
            }
            s.durable >= upto.0
        })
    }

    fn wait(&self, upto: Ticket, _: Duration) -> bool {
        self.with(|s| s.durable >= upto.0)
    }

    fn durable_upto(&self) -> Ticket {
        Ticket(self.with(|s| s.durable))
    }

    fn faulty(&self) -> bool {
        self.with(|s| s.fault.is_some())
    }
}

impl LogStatus for FakeControl {
    fn figures(&self) -> LogFigures {
        self.with(|s| LogFigures {
            state: match s.fault {
                Some(StoreFault::Full) => LogState::Faulty(super::FaultKind::Full),
                Some(StoreFault::Failed) => LogState::Faulty(super::FaultKind::Io),
                None => LogState::Ok,
            },
            ..LogFigures::default()
        })
    }

    fn to_json(&self, shard: usize) -> serde_json::Value {
        serde_json::json!({ "shard": shard, "state": self.figures().state.as_str() })
    }

    fn take_sync_histogram(&self) -> Option<hdrhistogram::Histogram<u64>> {
        None
    }
}

/// A job log that keeps nothing (see the module docs).
#[derive(Debug)]
pub struct FakeLog {
    ctl: Arc<FakeControl>,
}

impl FakeLog {
    /// A healthy fake log and its control.
    pub fn new() -> (FakeLog, Arc<FakeControl>) {
        let ctl = Arc::new(FakeControl::default());
        (FakeLog { ctl: ctl.clone() }, ctl)
    }

    /// What a fake log "recovers": `jobs` as given.
    pub fn recovered(jobs: Vec<super::RecoveredJob>) -> Recovered {
        let accepted = jobs.iter().map(|r| r.job.id.seq()).max().unwrap_or(0);
        Recovered { jobs, accepted, keys: Vec::new() }
    }

    fn event(&mut self, e: Event) {
        self.ctl.with(|s| {
            s.events.push(e);
            s.logged += 1;
        });
    }
}

impl JobLog for FakeLog {
    fn accepted(&mut self, job: &mut Job) {
        self.event(Event::Accepted(job.id, job.frames.body().to_vec()));
    }

    fn dispatched(&mut self, job: &Job) {
        self.event(Event::Dispatched(job.id));
    }

    fn requeued(&mut self, job: &mut Job) {
        self.event(Event::Requeued(job.id, job.redeliveries()));
    }

    fn buried(&mut self, dead: &mut DeadJob) {
        self.event(Event::Buried(dead.job.id, dead.why));
    }

    fn unburied(&mut self, job: &mut Job) {
        self.event(Event::Unburied(job.id));
    }

    fn done(&mut self, job: &Job) {
        self.event(Event::Done(job.id));
    }

    fn done_elsewhere(&mut self, id: JobId) {
        self.event(Event::DoneElsewhere(id));
    }

    fn commit(&mut self, _: Instant) -> Commit {
        self.ctl.with(|s| {
            s.commits += 1;
            if s.logged > s.durable {
                Commit::After(Ticket(s.logged))
            } else {
                Commit::Release
            }
        })
    }

    fn durable(&self) -> Arc<dyn Durable> {
        self.ctl.clone()
    }

    fn refusal(&self) -> Option<StoreFault> {
        self.ctl.with(|s| s.fault)
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn maintain(&mut self, _: Instant, _: &mut dyn Holdings) {
        self.ctl.with(|s| s.maintained += 1);
    }

    fn sync_all(&mut self) -> bool {
        let upto = Ticket(self.ctl.with(|s| s.logged));
        self.ctl.make_durable(upto)
    }

    fn status(&self) -> Arc<dyn LogStatus> {
        self.ctl.clone()
    }
}

/// One queue's waiting jobs, as a shard would hold them (nothing dead or
/// retrying).
pub struct OneQueue(pub Vec<Job>);

impl Holdings for OneQueue {
    fn queues(&self) -> Vec<crate::ids::QueueName> {
        vec![crate::ids::QueueName::named("q")]
    }

    fn visit_waiting(
        &mut self,
        _: &crate::ids::QueueName,
        from: usize,
        max: usize,
        f: &mut dyn FnMut(&mut Job),
    ) -> (usize, Option<usize>) {
        let end = self.0.len().min(from.saturating_add(max));
        for job in self.0.get_mut(from..end).into_iter().flatten() {
            f(job);
        }
        (end.saturating_sub(from), (end < self.0.len()).then_some(end))
    }

    fn visit_dead(&mut self, _: u64, _: usize, _: &mut dyn FnMut(&mut DeadJob)) -> (usize, Option<u64>) {
        (0, None)
    }

    fn visit_retrying(&mut self, _: &mut dyn FnMut(&mut Job)) {}
}
