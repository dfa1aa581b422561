//! The write-ahead log's faults under the harness (real logs in a temporary
//! directory, `async`): the data directory deleted or replaced, a segment
//! deleted, the lock file deleted. Each is found at the next batch that
//! writes; new jobs are refused (`STORE_FAILED`) while jobs held are still
//! served; the log repairs itself after its back-off (rebuilt from the
//! shards' memory in a directory made again); a restart then finds every
//! live job, and nothing finished.

use std::path::Path;

use super::durable::recover;
use super::harness::{done, offer_id, refused, Harness};
use crate::limits;
use crate::protocol::text::ErrorCode;

/// A router's worth of state on `shards` shards with logs in `dir`: in
/// queue `q`, `j1` in flight on worker `w1`, `j2`..`j4` waiting; in queue
/// `t`, `t1` offered to text connection 1 and `t2` waiting.
fn busy(dir: &Path, shards: usize) -> Harness {
    let mut h = Harness::new(shards);
    h.attach_logs(dir);
    h.inform("w1", &[(10, "q")]);
    for i in 1..=4 {
        h.request("c", &format!("m{i}"), "q", &format!("j{i}"));
    }
    h.ready("w1", 1);
    assert_eq!(h.take_bodies("w1"), ["j1"]);
    assert_eq!(h.text_sched(1, "t", "t1"), done());
    assert_eq!(h.text_sched(1, "t", "t2"), done());
    assert!(offer_id(&h.text_ask(1, "t")).is_some());
    h.commit_logs();
    h.take_to("c");
    h
}

/// The ERROR codes sent to client `c` since the last look.
fn refusals(h: &mut Harness) -> Vec<String> {
    h.take_to("c")
        .iter()
        .map(|o| o.frames())
        .filter(|f| f[2] == b"ERROR")
        .map(|f| String::from_utf8_lossy(&f[5]).into_owned())
        .collect()
}

/// Keeps the log from being repaired: a file where its `wal` directory
/// goes.
fn block(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let _ = std::fs::remove_dir_all(dir.join("wal"));
    std::fs::write(dir.join("wal"), b"in the way").unwrap();
}

/// After `fault` was done to the files under `dir` (and a repair is
/// blocked): the next batch that writes finds it, producers are refused
/// while the worker's job and the text offer still end; once a repair can
/// work the log rebuilds itself and a restart finds exactly the live jobs.
fn found_refused_repaired(shards: usize, fault: impl FnOnce(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut h = busy(&dir, shards);
    fault(&dir);
    block(&dir);
    // The batch that writes after the fault finds it (its acceptance
    // waits for the repair); shards that wrote nothing find it at their
    // next check.
    h.request("c", "m5", "q", "j5");
    h.end_batches();
    h.advance(limits::WAL_CHECK_INTERVAL);
    h.end_batches();
    // The acceptance of j5 waits: its ticket is not durable.
    let qi = h.shard_of("q");
    let crate::joblog::Commit::After(ticket) = h.shards[qi].log.commit(h.now) else {
        panic!("j5's records wait for the log")
    };
    let durable = h.shards[qi].log().durable();
    assert!(durable.durable_upto() < ticket, "not durable while faulty");
    h.request("c", "m6", "q", "j6");
    assert_eq!(refusals(&mut h), ["STORE_FAILED"], "{shards} shards");
    assert_eq!(h.text_sched(2, "t", "t3"), refused(ErrorCode::StoreFailed));
    // Consumers are served from memory meanwhile.
    h.reply("w1", "m1");
    h.ready("w1", 1);
    assert_eq!(h.take_bodies("w1"), ["j2"]);
    let t1 = offer_id(&h.text_ask(2, "t")).expect("t2 is offered");
    h.text_answer(2, t1, crate::broker::text_port::TextAnswer::Ack);
    h.end_batches();
    h.advance(limits::WAL_RETRY_MIN);
    h.end_batches();
    h.request("c", "m6b", "q", "j6b");
    assert_eq!(refusals(&mut h), ["STORE_FAILED"], "a repair that cannot work changes nothing");
    // Unblocked, the back-off passes: the log is rebuilt, producers are
    // accepted.
    std::fs::remove_file(dir.join("wal")).unwrap();
    h.advance(limits::WAL_RETRY_MAX);
    h.end_batches();
    assert!(durable.durable_upto() >= ticket, "durable once rebuilt");
    h.request("c", "m7", "q", "j7");
    assert!(refusals(&mut h).is_empty(), "accepted after the repair ({shards} shards)");
    h.commit_logs();
    let repairs: u64 = (0..shards).map(|i| h.wal_figure_json(i)["repairs"].as_u64().unwrap_or(0)).sum();
    assert!(repairs >= 1, "a repair is counted");
    drop(h);
    let got = recover(&dir, shards);
    // j1 done, j2 in flight, j3 j4 j5 j7 waiting; t1 offered, t2 acked.
    assert_eq!(got["q"], ["j2", "j3", "j4", "j5", "j7"], "{shards} shards");
    assert_eq!(got["t"], ["t1"], "{shards} shards");
}

#[test]
fn a_deleted_data_directory_is_found_refused_and_rebuilt_from_memory() {
    for shards in [1, 3] {
        found_refused_repaired(shards, |dir| std::fs::remove_dir_all(dir).unwrap());
    }
}

#[test]
fn a_replaced_data_directory_is_found_refused_and_rebuilt_from_memory() {
    for shards in [1, 3] {
        found_refused_repaired(shards, |dir| {
            std::fs::rename(dir, dir.with_extension("old")).unwrap();
            std::fs::create_dir(dir).unwrap();
        });
    }
}

#[test]
fn deleted_segments_are_found_refused_and_rebuilt_from_memory() {
    for shards in [1, 3] {
        found_refused_repaired(shards, |dir| {
            for shard in std::fs::read_dir(dir.join("wal")).unwrap() {
                for seg in std::fs::read_dir(shard.unwrap().path()).unwrap() {
                    std::fs::remove_file(seg.unwrap().path()).unwrap();
                }
            }
        });
    }
}

#[test]
fn a_deleted_lock_file_is_taken_again_without_a_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut h = busy(&dir, 1);
    std::fs::remove_file(dir.join("lock")).unwrap();
    h.advance(limits::WAL_CHECK_INTERVAL);
    h.end_batches();
    assert!(dir.join("lock").exists(), "the lock file is made again");
    h.request("c", "m5", "q", "j5");
    assert!(refusals(&mut h).is_empty());
    h.commit_logs();
    assert_eq!(h.wal_figure_json(0)["repairs"], 0, "the log itself was fine");
    let err = crate::wal::dir::DataDir::lock(&dir).unwrap_err();
    assert!(matches!(err, crate::wal::WalError::Locked { .. }), "{err}");
    let lock = std::fs::File::open(dir.join("lock")).unwrap();
    assert!(lock.try_lock().is_err(), "the new lock file is locked");
    drop(h);
    assert_eq!(recover(&dir, 1)["q"], ["j1", "j2", "j3", "j4", "j5"]);
}
