//! Faults of `durability = "replicated"` (issue 27) over real sockets: an
//! `emq-router` whose one shard's job log is an R3 stream on a 3-node
//! nats-server cluster (tests/common/nats.rs), eMQP and text producers
//! sending without pause (about 250 and 125 jobs/s), one-slot consumers,
//! and the servers killed, paused and brought back under them.
//!
//! * [`a_stream_leader_killed_under_load_loses_no_acknowledged_job`]:
//!   `kill -9` of the stream's leader, restarted later; acknowledgements
//!   resume after the election (measured 4.5-9 s; the gap is printed),
//!   nothing is refused when they resume within the stall bound (12 s),
//!   every acknowledged job is delivered once, and the stream read back
//!   holds every acknowledged job's `Accepted` record exactly once (retries
//!   carry the same message id) and none of a job refused at once.
//! * [`two_of_three_killed_refuse_new_jobs_and_hold_acknowledgements`]:
//!   `kill -9` of two servers for [`OUTAGE`] with the default
//!   `nats_give_up` (30 s): a fresh client's new job is refused
//!   (`STORE_FAILED`) within [`REFUSAL_BOUND`] (the replicated log's stall
//!   bound, 12 s, and a batch), consumers are served from memory,
//!   `emq-cli status --json` answers (state `ok`: a stall is no log state),
//!   no job sent during the outage is acknowledged during it, those held
//!   are acknowledged once the servers are back, new jobs are accepted
//!   within [`BACK_BOUND`] (measured 1.9-6.6 s) and still after the router
//!   name's lease (10 s) lapsed, and the stream holds every acknowledged job.
//! * [`two_of_three_paused_past_the_give_up_refuse_held_jobs_and_repair`]:
//!   SIGSTOP of two servers for 16 s with `nats_give_up` 6 s: the held
//!   acceptances become `ERROR … STORE_FAILED` (text `ERR STORE_FAILED`) at
//!   the give-up, the log goes `unreachable`, repairs itself (`repairs` ≥ 1)
//!   once they are back (measured 0.1-1.7 s after the SIGCONT), and a
//!   router started again with the same name recovers every live job once.
//! * [`a_repair_whose_snapshot_is_given_up_too_is_tried_again`]: a quiet
//!   router and an outage past two give-ups: repaired once the servers are
//!   back.
//! * [`a_router_with_no_reachable_nats_server_exits_with_a_clear_error`].
//! * [`the_routers_machine_lost_with_a_nats_server_loses_no_acknowledged_job`]:
//!   `kill -9` of the router and of its stream's leader at the same moment
//!   (one machine lost with both), under load, with jobs waiting and one
//!   in flight; a router with the same name started at once elsewhere
//!   (other ports, an empty data directory) waits for the killed one's
//!   lease (10 s) while the stream elects a leader, listens within
//!   [`TAKE_OVER_BOUND`] (measured 7.2-9.5 s) and delivers every
//!   acknowledged job, again only those in flight at the kill (the one
//!   held, and those delivered less than [`DONE_MARGIN`] before it, whose
//!   `Done` records may not have been confirmed); the times to listen and
//!   to the first acknowledgement are printed.
//!   [`the_routers_machine_lost_with_a_nats_server_and_a_short_lease_reads_the_stream_as_it_elects_a_leader`]:
//!   the same with a lease of 1 s and the stream's leader on a node leading
//!   neither key-value bucket, so that the new router fences and reads its
//!   stream while the stream has no leader yet: it tries again until it
//!   has one (a passing failure; before, the start failed). The fence (a
//!   config update and a marker, docs/replicated.md "Failover") comes
//!   first, so it is usually the fence that waits for the election.
//!
//! What acknowledged and refused mean is in [`ledger`]. A refusal that
//! came at once ("the job log cannot be written now; the job is not
//! stored") must never be delivered nor stored; one that came after the job
//! was held ("not confirmed: … may or may not run", over eMQP and text
//! alike) may be. The ambiguous case: a job sent just before the servers went down
//! may be stored by them while its PubAck is lost; the router retries it
//! with the same message id once they are back and acknowledges it then
//! (or refuses it at the give-up, though stored). A job stored before the
//! outage may be acknowledged during it; one sent during it, never.
//!
//! Without a nats-server the cluster tests say so in one line and skip
//! (under CI they fail: `.ci/run` installs it with `tests/nats/setup.sh`).

pub(crate) mod checks;
pub(crate) mod clients;
pub(crate) mod ledger;
pub(crate) mod load;
pub(crate) mod rig;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::nats::{self, Cluster, NODES, READY_TIMEOUT};
use crate::common::proc::{self, TestDir};
use crate::common::wait;
use crate::common::watchdog::Watchdog;
use checks::{
    accepted_past_a_renewal, assert_no_acks, check, finish, first_accepted, first_refusal, refused_at_once,
    sent_between, wait_acked,
};
use clients::{
    gated_worker, offer_text, send_acked_emqp, send_acked_text, send_until_acked, take_emqp, take_text,
    waiting_when_idle, Load, PreQueues,
};
use ledger::{lock, Answer, Shared};
use load::{Gate, Threads};
use rig::Node;

