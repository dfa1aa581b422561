//! Dead-lettering: a job that cannot be run any more (returned by its
//! workers or text consumers past [`crate::limits::MAX_DELIVERIES`]) leaves
//! the flow here: its bytes no longer count against the memory limit, it is
//! counted broker-wide and on its queue, and logged (rate-limited) with its
//! id, msgid and size (never its body).

use super::{Cx, Shard};
use crate::broker::counts::QueueCounter;
use crate::broker::job::Job;
use crate::metrics::counters::Counters;

impl Shard {
    /// Takes `job` out of the flow for good, saying `why` in the log.
    pub(super) fn dead_letter(&mut self, job: Job, why: &str, cx: &mut Cx) {
        Counters::bump(&self.ctx.counters.dead_lettered);
        self.job_done(&job, cx);
        let queue = job.queue();
        let (msgid, bytes) = (crate::ids::show(job.frames.msgid()), job.frames.body().len());
        crate::log_limited!(error, job = %job.id, %queue, %msgid, bytes, why, "job dead-lettered");
        self.count(queue, QueueCounter::DeadLettered, cx);
    }
}
