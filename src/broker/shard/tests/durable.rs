//! The shards' write-ahead log hooks (durable.rs) under the harness: logs in
//! a temporary directory, committed after each step like a batch end, then
//! recovered as a restart would, and compared with what the shards held.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::harness::{done, offer_id, Harness};
use crate::broker::outbox::VecOutbox;
use crate::broker::text_port::TextAnswer;
use crate::config::Durability;
use crate::config::WalConfig;
use crate::wal;

/// Small segments, so that short runs rotate, delete and compact.
pub const SEGMENT_BYTES: u64 = 4096;

/// The log settings of these tests: `async` with a sync interval longer
/// than any test (records are written at each commit, never waited for).
pub fn wal_config(dir: &Path) -> WalConfig {
    WalConfig {
        data_dir: Some(dir.to_path_buf()),
        durability: Durability::Async,
        sync_interval: Duration::from_secs(3600),
        segment_bytes: SEGMENT_BYTES,
        sync_thread: false,
        skip_damaged: false,
        disk_free_limit: 0,
    }
}

/// The shards a restart of `shards` shards on `dir` starts with (recovery's
/// facts with the shards' policy applied), and the logs' shared parts.
fn restart(dir: &Path, shards: usize) -> Harness {
    let mut h = Harness::new(shards);
    h.attach_logs(dir);
    h
}

/// `(queue, body, setbacks)` of every job in the dead sets a restart of
/// `shards` shards recovers from `dir`, shard by shard.
pub fn recover_dead(dir: &Path, shards: usize) -> Vec<(String, String, u32)> {
    let h = restart(dir, shards);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut out = Vec::new();
    for shard in &h.shards {
        for id in shard.dead.ids(None) {
            if let Some(d) = shard.dead.get(id) {
                out.push((text(d.job.queue_bytes()), text(d.job.frames.body()), d.job.redeliveries()));
            }
        }
    }
    out
}

/// Every job a restart of `shards` shards on `dir` puts back in a queue,
/// by queue, front first.
pub fn recover(dir: &Path, shards: usize) -> BTreeMap<String, Vec<String>> {
    let h = restart(dir, shards);
    let mut out = BTreeMap::new();
    for shard in &h.shards {
        for queue in shard.queues.names() {
            let bodies: Vec<String> =
                shard.queues.jobs(&queue.0).map(|j| String::from_utf8_lossy(j.frames.body()).into_owned()).collect();
            if !bodies.is_empty() {
                out.insert(queue.to_string(), bodies);
            }
        }
    }
    out
}

/// A copy of the log files under `dir` in a new temporary directory: the
/// disk as a crash now would leave it (the running shards keep `dir`
/// locked).
pub fn crash_copy(dir: &Path) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                copy(&entry.path(), &target);
            } else if entry.file_name() != "lock" {
                std::fs::copy(entry.path(), target).expect("copy");
            }
        }
    }
    let out = tempfile::tempdir().expect("tempdir");
    copy(dir, out.path());
    out
}

impl Harness {
    /// Gives every shard a log in `dir` (recovering what is there).
    pub fn attach_logs(&mut self, dir: &Path) {
        let opened = wal::open(&wal_config(dir), self.shards.len(), false, self.now, self.now).expect("log opens");
        self.wals.clear();
        for (shard, start) in self.shards.iter_mut().zip(opened.shards) {
            self.wals.push(start.log.shared().clone());
            shard.attach_log(Box::new(start.log), start.recovered);
        }
    }

    /// A batch end on every shard: its log committed (written).
    pub fn commit_logs(&mut self) {
        for shard in &mut self.shards {
            let mut out = VecOutbox::default();
            shard.end_batch(self.now, &mut out);
            assert!(out.emqp.is_empty() && out.shards.is_empty(), "a batch end produces nothing but its log");
        }
    }

    /// Syncs every log now (what an `async` log's timer does), so that
    /// segments waiting to be deleted go.
    pub fn sync_logs(&mut self) {
        for shard in &mut self.shards {
            assert!(shard.log.sync_all(), "the log syncs");
        }
    }