/// From a `kill -9` of the stream's leader to the first acknowledgement of
/// a job sent after it. Measured 5-6 s for JetStream alone
/// (shared/research/jetstream-eval.md); room for a loaded 2-core machine.
const RESUME_BOUND: Duration = Duration::from_secs(20);

/// From two servers going down to the first `STORE_FAILED` a fresh client
/// gets: `NATS_STALL_TIMEOUT` (12 s) after the last acknowledgement, plus a
/// batch and a producer's [`load::STUCK`]; the rest is slack.
const REFUSAL_BOUND: Duration = Duration::from_secs(18);

/// How long two of three servers stay killed: past the stall bound (12 s)
/// and the router name's lease (10 s).
const OUTAGE: Duration = Duration::from_secs(16);

/// From the servers' restart to the first acknowledgement of a job sent
/// after it: an election (about 2 s once quorum is back) and the
/// retries' back-off (at most 1 s).
pub(crate) const BACK_BOUND: Duration = Duration::from_secs(20);

/// Jobs sent within this of the servers going down may be in batches
/// first tried before (and stored, the ambiguous case): the checks of the
/// jobs held through an outage start after it.
const SLACK: Duration = Duration::from_secs(1);

/// How long consumers may take to be served from memory during a fault.
pub(crate) const SERVED_BOUND: Duration = Duration::from_secs(5);

/// The end: every acknowledged job delivered and the queues empty.
pub(crate) const DRAIN_BOUND: Duration = Duration::from_secs(30);

/// Jobs queued before a fault on queues no consumer serves until then.
pub(crate) const PRE_JOBS: usize = 20;

/// From the `kill -9` of the router and its stream's leader to a new
/// router with the name listening: the killed router's lease runs out (10
/// s after its last renewal, every 3.3 s: 6.7-10 s after the kill; the new
/// router watches the key for up to twice that), the stream and the
/// buckets elect leaders meanwhile, then the replay; the rest is slack.
const TAKE_OVER_BOUND: Duration = Duration::from_secs(25);

/// A job the killed router delivered less than this before the kill was in
/// flight at it: its `Done` record may not have been confirmed (a PubAck
/// takes milliseconds; room for a loaded 2-core machine). The new router
/// may deliver such a job again, and no other.
pub(crate) const DONE_MARGIN: Duration = Duration::from_secs(2);

/// Everything a test holds, dropped in this order: the cluster (its
/// servers killed, stores removed), the runtime, the test dir (kept when
/// the test failed), the watchdog.
pub(crate) struct Setup {
    pub(crate) cluster: Cluster,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) dir: TestDir,
    _watchdog: Watchdog,
}

/// The watchdog, a formed cluster and a runtime for `test`; `None` after
/// one line when there is no nats-server (not under CI).
pub(crate) fn setup(test: &str, limit_secs: u64) -> Option<Setup> {
    let watchdog = Watchdog::new(test, limit_secs);
    let bin = nats::server_or_skip(test)?;
    let dir = TestDir::new(test);
    let cluster = Cluster::start(&bin, &dir);
    Some(Setup { cluster, rt: nats::runtime(), dir, _watchdog: watchdog })
}

/// [`setup`], and a router named `name` with `flags` started on the
/// cluster, and an empty ledger.
pub(crate) fn start(
    test: &str,
    limit_secs: u64,
    name: &str,
    flags: &[&str],
) -> Option<(Setup, Node, proc::Child, Shared)> {
    let s = setup(test, limit_secs)?;
    let node = Node::new(&s.dir, s.cluster.urls(), name, flags);
    let router = node.start();
    Some((s, node, router, Shared::default()))
}

/// Runs `f` with a JetStream client of the cluster, on the test's runtime.
pub(crate) fn with_js<T, F, Fut>(s: &Setup, f: F) -> Result<T, String>
where
    F: FnOnce(async_nats::jetstream::Context) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let urls = s.cluster.urls();
    s.rt.block_on(async move { f(rig::connect(&urls).await?).await })
}

/// Makes `node`'s stream keep every record (its purges refused), for
/// [`checks::check_stream`]: a router purges the records of finished jobs
/// as it goes (module docs of `emq::jslog`).
fn keep_every_record(s: &Setup, node: &Node) {
    let stream = node.stream();
    let denied = with_js(s, |js| async move { rig::deny_purge(&js, &node.stream()).await });
    denied.unwrap_or_else(|why| panic!("{stream}: {why}"));
}

/// Index of the node leading `node`'s stream.
fn leader_index(s: &Setup, node: &Node) -> usize {
    leader_of(s, &node.stream())
}

