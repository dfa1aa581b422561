//! The fault tests' verdicts: the ledger's rules ([`check`]), the stream
//! read back ([`check_stream`]), and the measures of an outage (its first
//! refusal, the first acceptance after it, nothing acknowledged during it).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::ledger::{self, lock, Answer, Ledger, Shared};
use super::load::Threads;
use super::rig::{self, Node};
use super::{with_js, Setup, BACK_BOUND, DRAIN_BOUND, REFUSAL_BOUND};
use crate::common::{proc, wait};

/// Waits until the router has at least `n` acknowledgements.
pub(crate) fn wait_acked(ledger: &Shared, n: usize, within: Duration) {
    let ok = wait::until(within, || lock(ledger).acked().count() >= n);
    assert!(ok, "fewer than {n} jobs acknowledged within {within:?}: {}", lock(ledger).counts());
}

/// Waits until every acknowledged job was delivered and no job waits or
/// is in flight (consumers run meanwhile).
pub(crate) fn drain(node: &Node, ledger: &Shared) {
    let done = wait::until_ok(DRAIN_BOUND, || {
        {
            let l = lock(ledger);
            let got = l.delivery_counts();
            let missing = l.acked().filter(|(b, _)| !got.contains_key(b.as_str())).count();
            if missing > 0 {
                return Err(format!("{missing} acknowledged jobs not delivered yet"));
            }
        }
        let s = node.status()?;
        let empty = |k: &str| s[k].as_object().is_some_and(|m| m.is_empty());
        if empty("waiting_messages_by_queue") && empty("inflight_messages_by_queue") {
            Ok(())
        } else {
            Err(format!("waiting {} in flight {}", s["waiting_messages_by_queue"], s["inflight_messages_by_queue"]))
        }
    });
    if let Err(why) = done {
        panic!("not drained: {why}; {}", lock(ledger).counts());
    }
}

/// Whether a refusal came at once (the job was never taken), not after
/// the job was held: the text of the eMQP ERROR, or after the text `ERR`'s
/// code, says which (`not confirmed:` when held, docs/text-protocol.md).
pub(crate) fn refused_at_once(sent: &ledger::Sent) -> bool {
    match &sent.answer {
        Some((_, Answer::Refused { text, .. })) => !text.starts_with("not confirmed:"),
        _ => false,
    }
}

/// Every acknowledged job was delivered, and nothing delivered that was
/// not sent (`counts`: [`Ledger::delivery_counts`]).
pub(crate) fn check_delivered(ledger: &Ledger, counts: &BTreeMap<&str, usize>) {
    let lost: Vec<&String> = ledger.acked().map(|(b, _)| b).filter(|b| !counts.contains_key(b.as_str())).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged jobs never delivered, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let never_sent: Vec<&&str> = counts.keys().filter(|b| !ledger.jobs.contains_key(**b)).collect();
    assert!(never_sent.is_empty(), "delivered, never sent: {never_sent:?}");
}

/// The ledger's rules: nothing odd; every acknowledged job delivered;
/// nothing delivered that was not sent; no job delivered twice (no router
/// crashed, consumers answer every job); nothing refused at once delivered.
pub(crate) fn check(ledger: &Ledger) {
    assert!(ledger.oddities.is_empty(), "unexpected answers: {:?}", &ledger.oddities[..ledger.oddities.len().min(10)]);
    let counts = ledger.delivery_counts();
    check_delivered(ledger, &counts);
    let twice: Vec<(&str, &str)> = ledger
        .deliveries
        .iter()
        .filter(|d| counts.get(d.body.as_str()).is_some_and(|n| *n > 1))
        .map(|d| (d.body.as_str(), d.consumer.as_str()))
        .collect();
    assert!(twice.is_empty(), "delivered more than once (body, consumer): {:?}", &twice[..twice.len().min(20)]);
    let refused: Vec<&String> = ledger
        .jobs
        .iter()
        .filter(|(b, s)| refused_at_once(s) && counts.contains_key(b.as_str()))
        .map(|(b, _)| b)
        .collect();
    assert!(refused.is_empty(), "refused at once, yet delivered: {refused:?}");
}

/// Stops the router cleanly, reads its stream back and checks that it
/// holds every acknowledged job's `Accepted` record exactly once (a
/// retried publish is stored once), and none of a job refused at once.
/// Valid while nothing was purged: the test made the stream refuse purges
/// ([`super::keep_every_record`]), and its first sequence is asserted.
pub(crate) fn check_stream(s: &Setup, node: &Node, router: &mut proc::Child, ledger: &Ledger) {
    let status = router.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(30));
    let stream = node.stream();
    let read = with_js(s, |js| async move { rig::read_stream(&js, &node.stream()).await });
    let held = read.unwrap_or_else(|why| panic!("reading {stream} back: {why}"));
    assert_eq!(held.first_sequence, 1, "nothing purged from {stream}, so it holds every record");
    let missing: Vec<&String> = ledger.acked().map(|(b, _)| b).filter(|b| !held.accepted.contains_key(*b)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged, not in the stream: {} e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let twice: Vec<(&String, &usize)> = held.accepted.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "Accepted records stored more than once: {:?}", &twice[..twice.len().min(10)]);
    let refused: Vec<&String> = ledger
        .jobs
        .iter()
        .filter(|(b, s)| refused_at_once(s) && held.accepted.contains_key(*b))
        .map(|(b, _)| b)
        .collect();
    assert!(refused.is_empty(), "refused at once, yet stored: {refused:?}");
    eprintln!(
        "{stream}: {} messages, {} Accepted records, {} Done; every acknowledged job's record there once",
        held.messages,
        held.accepted.len(),
        held.done
    );
}