    /// A figure of shard `index`'s log (`log_bytes`, `segments`,
    /// `live_jobs`, `live_bytes`).
    pub fn wal_figure(&self, index: usize, name: &str) -> u64 {
        self.wal_figure_json(index)[name].as_u64().unwrap_or_else(|| panic!("no figure {name}"))
    }

    /// Shard `index`'s log as STATUS shows it.
    pub fn wal_figure_json(&self, index: usize) -> serde_json::Value {
        use crate::joblog::LogStatus;
        self.wals[index].to_json(index)
    }

    /// Live jobs by the logs' count, summed over shards.
    pub fn logged_live(&self) -> u64 {
        (0..self.wals.len()).map(|i| self.wal_figure(i, "live_jobs")).sum()
    }
}

fn run_with_log(shards: usize, f: impl FnOnce(&mut Harness)) -> BTreeMap<String, Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(shards);
    h.attach_logs(dir.path());
    f(&mut h);
    h.commit_logs();
    drop(h);
    recover(dir.path(), shards)
}

fn queue(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn waiting_jobs_come_back_in_order_and_done_ones_do_not() {
    for shards in [1, 3] {
        let got = run_with_log(shards, |h| {
            h.inform("w1", &[(10, "q")]);
            for i in 1..=5 {
                h.request("c1", &format!("m{i}"), "q", &format!("j{i}"));
            }
            assert_eq!(h.text_sched(1, "t", "x1"), done());
            h.ready("w1", 2);
            h.reply("w1", "m1");
        });
        assert_eq!(got["q"], queue(&["j2", "j3", "j4", "j5"]), "{shards} shards: j2 in flight comes back first");
        assert_eq!(got["t"], queue(&["x1"]));
    }
}

#[test]
fn dcl_goes_to_the_back_and_release_to_the_front_after_a_restart() {
    let got = run_with_log(1, |h| {
        for t in ["t1", "t2", "t3"] {
            h.text_sched(1, "q", t);
        }
        let a = offer_id(&h.text_ask(1, "q")).unwrap();
        assert_eq!(h.text_answer(1, a, TextAnswer::Dcl), done());
        let b = offer_id(&h.text_ask(1, "q")).unwrap();
        h.text_release(1, b);
        let c = offer_id(&h.text_ask(2, "q")).unwrap();
        assert_eq!(h.text_answer(2, c, TextAnswer::Ack), done());
    });
    assert_eq!(got["q"], queue(&["t3", "t1"]), "t2 acked, t1 declined to the back");
}

#[test]
fn done_from_another_shard_reaches_the_jobs_shard_log() {
    let mut h = Harness::new(3);
    let dir = tempfile::tempdir().unwrap();
    h.attach_logs(dir.path());
    let (worker, q) = (h.name_on(0, "w"), h.name_on(2, "q"));
    h.inform(&worker, &[(10, &q)]);
    h.request("c", "m1", &q, "j1");
    h.ready(&worker, 1);
    h.commit_logs();
    assert_eq!(h.logged_live(), 1);
    h.reply(&worker, "m1");
    h.commit_logs();
    assert_eq!(h.logged_live(), 0, "shard 0 told shard 2");
    drop(h);
    assert!(recover(dir.path(), 3).is_empty());
}

#[test]
fn a_worker_death_counts_a_delivery_that_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(1);
    h.attach_logs(dir.path());
    h.inform("w1", &[(10, "q")]);
    h.request("c", "m1", "q", "j1");
    h.ready("w1", 1);
    h.send_failed("w1", "m1", true);
    h.commit_logs();
    drop(h);
    let now = std::time::Instant::now();
    let opened = wal::open(&wal_config(dir.path()), 1, false, now, now).unwrap();
    let jobs = &opened.shards[0].recovered.jobs;
    assert_eq!(jobs[0].job.redeliveries(), 1);
    assert!(matches!(jobs[0].state, crate::joblog::JobState::Waiting), "{:?}", jobs[0].state);
}