/// Index of the node leading stream `stream`.
fn leader_of(s: &Setup, stream: &str) -> usize {
    let name = stream.to_string();
    let leader = with_js(s, |js| async move { rig::stream_leader(&js, &name).await });
    let leader = leader.unwrap_or_else(|why| panic!("the leader of {stream}: {why}"));
    s.cluster.index_of(&leader).unwrap_or_else(|| panic!("leader {leader} is not a node"))
}

/// Moves the leadership of `node`'s stream to a node leading neither
/// key-value bucket (the lease's and the layout's), so that killing it
/// leaves the buckets their leaders; returns once it leads there.
fn stream_leader_apart(s: &Setup, node: &Node) {
    let buckets: BTreeSet<usize> = ["KV_EMQ_routers", "KV_EMQ_layouts"].iter().map(|b| leader_of(s, b)).collect();
    let to = (0..NODES).find(|i| !buckets.contains(i)).expect("a node leading no bucket");
    let to_name = s.cluster.nodes[to].name.clone();
    let moved = wait::until_ok(Duration::from_secs(20), || {
        if leader_index(s, node) == to {
            return Ok(());
        }
        let (stream, to) = (node.stream(), to_name.clone());
        with_js(s, |js| async move { rig::step_down(&js, &stream, &to).await })?;
        Err("stepped down; not led there yet".into())
    });
    moved.unwrap_or_else(|why| panic!("{}'s leadership not moved to {to_name}: {why}", node.stream()));
}

#[test]
fn a_stream_leader_killed_under_load_loses_no_acknowledged_job() {
    let test = "repfault_leader_kill";
    let Some((mut s, node, mut router, ledger)) = start(test, 150, "lk", &[]) else { return };
    keep_every_record(&s, &node);
    let load = Load::start(&node, &ledger);
    wait_acked(&ledger, 300, Duration::from_secs(20));
    let leader = leader_index(&s, &node);
    let killed = Instant::now();
    s.cluster.kill(leader);
    let resumed = wait::until_ok(RESUME_BOUND + Duration::from_secs(5), || {
        lock(&ledger).first_ack_of_sent_after(killed).map(|(at, _)| at).ok_or_else(|| "none yet".to_string())
    });
    let resumed =
        resumed.unwrap_or_else(|why| panic!("no acknowledgement after the kill: {why}\n{}", router.log_tail(30)));
    std::thread::sleep(Duration::from_secs(1));
    let (gap, from) = lock(&ledger).longest_ack_gap(killed - Duration::from_secs(1), Instant::now());
    eprintln!(
        "{test}: leader {} killed; the first job sent after it acknowledged {:?} later; longest gap between \
         acknowledgements {gap:?} (from {:?} after the kill); {}",
        s.cluster.nodes[leader].name,
        resumed - killed,
        from.saturating_duration_since(killed),
        lock(&ledger).counts()
    );
    assert!(resumed - killed <= RESUME_BOUND, "acknowledgements resumed {:?} after the kill", resumed - killed);
    // A failover that resumes within the replicated log's stall bound
    // (12 s; a second of margin for the last batch) refuses nothing: new
    // jobs are held through the election, not refused.
    if resumed - killed < Duration::from_secs(11) {
        let refused = lock(&ledger).first_refusal_after("STORE_FAILED", killed).map(|(at, b)| (at - killed, b.clone()));
        assert_eq!(refused, None, "refused during an election of {:?}", resumed - killed);
    }

    s.cluster.restart(leader);
    if let Err(why) = s.cluster.wait_ready(READY_TIMEOUT) {
        panic!("the killed node did not rejoin: {why}\n{}", s.cluster.log_tails(20));
    }
    let back = Instant::now();
    let more = wait::until(Duration::from_secs(20), || lock(&ledger).acked_sent_after(back) >= 200);
    assert!(more, "acknowledgements go on with the node back: {}", lock(&ledger).counts());
    let consumers = load.quiet_producers(&ledger);
    finish(test, &s, &node, &mut router, &ledger, consumers);
}

#[test]
fn the_routers_machine_lost_with_a_nats_server_loses_no_acknowledged_job() {
    let Some(took) = machine_lost("repfault_machine_lost", "ml", &[], false) else { return };
    // Started while the killed router's key was still renewed (every
    // 3.3 s): it watched the key until it expired, once, or found it gone
    // when the lease bucket, led by the killed server too, was readable
    // again (its election outlasted the key: seen once in a full run,
    // listening 8.2 s after the kill). Never more than one wait.
    assert!(took.waited <= 1, "it said the name was held {} times", took.waited);
}

#[test]
fn the_routers_machine_lost_with_a_nats_server_and_a_short_lease_reads_the_stream_as_it_elects_a_leader() {
    let test = "repfault_machine_lost_short_lease";
    let Some(took) = machine_lost(test, "ms", &["--nats-lease", "1s"], true) else { return };
    // Its lease taken within a second, it fenced or read the stream while
    // the stream had no leader (an election takes seconds), and tried again.
    assert!(took.reread >= 1, "the stream fenced and read at the first try: it had a leader already");
}

