//! A shard's answers to the router's own threads: one arm per
//! [`AdminOp`] (docs/architecture.md "Adding an admin command"). Each is
//! answered at once from what the shard holds, except a retry or delete of
//! every dead job, which goes in bounded steps (`dead.rs`).

use crossbeam_channel::Sender;

use super::{Cx, Shard};
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::broker::dead::DeadEntry;

impl Shard {
    /// Answers `op` through `reply` (a reply nobody waits for any more is
    /// dropped).
    pub(super) fn handle_admin(&mut self, op: AdminOp, reply: Sender<AdminAnswer>, cx: &mut Cx) {
        let answer = match op {
            AdminOp::Snapshot => AdminAnswer::Snapshot(Box::new(self.snapshot(cx.now))),
            AdminOp::LatencyTake => AdminAnswer::Latency(Box::new(self.take_latency())),
            AdminOp::Waiting(queue) => {
                AdminAnswer::Waiting(self.queues.jobs(&queue.0).map(|j| j.frames.body().to_vec()).collect())
            }
            AdminOp::DeadList(queue) => self.dead_list(queue.as_ref()),
            AdminOp::DeadShow(id) => AdminAnswer::DeadShow(self.dead.get(id).map(|d| DeadEntry::of(d, true))),
            AdminOp::DeadRetry(target) => return self.dead_take(target, true, reply, cx),
            AdminOp::DeadDelete(target) => return self.dead_take(target, false, reply, cx),
        };
        let _ = reply.send(answer);
    }
}