#[test]
fn segments_rotate_and_dead_ones_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(1);
    h.attach_logs(dir.path());
    h.inform("w1", &[(10, "q")]);
    for i in 0..200 {
        h.request("c", &format!("m{i}"), "q", &"x".repeat(64));
        h.commit_logs();
    }
    let segments = h.wal_figure(0, "segments");
    assert!(segments > 3, "{segments} segments");
    h.ready("w1", 200);
    for i in 0..200 {
        h.reply("w1", &format!("m{i}"));
        h.commit_logs();
    }
    h.sync_logs();
    let left = h.wal_figure(0, "segments");
    assert!(left <= 2, "all done: only the current segment (and maybe its predecessor) remain, {left}");
    assert_eq!(h.logged_live(), 0);
}

#[test]
fn compaction_keeps_disk_within_the_factor_of_live_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(1);
    h.attach_logs(dir.path());
    h.inform("w1", &[(10, "busy")]);
    h.inform("w2", &[(10, "stuck")]);
    // One stuck job per 20 busy ones: without compaction every segment
    // would stay, each about 5% live.
    for i in 0..2000 {
        if i % 20 == 0 {
            h.request("c", &format!("s{i}"), "stuck", &format!("stuck-{i:05}"));
        }
        h.request("c", &format!("m{i}"), "busy", "busy job body of some length");
        h.ready("w1", 1);
        h.reply("w1", &format!("m{i}"));
        h.commit_logs();
    }
    for _ in 0..100 {
        h.commit_logs();
        h.sync_logs();
    }
    let (disk, live) = (h.wal_figure(0, "log_bytes"), h.wal_figure(0, "live_bytes"));
    let bound = crate::limits::WAL_DISK_FACTOR * live + 2 * SEGMENT_BYTES;
    assert!(disk <= bound, "disk {disk} > {bound} (live {live})");
    let stuck = h.waiting("stuck");
    drop(h);
    assert_eq!(recover(dir.path(), 1)["stuck"], stuck, "the copied jobs keep their order");
}

#[test]
fn a_new_shard_count_rehashes_every_queue_and_keeps_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(1);
    h.attach_logs(dir.path());
    let queues = ["a", "b", "c", "d", "e"];
    for i in 0..10 {
        for q in queues {
            assert_eq!(h.text_sched(1, q, &format!("{q}-{i}")), done());
        }
    }
    h.commit_logs();
    drop(h);
    let three = recover(dir.path(), 3);
    for q in queues {
        let want: Vec<String> = (0..10).map(|i| format!("{q}-{i}")).collect();
        assert_eq!(three[q], want);
    }
    assert_eq!(recover(dir.path(), 2), three, "and again to 2 shards");
}

#[test]
fn refusals_log_nothing_and_every_end_of_a_job_logs_done() {
    use crate::broker::text_port::TextOutcome;
    use crate::protocol::text::ErrorCode;
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::with_config(1, |c| c.max_queues = 1);
    h.attach_logs(dir.path());
    assert_eq!(h.text_sched(1, "a", "a1"), done());
    assert_eq!(h.text_sched(1, "b", "b1"), TextOutcome::Refused(ErrorCode::QueueLimit));
    assert_eq!(h.text_sched(1, "a", "a2"), done());
    h.commit_logs();
    assert_eq!(h.logged_live(), 2, "the refused SCHED wrote nothing");
    let bytes = h.ctx.job_bytes.load(Relaxed);
    // DEL: done, logged and no longer counted.
    let a1 = offer_id(&h.text_ask(1, "a")).unwrap();
    assert_eq!(h.text_answer(1, a1, TextAnswer::Del), done());
    h.commit_logs();
    assert_eq!(h.logged_live(), 1);
    assert!(h.ctx.job_bytes.load(Relaxed) < bytes);
    // Returned by its consumers too often: in the dead set, still logged.
    for _ in 0..=crate::limits::MAX_RETRIES {
        let Some(id) = offer_id(&h.text_ask(1, "a")) else { break };
        h.text_release(1, id);
    }
    h.commit_logs();
    assert_eq!(h.ctx.counters.dead_lettered.load(Relaxed), 1);
    assert_eq!(h.logged_live(), 1, "the dead set is kept in the log");
    assert_eq!(h.ctx.job_bytes.load(Relaxed), 0, "dead jobs leave the memory count");
    drop(h);
    assert!(recover(dir.path(), 1).is_empty(), "no queue holds it");
    assert_eq!(recover_dead(dir.path(), 1), [("a".to_string(), "a2".to_string(), 6)]);
}