/// What [`machine_lost`] saw of the new router's start.
struct TakeOver {
    /// How often it said that the name is held (it waits for the lease).
    waited: usize,
    /// How often it said that it fences or reads a stream again (no
    /// stream leader yet).
    reread: usize,
}

/// The machine-loss test (module docs) with a router named `name` run
/// with `flags`: before the kill the load flows, [`PRE_JOBS`] jobs wait on
/// each of `pre-e` (eMQP) and `pre-t` (text), and one text task, `held`,
/// is offered to a consumer that does not answer it. The new router
/// delivers the waiting jobs (`pre-t` in order) and `held` again. With
/// `apart`, the stream's leadership is first moved off the nodes leading
/// the key-value buckets ([`stream_leader_apart`]): else the buckets,
/// often led by the same node, elect too and hold the start up until the
/// stream has its leader. `None` when the test skips (no nats-server, not
/// under CI).
fn machine_lost(test: &str, name: &str, flags: &[&str], apart: bool) -> Option<TakeOver> {
    let (mut s, node, mut router, ledger) = start(test, 170, name, flags)?;
    let pre = PreQueues::queue(&node, &ledger);
    send_acked_text(&node, &ledger, "held", "held", 1);
    let offered = offer_text(&node, &ledger, "held");
    if apart {
        stream_leader_apart(&s, &node);
    }
    let load = Load::start(&node, &ledger);
    wait_acked(&ledger, 300 + 2 * PRE_JOBS + 1, Duration::from_secs(20));
    let leader = leader_index(&s, &node);
    // The deliveries before this one came more than DONE_MARGIN before the
    // kill: their jobs' `Done` records were confirmed.
    let settled = lock(&ledger).deliveries.len();
    std::thread::sleep(DONE_MARGIN);
    let pids = [router.pid(), s.cluster.pid(leader).expect("the stream's leader runs")];
    let killed = Instant::now();
    for pid in pids {
        // SAFETY: plain syscall on the process group of a child of this test.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
    }
    router.kill_group();
    s.cluster.kill(leader);
    load.producers.stop();
    load.consumers.stop();
    drop((pre, offered));
    // The killed router's deliveries are the ledger's first `old`.
    let (old, at_kill) = {
        let l = lock(&ledger);
        (l.deliveries.len(), l.counts())
    };

    // At once, elsewhere: the killed router's lease is still held.
    let elsewhere = node.elsewhere(&s.dir, "b");
    let mut router = elsewhere.start();
    let listened = killed.elapsed();
    let first = send_until_acked(&elsewhere, &ledger, "after", "default", BACK_BOUND);
    first.unwrap_or_else(|why| panic!("the new router acknowledges nothing: {why}\n{}", router.log_tail(30)));
    let first_ack = killed.elapsed();
    let log = router.log_text();
    let took = TakeOver {
        waited: log.matches("the router name is held").count(),
        reread: log.matches("reading it again").count()
            + log.lines().filter(|l| l.contains("fencing stream") && l.contains("retrying")).count(),
    };
    let recovered = elsewhere.log_status().expect("STATUS")["jobs_recovered"].as_u64().expect("jobs_recovered");
    let new_leader = s.cluster.nodes[leader_index(&s, &elsewhere)].name.clone();
    eprintln!(
        "{test}: the router and its stream's leader {} killed together ({at_kill}); a new router with the name \
         listened {listened:?} after the kill (it said the name was held {} times) and acknowledged a job \
         {first_ack:?} after it; {recovered} jobs recovered; the stream's leader now {new_leader}; stream fences and reads \
         at start tried again: {}",
        s.cluster.nodes[leader].name, took.waited, took.reread
    );
    assert!(listened <= TAKE_OVER_BOUND, "the new router listened {listened:?} after the kill");
    assert!(recovered > 2 * PRE_JOBS as u64, "the waiting jobs and the one in flight: {recovered} recovered");
    after_take_over(test, &elsewhere, &ledger, killed, settled, old, &mut router);
    Some(took)
}

