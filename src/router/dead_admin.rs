//! The admin thread's dead-set commands (`DEAD_LIST`, `DEAD_SHOW`,
//! `DEAD_RETRY`, `DEAD_DELETE`; docs/emqp.md "Admin", README "Retries and
//! the dead set"): reads their argument frames, asks the shards that hold
//! the jobs and merges their answers into one JSON REPLY body.

use serde_json::{json, Value};

use super::Broker;
use crate::broker::admin::{AdminAnswer, AdminOp};
use crate::broker::dead::{DeadEntry, DeadTarget};
use crate::broker::types::shard_of;
use crate::ids::{JobId, QueueName};
use crate::limits;

/// Why a dead-set command is refused (sent as `ERROR BAD_REQUEST <text>`).
pub type Refusal = String;

/// `DEAD_LIST [queue]`: `{"jobs": [entry…], "total": n}`, the oldest
/// [`limits::DEAD_LIST_MAX`] burials first ([`DeadEntry::to_json`]), of
/// every queue when `queue` is empty.
///
/// # Errors
/// A [`Refusal`] when a shard does not answer in time (the total would be
/// short).
pub fn list(broker: &Broker, queue: &[u8]) -> Result<Value, Refusal> {
    let queue = (!queue.is_empty()).then(|| QueueName::from(queue));
    let mut jobs: Vec<DeadEntry> = Vec::new();
    let mut total = 0;
    let asked = broker.ask(&shards_of(broker, queue.as_ref()), &AdminOp::DeadList(queue));
    silent_shards(asked.missing)?;
    for a in asked.answers {
        if let AdminAnswer::DeadList { entries, total: n } = a {
            jobs.extend(entries);
            total += n;
        }
    }
    jobs.sort_by_key(|e| (e.at_unix_ms, e.id.seq(), e.id.shard()));
    jobs.truncate(limits::DEAD_LIST_MAX);
    Ok(json!({ "jobs": jobs.iter().map(DeadEntry::to_json).collect::<Vec<_>>(), "total": total }))
}

/// `DEAD_SHOW id`: `{"job": entry with its body}` or `{"job": null}`.
///
/// # Errors
/// A [`Refusal`] for a job id that is not `<shard>-<seq>` of this router.
pub fn show(broker: &Broker, id: &[u8]) -> Result<Value, Refusal> {
    let id = job_id(broker, id)?;
    let shown = broker.ask(&[id.shard()], &AdminOp::DeadShow(id)).answers.into_iter().find_map(|a| match a {
        AdminAnswer::DeadShow(entry) => entry,
        _ => None,
    });
    Ok(json!({ "job": shown.as_ref().map(DeadEntry::to_json) }))
}

/// `DEAD_RETRY id|* [queue]` (`retry`): `{"retried": n}`; `DEAD_DELETE
/// id|* [queue]`: `{"deleted": n}`. `*` takes every dead job, of `queue`
/// only when it is not empty.
///
/// # Errors
/// A [`Refusal`] for a target that is neither `*` nor a job id of this
/// router, or when a shard does not answer in time (its part may still be
/// under way: a count would be short).
pub fn retry_or_delete(broker: &Broker, retry: bool, target: &[u8], queue: &[u8]) -> Result<Value, Refusal> {
    let (target, shards) = if target == b"*" {
        let queue = (!queue.is_empty()).then(|| QueueName::from(queue));
        (DeadTarget::All(queue.clone()), shards_of(broker, queue.as_ref()))
    } else {
        let id = job_id(broker, target)?;
        (DeadTarget::One(id), vec![id.shard()])
    };
    let op = if retry { AdminOp::DeadRetry(target) } else { AdminOp::DeadDelete(target) };
    let asked = broker.ask(&shards, &op);
    silent_shards(asked.missing)?;
    let n: usize = asked.answers.iter().map(AdminAnswer::done).sum();
    Ok(json!({ (if retry { "retried" } else { "deleted" }): n }))
}

/// Refuses an answer some shards are missing from (they did not answer
/// within [`limits::SHARD_ANSWER_TIMEOUT`]): a count or list without them
/// would look complete.
fn silent_shards(missing: usize) -> Result<(), Refusal> {
    match missing {
        0 => Ok(()),
        n => Err(format!(
            "{n} shard(s) did not answer within {:?}; what was asked of them may still be under way \
             (see emq-cli dead list and emq-cli status)",
            limits::SHARD_ANSWER_TIMEOUT
        )),
    }
}

/// The shards that hold `queue`'s dead jobs: its own, or every shard.
fn shards_of(broker: &Broker, queue: Option<&QueueName>) -> Vec<usize> {
    match queue {
        Some(q) => vec![shard_of(&q.0, broker.shards.len())],
        None => (0..broker.shards.len()).collect(),
    }
}

/// The job id in `text`, refused unless it names a shard of this router
/// (the refusal shows at most 512 bytes of it, [`crate::ids::cut`]).
fn job_id(broker: &Broker, text: &[u8]) -> Result<JobId, Refusal> {
    let id = std::str::from_utf8(text).ok().and_then(JobId::parse);
    match id {
        Some(id) if id.shard() < broker.shards.len() => Ok(id),
        _ => Err(format!(
            "\"{}\" is not a job id of this router (<shard>-<seq>, as `emq-cli dead list` shows)",
            crate::ids::cut(text)
        )),
    }
}