#[test]
fn dead_jobs_survive_restarts_compaction_and_a_new_shard_count() {
    use crate::broker::admin::AdminOp;
    use crate::broker::dead::DeadTarget;
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::with_config(1, |c| c.max_retries = 0);
    h.attach_logs(dir.path());
    h.inform("w1", &[(10, "q")]);
    h.inform("w2", &[(10, "busy")]);
    h.ready("w1", 1);
    h.request("c", "d0", "q", "dead-0");
    h.reply_failed("w1", "d0", true);
    h.commit_logs();
    // Busy traffic behind it: without compaction of the dead set its
    // segment would stay, with every segment after it that holds its
    // record's neighbours.
    for i in 0..2000 {
        h.request("c", &format!("m{i}"), "busy", "busy job body of some length");
        h.ready("w2", 1);
        h.reply("w2", &format!("m{i}"));
        h.commit_logs();
    }
    for _ in 0..100 {
        h.commit_logs();
        h.sync_logs();
    }
    let (disk, live) = (h.wal_figure(0, "log_bytes"), h.wal_figure(0, "live_bytes"));
    let bound = crate::limits::WAL_DISK_FACTOR * live + 2 * SEGMENT_BYTES;
    assert!(disk <= bound, "disk {disk} > {bound} (live {live})");
    drop(h);
    let dead = vec![("q".to_string(), "dead-0".to_string(), 1)];
    assert_eq!(recover_dead(dir.path(), 1), dead, "a restart keeps the dead set");
    assert_eq!(recover_dead(dir.path(), 3), dead, "and a new shard count");
    assert!(recover(dir.path(), 3).is_empty(), "in no queue");
    let mut h = Harness::with_config(3, |c| c.max_retries = 0);
    h.attach_logs(dir.path());
    let (reply, rx) = crossbeam_channel::bounded(1);
    h.send(
        h.shard_of("q"),
        crate::broker::inbox::ShardMsg::Admin { op: AdminOp::DeadRetry(DeadTarget::All(None)), reply },
    );
    assert_eq!(rx.try_recv().ok().map(|a| a.done()), Some(1));
    h.commit_logs();
    drop(h);
    assert_eq!(recover(dir.path(), 3)["q"], ["dead-0"], "retried: waiting again after a restart");
    assert!(recover_dead(dir.path(), 3).is_empty());
}

/// A record that cancels or supersedes one in an older segment (a `Done`,
/// a copy moved forward) must outlive that segment: deleting it first
/// would bring the finished job back at the next start.
#[test]
fn a_done_record_outlives_the_segment_of_the_job_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Harness::new(1);
    h.attach_logs(dir.path());
    h.inform("w1", &[(10, "a")]);
    h.inform("w2", &[(10, "busy")]);
    h.inform("w3", &[(10, "stuck")]);
    // Segment 1: jobs that stay (keeping the segment, too live to be
    // compacted) and one that ends later.
    let stuck: Vec<String> = (0..20).map(|i| format!("stuck-{i}-{}", "x".repeat(100))).collect();
    for (i, body) in stuck.iter().enumerate() {
        h.request("c", &format!("s{i}"), "stuck", body);
    }
    h.request("c", "a", "a", "ends-late");
    h.ready("w1", 1);
    h.commit_logs();
    // Busy jobs fill later segments and end; the late `Done` of "a" lands
    // among them, in a segment whose own jobs all end.
    for i in 0..400 {
        h.request("c", &format!("m{i}"), "busy", "busy job body of some length");
        h.ready("w2", 1);
        h.reply("w2", &format!("m{i}"));
        if i == 100 {
            h.reply("w1", "a");
        }
        h.commit_logs();
    }
    for _ in 0..50 {
        h.commit_logs();
        h.sync_logs();
    }
    drop(h);
    assert_eq!(recover(dir.path(), 1), BTreeMap::from([("stuck".to_string(), stuck)]));
    assert_eq!(recover(dir.path(), 1).len(), 1, "and again after a restart");
}