/// The end of a take-over after a `kill -9` of the router whose
/// deliveries are the ledger's first `old` (the first `settled` of them
/// more than [`DONE_MARGIN`] before the kill): the new router `elsewhere`
/// (`router`) delivers the waiting jobs of [`PreQueues`] and `held`, then
/// every acknowledged job; nothing is refused, nothing delivered twice by
/// one router, nor by both unless in flight at the kill; a clean stop.
pub(crate) fn after_take_over(
    test: &str,
    elsewhere: &Node,
    ledger: &Shared,
    killed: Instant,
    settled: usize,
    old: usize,
    router: &mut proc::Child,
) {
    let pre_t: Vec<String> = (0..PRE_JOBS).map(|i| format!("pre-t-{i:04}")).collect();
    assert_eq!(take_text(elsewhere, ledger, "pre-t", SERVED_BOUND), pre_t, "pre-t in order");
    assert_eq!(take_emqp(elsewhere, ledger, "pre-e", PRE_JOBS, SERVED_BOUND), PRE_JOBS, "pre-e");
    assert_eq!(take_text(elsewhere, ledger, "held", SERVED_BOUND), ["held-0000"], "in flight at the kill");
    let consumers = Load::consumers(elsewhere, ledger);
    checks::drain(elsewhere, ledger);
    consumers.stop();
    let l = lock(ledger);
    eprintln!("{test}: end: {}", l.counts());
    // Sends to the killed router may fail; nothing else is odd.
    let sent_after_the_kill =
        |o: &String| o.strip_suffix(": could not be sent").and_then(|b| l.jobs.get(b)).is_some_and(|s| s.at >= killed);
    let odd: Vec<&String> = l.oddities.iter().filter(|o| !sent_after_the_kill(o)).collect();
    assert!(odd.is_empty(), "unexpected answers: {:?}", &odd[..odd.len().min(10)]);
    let refused: Vec<(&String, &Option<(Instant, Answer)>)> = l
        .jobs
        .iter()
        .filter(|(_, s)| matches!(s.answer, Some((_, Answer::Refused { .. }))))
        .map(|(b, s)| (b, &s.answer))
        .collect();
    assert!(refused.is_empty(), "refused: {:?}", &refused[..refused.len().min(10)]);
    let counts = l.delivery_counts();
    checks::check_delivered(&l, &counts);
    // At most once by each router; by both only if in flight at the kill:
    // `held`, or delivered less than DONE_MARGIN before it.
    let bodies = |d: &[ledger::Delivery]| -> BTreeMap<String, usize> {
        let mut n = BTreeMap::new();
        for d in d {
            *n.entry(d.body.clone()).or_default() += 1;
        }
        n
    };
    let (before, after) = (bodies(&l.deliveries[..old]), bodies(&l.deliveries[old..]));
    for (router, by) in [("killed", &before), ("new", &after)] {
        let twice: Vec<&String> = by.iter().filter(|(_, n)| **n > 1).map(|(b, _)| b).collect();
        assert!(twice.is_empty(), "delivered twice by the {router} router: {twice:?}");
    }
    let mut in_flight: BTreeSet<&str> = l.deliveries[settled..old].iter().map(|d| d.body.as_str()).collect();
    in_flight.insert("held-0000");
    let again: Vec<&String> = before.keys().filter(|b| after.contains_key(*b)).collect();
    let wrongly: Vec<&&String> = again.iter().filter(|b| !in_flight.contains(b.as_str())).collect();
    eprintln!(
        "{test}: {} jobs delivered, {} of them by both routers: {again:?}; in flight at the kill (held-0000, and \
         delivered within {DONE_MARGIN:?} before it): {}",
        counts.len(),
        again.len(),
        in_flight.len()
    );
    assert!(
        wrongly.is_empty(),
        "delivered again, though delivered {DONE_MARGIN:?} or more before the kill: {wrongly:?}"
    );
    drop(l);
    let status = router.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(30));
}

#[test]
fn a_router_with_no_reachable_nats_server_exits_with_a_clear_error() {
    let _w = Watchdog::new("repfault_no_nats", 60);
    let dir = TestDir::new("repfault-no-nats");
    // Nothing listens on one port; the other accepts TCP and never speaks
    // NATS (a wrong service, a hung server): both fail the start.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_url = format!("nats://{}", silent.local_addr().expect("addr"));
    let closed_url = format!("nats://127.0.0.1:{}", crate::common::ports::free_port());
    for (url, bound) in [(closed_url, Duration::from_secs(5)), (silent_url, Duration::from_secs(8))] {
        let node = Node::new(&dir, vec![url.clone()], "nonats", &["--nats-ack-timeout", "1s"]);
        let t0 = Instant::now();
        let (status, _, err) = proc::run("router-no-nats", &mut node.command(), &dir.path, Duration::from_secs(30));
        let took = t0.elapsed();
        eprintln!("repfault_no_nats: {url}: exit {status:?} after {took:?}");
        assert!(status.is_some_and(|s| !s.success()), "{url}: the start fails: {status:?}\n{err}");
        let said = format!("cannot connect to the NATS JetStream cluster at {url}");
        assert!(err.contains(&said), "{url}: {said:?} in\n{err}");
        assert!(took <= bound, "{url}: exit after {took:?}, more than {bound:?}");
    }
    drop(silent);
}

/// What one outage test measured.
#[derive(Debug, Default)]
struct Outage {
    /// From the outage's start to the first `STORE_FAILED`.
    refused_after: Duration,
    /// From the restart (or SIGCONT) to the first acknowledgement of a job
    /// sent after it.
    accepted_after: Duration,
}

/// The two nodes to take down: the stream's leader and the next one.
fn victims(s: &Setup, node: &Node) -> [usize; 2] {
    let leader = leader_index(s, node);
    [leader, (leader + 1) % NODES]
}