/// The end of a test whose router runs on: every acknowledged job
/// delivered ([`drain`]), the `consumers` stopped, the ledger [`check`]ed,
/// the router stopped and its stream read back ([`check_stream`]).
pub(crate) fn finish(
    test: &str,
    s: &Setup,
    node: &Node,
    router: &mut proc::Child,
    ledger: &Shared,
    consumers: Threads,
) {
    drain(node, ledger);
    consumers.stop();
    let l = lock(ledger);
    eprintln!("{test}: end: {}", l.counts());
    check(&l);
    check_stream(s, node, router, &l);
}

/// Asserts that no job sent during the outage (`[down, up)`) was
/// acknowledged before `up`: the survivor alone stores nothing. Returns
/// how many jobs sent before `down` were acknowledged during it: stored
/// before it, their acknowledgements waited in the release thread with
/// those of later batches, until the later ones were given up (the give-up
/// test) or the servers came back.
pub(crate) fn assert_no_acks(ledger: &Shared, down: Instant, up: Instant) -> usize {
    let l = lock(ledger);
    let acked = l.acks_between(down, up);
    let during: Vec<String> = acked
        .iter()
        .filter(|(b, _)| l.jobs[*b].at >= down)
        .map(|(b, at)| {
            format!("{b} sent {:?} and acknowledged {:?} after the outage began", l.jobs[*b].at - down, *at - down)
        })
        .collect();
    assert!(
        during.is_empty(),
        "{} sent and acknowledged during the outage ({:?} long): {:?}",
        during.len(),
        up - down,
        &during[..during.len().min(10)]
    );
    acked.len()
}

/// The jobs sent between `from` and `to` (both protocols), with their
/// answers.
pub(crate) fn sent_between(ledger: &Shared, from: Instant, to: Instant) -> BTreeMap<String, ledger::Sent> {
    lock(ledger).jobs.iter().filter(|(_, s)| s.at >= from && s.at < to).map(|(b, s)| (b.clone(), s.clone())).collect()
}

/// Waits for the first `STORE_FAILED` after `down`; how long after `down`.
pub(crate) fn first_refusal(ledger: &Shared, down: Instant, router: &proc::Child) -> Duration {
    let refused = wait::until_ok(REFUSAL_BOUND + Duration::from_secs(5), || {
        lock(ledger).first_refusal_after("STORE_FAILED", down).map(|(at, _)| at).ok_or_else(|| "none yet".into())
    });
    let at = refused.unwrap_or_else(|why| panic!("no STORE_FAILED: {why}\n{}", router.log_tail(30)));
    at - down
}

/// Waits after the servers came back (`up`) for the first acknowledgement
/// of a job sent after it; how long it took.
pub(crate) fn first_accepted(ledger: &Shared, up: Instant, router: &proc::Child) -> Duration {
    let acked = wait::until_ok(BACK_BOUND + Duration::from_secs(5), || {
        lock(ledger).first_ack_of_sent_after(up).map(|(at, _)| at).ok_or_else(|| "none yet".into())
    });
    let at = acked
        .unwrap_or_else(|why| panic!("not accepted again: {why}; {}\n{}", lock(ledger).counts(), router.log_tail(30)));
    at - up
}

/// Jobs sent from 5 s after `up` on (past a renewal of the router name's
/// lease, every 3.3 s) are acknowledged, and the log is `ok`, not `taken`:
/// a lease that expired during the outage does not make the router think
/// another one took its name.
pub(crate) fn accepted_past_a_renewal(node: &Node, router: &proc::Child, ledger: &Shared, up: Instant) {
    let after = up + Duration::from_secs(5);
    let ok = wait::until(Duration::from_secs(20), || lock(ledger).acked_sent_after(after) >= 100);
    let shard = node.log_status().expect("STATUS");
    assert!(ok, "jobs sent 5 s after the servers came back are not acknowledged: {}; {shard}", lock(ledger).counts());
    assert_eq!((&shard["state"], &shard["errors"]["taken"]), (&"ok".into(), &0.into()), "{shard}");
    let log = router.log_text();
    assert!(!log.contains("another router took"), "{}", router.log_tail(30));
    let lapsed = log.contains("the lease on the router name lapsed");
    eprintln!("router {}: the lease on its name lapsed during the outage and was held again: {lapsed}", node.name);
}
