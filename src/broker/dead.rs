//! The dead set as the admin socket sees it (docs/emqp.md "Admin", README
//! "Retries and the dead set"): which jobs `DEAD_RETRY` and `DEAD_DELETE`
//! take ([`DeadTarget`]) and one job as `DEAD_LIST` and `DEAD_SHOW` answer it, in
//! the JSON `emq-cli dead` reads ([`DeadEntry::to_json`]). The operations
//! themselves are [`crate::broker::admin::AdminOp`]'s.

use serde_json::{json, Value};

use crate::ids::{show, JobId, QueueName};
use crate::job::{DeadJob, Setback};

/// Which dead jobs a retry or delete takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadTarget {
    /// The job with this id.
    One(JobId),
    /// Every dead job, of one queue when given.
    All(Option<QueueName>),
}

/// One dead job as listed or shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadEntry {
    /// The broker's job id (`<shard>-<seq>`).
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// The client's msgid (REQUEST frame 3), or the text job's.
    pub msgid: String,
    /// Its headers (REQUEST frame 5).
    pub headers: String,
    /// Its last setback.
    pub why: Setback,
    /// Its setbacks in all.
    pub failures: u32,
    /// When it was buried, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Bytes of its frames as held.
    pub bytes: usize,
    /// Its body, for [`crate::broker::admin::AdminOp::DeadShow`] only.
    pub body: Option<Vec<u8>>,
}

impl DeadEntry {
    /// The entry of `dead`, with its body when `with_body`.
    pub fn of(dead: &DeadJob, with_body: bool) -> DeadEntry {
        let frames = &dead.job.frames;
        DeadEntry {
            id: dead.job.id,
            queue: show(dead.job.queue_bytes()),
            msgid: show(frames.msgid()),
            headers: show(frames.headers()),
            why: dead.why,
            failures: dead.job.redeliveries(),
            at_unix_ms: dead.at_unix_ms,
            bytes: frames.len(),
            body: with_body.then(|| frames.body().to_vec()),
        }
    }

    /// `{"id", "queue", "msgid", "headers", "reason", "failures",
    /// "dead_at" (seconds since the Unix epoch, milliseconds as decimals),
    /// "bytes"}`, plus `"body"` (text, escaped where it is not UTF-8) and
    /// `"body_utf8"` when shown.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "id": self.id.to_string(),
            "queue": self.queue,
            "msgid": self.msgid,
            "headers": self.headers,
            "reason": self.why.as_str(),
            "failures": self.failures,
            "dead_at": self.at_unix_ms as f64 / 1000.0,
            "bytes": self.bytes,
        });
        if let (Some(body), Some(m)) = (&self.body, v.as_object_mut()) {
            m.insert("body".into(), json!(show(body)));
            m.insert("body_utf8".into(), json!(std::str::from_utf8(body).is_ok()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Job, JobFrames, Origin};

    #[test]
    fn an_entry_shows_its_job_and_its_body_only_when_asked() {
        let frames = JobFrames::new(b"m-1", b"email", b"retry:2", b"{\"x\": 1}", &[] as &[&[u8]]).unwrap();
        let now = std::time::Instant::now();
        let mut job = Job::new(JobId::new(1, 7), frames, Origin::Emqp, false, now, now);
        job.set_redeliveries(3);
        let dead = DeadJob { job, why: Setback::Deadline, at_unix_ms: 1_700_000_000_123 };
        let listed = DeadEntry::of(&dead, false).to_json();
        assert_eq!(listed["id"], "1-7");
        assert_eq!((listed["queue"].as_str(), listed["reason"].as_str()), (Some("email"), Some("deadline")));
        assert_eq!((listed["failures"].as_u64(), listed["dead_at"].as_f64()), (Some(3), Some(1_700_000_000.123)));
        assert!(listed.get("body").is_none());
        let shown = DeadEntry::of(&dead, true).to_json();
        assert_eq!((shown["body"].as_str(), shown["body_utf8"].as_bool()), (Some("{\"x\": 1}"), Some(true)));
    }
}