#[test]
fn two_of_three_killed_refuse_new_jobs_and_hold_acknowledgements() {
    let test = "repfault_two_killed";
    let Some((mut s, node, mut router, ledger)) = start(test, 170, "tk", &[]) else { return };
    keep_every_record(&s, &node);
    let pre = PreQueues::queue(&node, &ledger);
    let load = Load::start(&node, &ledger);
    wait_acked(&ledger, 300, Duration::from_secs(20));
    let down_nodes = victims(&s, &node);
    let down = Instant::now();
    for &i in &down_nodes {
        s.cluster.kill(i);
    }
    let mut m = Outage { refused_after: first_refusal(&ledger, down, &router), ..Default::default() };
    let served = pre.serve(&node, &ledger);
    let (cli, took) = node.cli_status(&s.dir);
    let shard = &cli["emq"]["wal"]["shards"][0];
    eprintln!("{test}: during the outage emq-cli status --json answered in {took:?}: {shard}");
    // Stalled, not given up (30 s): the log's own state stays ok (README
    // "known gap"); batches wait; the stall is counted.
    assert_eq!(shard["state"], "ok", "{shard}");
    assert!(shard["unconfirmed_batches"].as_u64().is_some_and(|n| n > 0), "{shard}");
    assert!(cli["emq"]["counters"]["log_stalls"].as_u64().is_some_and(|n| n >= 1), "{}", cli["emq"]["counters"]);
    std::thread::sleep((down + OUTAGE).saturating_duration_since(Instant::now()));

    for &i in &down_nodes {
        s.cluster.restart(i);
    }
    let up = Instant::now();
    m.accepted_after = first_accepted(&ledger, up, &router);
    let in_slack = assert_no_acks(&ledger, down, up);
    if let Err(why) = s.cluster.wait_ready(READY_TIMEOUT) {
        panic!("the cluster did not come back: {why}\n{}", s.cluster.log_tails(20));
    }
    // The outage outlasted the router name's lease (10 s): its key expired.
    // The renewals after it (every 3.3 s) keep the name; jobs are accepted.
    accepted_past_a_renewal(&node, &router, &ledger, up);
    let consumers = load.quiet_producers(&ledger);
    // Held, not refused: sent well after the servers went down and well
    // before the stall's 12 s, all acknowledged once they were back.
    let held = sent_between(&ledger, down + SLACK, down + Duration::from_secs(10));
    let not_acked: Vec<(&String, &Option<(Instant, Answer)>)> =
        held.iter().filter(|(_, s)| !s.acked()).map(|(b, s)| (b, &s.answer)).collect();
    assert!(!held.is_empty() && not_acked.is_empty(), "held jobs not acknowledged: {not_acked:?}");
    let early = held.values().filter(|s| s.answer.as_ref().is_some_and(|(at, _)| *at < up)).count();
    assert_eq!(early, 0, "held jobs acknowledged before the restart");
    eprintln!(
        "{test}: {m:?}; consumers served from memory in {served:?}; {} jobs held through the outage, all \
         acknowledged after it; {in_slack} sent before the kill acknowledged during the outage",
        held.len()
    );
    assert!(m.refused_after <= REFUSAL_BOUND, "refused {:?} after the outage began", m.refused_after);
    assert!(m.accepted_after <= BACK_BOUND, "accepted {:?} after the restart", m.accepted_after);
    finish(test, &s, &node, &mut router, &ledger, consumers);
}

/// Jobs queued before the outage of the give-up test that no consumer takes
/// until the router is started again.
const KEPT_JOBS: usize = 30;

/// The give-up test's `nats_give_up`.
const GIVE_UP: Duration = Duration::from_secs(6);

#[test]
fn two_of_three_paused_past_the_give_up_refuse_held_jobs_and_repair() {
    let test = "repfault_two_paused";
    let flags = ["--nats-give-up", "6s", "--nats-ack-timeout", "1s", "--nats-dedup-window", "20s"];
    let Some((mut s, node, mut router, ledger)) = start(test, 170, "tp", &flags) else { return };
    let pre = PreQueues::queue(&node, &ledger);
    let mut holder = Threads::default();
    gated_worker(&node, &ledger, "kept-e", &Arc::new(Gate::default()), &mut holder);
    send_acked_emqp(&node, &ledger, "kept-e", "kept-e", KEPT_JOBS);
    send_acked_text(&node, &ledger, "kept-t", "kept-t", KEPT_JOBS);
    let load = Load::start(&node, &ledger);
    wait_acked(&ledger, 300, Duration::from_secs(20));
    let down_nodes = victims(&s, &node);
    let down = Instant::now();
    let paused = rig::Paused::stop(&mut s.cluster, &down_nodes);
    let mut m = Outage { refused_after: first_refusal(&ledger, down, &router), ..Default::default() };
    let served = pre.serve(&node, &ledger);
    let shard = rig::wait_log_state(&node, "unreachable", GIVE_UP + Duration::from_secs(5));
    let shard = shard.unwrap_or_else(|why| panic!("the log does not give up: {why}\n{}", router.log_tail(30)));
    let unreachable_after = down.elapsed();
    assert_eq!(shard["repairs"], 0, "{shard}");
    let (cli, took) = node.cli_status(&s.dir);
    assert_eq!(cli["emq"]["wal"]["shards"][0]["state"], "unreachable", "emq-cli status --json: {cli}");
    // Past two give-ups: the repair's first snapshot is given up too.
    std::thread::sleep((down + GIVE_UP * 2 + Duration::from_secs(4)).saturating_duration_since(Instant::now()));

    paused.resume();
    let up = Instant::now();
    m.accepted_after = first_accepted(&ledger, up, &router);
    let shard = rig::wait_log_state(&node, "ok", BACK_BOUND).unwrap_or_else(|why| panic!("not repaired: {why}"));
    let repaired_after = up.elapsed();
    assert!(shard["repairs"].as_u64().is_some_and(|n| n >= 1), "{shard}");
    // The snapshot supersedes everything before it: purged (a purge asked
    // for while the servers still elect leaders may fail; it is asked again
    // every 2 s until one is done).
    let purged = wait::until_ok(BACK_BOUND, || {
        let shard = node.log_status()?;
        match shard["purged_below_seq"].as_u64() {
            Some(n) if n > 1 => Ok(n),
            _ => Err(format!("{shard}")),
        }
    });
    let purged = purged.unwrap_or_else(|why| panic!("the stream is not purged below the snapshot: {why}"));
    let in_slack = assert_no_acks(&ledger, down, up);
    if let Err(why) = s.cluster.wait_ready(READY_TIMEOUT) {
        panic!("the cluster did not come back: {why}\n{}", s.cluster.log_tails(20));
    }
    accepted_past_a_renewal(&node, &router, &ledger, up);
    // Jobs wait in the queues for the restart below.
    load.consumers.stop();
    std::thread::sleep(Duration::from_secs(1));
    let load = Load { consumers: Threads::default(), ..load };
    drop(load.quiet_producers(&ledger));
    // The acceptances held when the store gave up were refused, not
    // acknowledged, at the give-up of the oldest batch unconfirmed (first
    // tried when the servers stopped): every one handed out is given up.
    // A text connection's commands wait behind its held answers, so a SCHED
    // written during the outage may be read only after the give-up, and
    // then be refused at once ("not stored"; checked never delivered).
    let held = sent_between(&ledger, down + SLACK, down + Duration::from_secs(4));
    let gave_up = (down + GIVE_UP - SLACK)..(down + GIVE_UP + Duration::from_secs(5));
    let at_the_give_up = |b: &str, s: &ledger::Sent| {
        matches!(&s.answer, Some((at, Answer::Refused { code, text }))
            if code == "STORE_FAILED" && gave_up.contains(at)
                && (text.starts_with("not confirmed:") || (b.starts_with("t-") && refused_at_once(s))))
    };
    // Both protocols say "not confirmed" to a job held at the give-up.
    for prefix in ["e-", "t-"] {
        let said = lock(&ledger).jobs.iter().any(|(b, s)| {
            b.starts_with(prefix)
                && matches!(&s.answer, Some((_, Answer::Refused { text, .. })) if text.starts_with("not confirmed:"))
        });
        assert!(said, "no {prefix}job refused \"not confirmed\": {}", lock(&ledger).counts());
    }
    let wrong: Vec<String> = held
        .iter()
        .filter(|(b, s)| !at_the_give_up(b, s))
        .map(|(b, s)| format!("{b} sent {:?} after the SIGSTOP: {:?}", s.at - down, s.answer))
        .collect();
    assert!(!held.is_empty() && wrong.is_empty(), "held acceptances not refused at the give-up: {wrong:?}");
    eprintln!(
        "{test}: {m:?}; unreachable {unreachable_after:?} after the SIGSTOP; repaired {repaired_after:?} after \
         the SIGCONT (the stream purged below sequence {purged}); consumers served from memory in {served:?}; \
         emq-cli status --json in {took:?}; {} held acceptances refused at the give-up; {in_slack} sent before the SIGSTOP acknowledged during the outage; {}",
        held.len(),
        lock(&ledger).counts()
    );
    assert!(m.refused_after <= REFUSAL_BOUND, "refused {:?} after the outage began", m.refused_after);
    assert!(m.accepted_after <= BACK_BOUND, "accepted {:?} after the SIGCONT", m.accepted_after);

    // A router started again with the name recovers every live job once.
    let waiting = waiting_when_idle(&node);
    let status = router.terminate(Duration::from_secs(20));
    assert!(status.is_some_and(|st| st.success()), "a clean stop: {status:?}\n{}", router.log_tail(30));
    holder.stop();
    let delivered_before = lock(&ledger).deliveries.len();
    let again = node.start();
    let st = node.status().expect("STATUS after the restart");
    let recovered: BTreeMap<String, u64> = st["waiting_messages_by_queue"]
        .as_object()
        .map(|m| m.iter().map(|(q, n)| (q.clone(), n.as_u64().unwrap_or(0))).collect())
        .unwrap_or_default();
    let total: u64 = recovered.values().sum();
    assert_eq!(st["emq"]["wal"]["shards"][0]["jobs_recovered"], total, "{}", st["emq"]["wal"]);
    // Every recovered job taken: none of them was delivered before
    // (check), and they are the jobs that waited.
    let kept = |p: &str| (0..KEPT_JOBS).map(|i| format!("{p}-{i:04}")).collect::<Vec<_>>();
    assert_eq!(take_text(&node, &ledger, "kept-t", SERVED_BOUND), kept("kept-t"), "kept-t in order");
    assert_eq!(take_text(&node, &ledger, "tq", SERVED_BOUND).len() as u64, recovered.get("tq").copied().unwrap_or(0));
    for q in ["kept-e", "default"] {
        let n = recovered.get(q).copied().unwrap_or(0) as usize;
        assert_eq!(take_emqp(&node, &ledger, q, n, Duration::from_secs(10)), n, "{q}");
    }
    let l = lock(&ledger);
    assert_eq!((l.deliveries.len() - delivered_before) as u64, total, "every recovered job delivered");
    let log = again.log_text();
    let superseded = log.lines().rev().find(|l| l.contains("before the last repair's snapshot skipped"));
    eprintln!(
        "{test}: restarted with {total} jobs recovered ({recovered:?}); messages superseded by the snapshot: {}; \
         end: {}",
        superseded.and_then(|l| l.split("messages=").nth(1)).unwrap_or("none"),
        l.counts()
    );
    check(&l);
    assert_eq!(recovered, waiting, "the same jobs wait after the restart");
}

/// A quiet router (no load: the repair's snapshot is published at once)
/// and an outage past two give-ups: the first batch is given up, then the
/// repair's snapshot too. The log tries the repair again, so once the
/// servers are back it is repaired and accepts jobs; before, it stayed
/// `unreachable` (refusing every new job) until restarted.
#[test]
fn a_repair_whose_snapshot_is_given_up_too_is_tried_again() {
    let test = "repfault_snapshot_given_up";
    let give_up = Duration::from_secs(2);
    let flags = ["--nats-give-up", "2s", "--nats-ack-timeout", "500ms", "--nats-dedup-window", "10s"];
    let Some((mut s, node, router, ledger)) = start(test, 120, "sg", &flags) else { return };
    send_acked_emqp(&node, &ledger, "before", "default", 5);
    let down_nodes = victims(&s, &node);
    let down = Instant::now();
    for &i in &down_nodes {
        s.cluster.kill(i);
    }
    // One job held, refused at the give-up.
    let ctx = zmq::Context::new();
    let c = load::dealer(&ctx, &node.frontend());
    let frames: [&[u8]; 7] = [b"", b"eMQP/1.0", b"REQUEST", b"held", b"default", b"", b"held"];
    c.send_multipart(frames, 0).expect("send");
    let f = load::recv_within(&c, (give_up * 3).as_millis() as i64).expect("an answer to the held job");
    assert_eq!(
        (f[2].as_slice(), f[4].as_slice(), f[5].as_slice()),
        (&b"ERROR"[..], &b"held"[..], &b"STORE_FAILED"[..])
    );
    let refused_after = down.elapsed();
    rig::wait_log_state(&node, "unreachable", give_up * 3).expect("unreachable");
    // The repair's snapshot (published at the give-up) is given up too.
    let shard = wait::until_ok(give_up * 4, || {
        let shard = node.log_status()?;
        match shard["give_ups"].as_u64() {
            Some(n) if n >= 2 => Ok(shard),
            _ => Err(format!("{shard}")),
        }
    });
    let shard = shard.unwrap_or_else(|why| panic!("the snapshot is not given up: {why}"));
    assert_eq!(shard["state"], "unreachable", "{shard}");
    for &i in &down_nodes {
        s.cluster.restart(i);
    }
    let up = Instant::now();
    let repaired = rig::wait_log_state(&node, "ok", BACK_BOUND);
    let repaired = repaired.unwrap_or_else(|why| panic!("not repaired: {why}\n{}", router.log_tail(30)));
    let repaired_after = up.elapsed();
    assert!(repaired["repairs"].as_u64().is_some_and(|n| n >= 1), "{repaired}");
    let accepted = send_until_acked(&node, &ledger, "after", "default", BACK_BOUND);
    let accepted = accepted.unwrap_or_else(|why| panic!("{why}\n{}", router.log_tail(30)));
    eprintln!(
        "{test}: held job refused {refused_after:?} after the kill; {} give-ups; repaired {repaired_after:?} after \
         the restart; a new job acknowledged {accepted:?} after that",
        repaired["give_ups"]
    );
}
