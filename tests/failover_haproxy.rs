//! Python EventMQ peers behind a moving address (issue 28, part 3): the
//! unchanged Python client and jobmanager (0.3.13, from the interop venv)
//! know one address each, HAProxy's, and live through a take-over.
//!
//! A 3-node nats-server cluster; an owner router and a standby
//! (`--standby`, same name, `durability = "replicated"`, ports of their
//! own); HAProxy 2.6 (Debian) started by the test, `mode tcp`, one
//! listener for the frontend and one for the backend, each with both
//! routers as servers and a plain TCP connect check on the server's own
//! port (a standby binds nothing, so it is down until it owns): the
//! config is [`haproxy_config`], shown in docs/replicated.md "Python
//! EventMQ peers behind a moving address".
//!
//! One Python client process (`tests/interop/emq_client_loop.py`: one
//! `Sender`, connected once, a job every 200 ms, reading the router's
//! acceptances) and one `emq-jobmanager` run from before the `kill -9` of
//! the owner to after the standby took over; neither is restarted. What
//! they do meanwhile: HAProxy cuts their connections when the owner dies
//! and refuses new ones (accepts and closes) until the standby listens;
//! ZeroMQ reconnects both sockets by itself (every 100 ms); the client's
//! jobs sent meanwhile wait in its socket's queue (or were lost in a
//! connection that broke: never acknowledged); the jobmanager's first
//! HEARTBEAT to the new owner is answered `DISCONNECT` (a worker it does
//! not know), on which the jobmanager logs an `ERROR` traceback (its
//! `unbind` of a connected socket raises), rebuilds its socket under a
//! new identity, INFORMs again and sends its READYs, in the same process.
//!
//! Asserted: every job acknowledged (REPLY) by either router ran; every
//! job sent after HAProxy saw the new owner up was acknowledged and ran
//! (at least [`AFTER_JOBS`]); jobs acknowledged after the kill (so by the
//! new owner: the old one is dead) ran exactly once; a job ran twice
//! only if the old owner acknowledged it (in flight at the kill); the
//! routers refused nothing; the new owner counts at least as many jobs
//! completed as it acknowledged; the same jobmanager and client processes
//! ran throughout. Printed: the take-over and the gap the peers see (last
//! acceptance before the kill to the first after it; first job run after
//! it; measured 8.1-11.3 s, docs/replicated.md). About 25-31 s.
//!
//! Skips in one line without haproxy or nats-server, except under CI
//! (`CI=true`), where either missing is a failure (`.ci/run` installs both).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::interop::{begin, REGISTER_TIMEOUT};
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::{admin, jobs, python, wait};
use crate::replicated_faults::rig::Node;
use crate::replicated_faults::setup;

/// The jobmanager's queues (`EVENTMQ_QUEUES`).
const QUEUES: &str = r#"[[10,"default"]]"#;
/// Jobs acknowledged before the kill, and after the take-over.
const BEFORE_JOBS: usize = 20;
/// Jobs sent after HAProxy saw the new owner up that it must acknowledge
/// and run.
const AFTER_JOBS: usize = 20;
/// From the `kill -9` to the standby listening (lease 10 s + poll 3.3 s +
/// replay, measured 10.0-13.3 s in tests/failover.rs; slack for 2 cores).
const TAKE_OVER_BOUND: Duration = Duration::from_secs(30);
/// From the standby listening to [`AFTER_JOBS`] jobs acknowledged by it.
const AFTER_BOUND: Duration = Duration::from_secs(60);
/// Until every acknowledged job ran.
const RUN_BOUND: Duration = Duration::from_secs(60);
/// A duplicate would show within this after every job ran once.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);

/// The haproxy binary, or `None` after one line saying why the test skips;
/// under CI a missing haproxy fails the test.
fn haproxy_or_skip(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("haproxy"))
        .find(|p| p.is_file());
    match found {
        Some(bin) => Some(bin),
        None => {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "{test} needs haproxy under CI (.ci/run installs Debian's)"
            );
            eprintln!(
                "skipped: {test} needs haproxy (Debian: apt-get install haproxy), not found on PATH or in /usr/sbin"
            );
            None
        }
    }
}

/// The port of `tcp://127.0.0.1:<port>`.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no port in {endpoint}"))
}

/// HAProxy's config for the two routers `(frontend port, backend port)`
/// each: `mode tcp`, a listener on `front` and one on `back`, a TCP
/// connect check every 500 ms on the server's own port (down after 2
/// failures, up after 1 success), connections to a server marked down cut
/// at once. `stats` is the admin socket the test reads the servers'
/// states from.
pub fn haproxy_config(front: u16, back: u16, routers: &[(u16, u16)], stats: &Path) -> String {
    let servers = |which: fn(&(u16, u16)) -> u16| {
        routers
            .iter()
            .enumerate()
            .map(|(i, r)| format!("    server router{} 127.0.0.1:{}\n", i + 1, which(r)))
            .collect::<String>()
    };
    format!(
        "global
    stats socket {stats} mode 600 level admin

defaults
    mode tcp
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    default-server check inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions

listen emq_frontend
    bind 127.0.0.1:{front}
{fs}
listen emq_backend
    bind 127.0.0.1:{back}
{bs}",
        stats = stats.display(),
        fs = servers(|r| r.0),
        bs = servers(|r| r.1),
    )
}

/// `show stat` on HAProxy's admin socket: (proxy, server) → status
/// (`UP`, `DOWN`, …).
fn server_states(sock: &Path) -> Result<BTreeMap<(String, String), String>, String> {
    let mut s = std::os::unix::net::UnixStream::connect(sock).map_err(|e| format!("{}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.write_all(b"show stat\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().ok_or("no header")?.trim_start_matches("# ").split(',').collect();
    let status = header.iter().position(|h| *h == "status").ok_or("no status column")?;
    Ok(lines
        .map(|l| l.split(',').collect::<Vec<&str>>())
        .filter(|f| f.len() > status && f[1].starts_with("router"))
        .map(|f| ((f[0].to_string(), f[1].to_string()), f[status].to_string()))
        .collect())
}

/// Waits until HAProxy has `server` up and every other router down in
/// both listeners.
fn wait_only_up(sock: &Path, server: &str, within: Duration) -> Result<(), String> {
    wait::until_ok(within, || {
        let st = server_states(sock)?;
        let ok = st.len() == 4 && st.iter().all(|((_, srv), s)| s.starts_with("UP") == (srv == server));
        if ok {
            Ok(())
        } else {
            Err(format!("servers: {st:?}"))
        }
    })
}

/// Now as Unix time in seconds (the Python peers' `time.time()`).
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

/// What the client printed: tag → (msgid, sent at); msgid → acked at;
/// refusals; whether it finished.
#[derive(Default)]
struct ClientOut {
    sent: BTreeMap<String, (String, f64)>,
    acked: BTreeMap<String, f64>,
    refused: Vec<String>,
    total: Option<usize>,
}

impl ClientOut {
    fn read(path: &Path) -> ClientOut {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut out = ClientOut::default();
        for line in text.lines().filter(|l| l.ends_with(|c: char| c.is_ascii_digit())) {
            let f: Vec<&str> = line.split(' ').collect();
            let at = || f.last().and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0);
            match f[0] {
                "sent" if f.len() == 4 => {
                    out.sent.insert(f[1].to_string(), (f[2].to_string(), at()));
                }
                "acked" if f.len() == 3 => {
                    out.acked.insert(f[1].to_string(), at());
                }
                "refused" => out.refused.push(line.to_string()),
                "total" if f.len() == 2 => out.total = f[1].parse().ok(),
                _ => {}
            }
        }
        out
    }

    /// Tags of the jobs acknowledged within `(from, to]` (Unix time).
    fn acked_between(&self, from: f64, to: f64) -> BTreeSet<String> {
        self.sent
            .iter()
            .filter(|(_, (id, _))| self.acked.get(id).is_some_and(|&t| t > from && t <= to))
            .map(|(tag, _)| tag.clone())
            .collect()
    }
}

#[test]
fn python_peers_through_haproxy_live_through_a_take_over() {
    let test = "failover_haproxy";
    let Some(haproxy) = haproxy_or_skip(test) else { return };
    let (_turn, _interop_dog) = begin(test, Duration::from_secs(300));
    let Some(s) = setup(test, 300) else { return };
    let dir: &TestDir = &s.dir;

    // The owner, then the standby (waiting: no port bound).
    let node = Node::new(dir, s.cluster.urls(), "hx", &[]);
    let mut owner = node.start();
    let standby = node.elsewhere(dir, "b").with_flags(&["--standby"]);
    let mut router_b = standby.spawn();
    let waits =
        wait::until(Duration::from_secs(15), || router_b.log_text().contains("standby: the router name is held"));
    assert!(waits, "the standby does not say it waits\n{}", router_b.log_tail(30));

    // HAProxy in front of both.
    let (front, back) = (free_port(), free_port());
    let routers = [
        (port_of(&node.frontend()), port_of(&node.backend())),
        (port_of(&standby.frontend()), port_of(&standby.backend())),
    ];
    let stats = dir.join("haproxy.sock");
    let config = haproxy_config(front, back, &routers, &stats);
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(&cfg, &config).expect("write haproxy.cfg");
    let mut cmd = Command::new(&haproxy);
    cmd.arg("-db").arg("-f").arg(&cfg);
    let mut proxy = Child::spawn("haproxy", &mut cmd, &dir.join("haproxy.log"));
    let up = wait::until(Duration::from_secs(10), || !proxy.is_alive() || (is_listening(front) && is_listening(back)));
    assert!(up && proxy.is_alive(), "haproxy did not start\n{config}\n{}", proxy.log_tail(20));
    wait_only_up(&stats, "router1", Duration::from_secs(10))
        .unwrap_or_else(|why| panic!("haproxy does not see the owner alone up: {why}\n{}", proxy.log_tail(20)));

    // The unchanged Python peers, on HAProxy's addresses only.
    let out = dir.join("jobs.txt");
    let mut jm = python::start_jobmanager(dir, &zmq_endpoint(back), "A", QUEUES, 2);
    let registered = wait::until_ok(REGISTER_TIMEOUT, || {
        let listed = admin::workers(&node.admin())?;
        match admin::worker_serving(&listed, QUEUES) {
            Some(w) if w.available_slots == 2 => Ok(()),
            _ => Err(format!("workers: {listed:?}")),
        }
    });
    registered
        .unwrap_or_else(|why| panic!("the jobmanager did not register through haproxy: {why}\n{}", jm.log_tail(20)));
    let stop = dir.join("client.stop");
    let client_out = dir.join("client.out");
    let mut cmd = python::script_cmd("emq_client_loop.py");
    cmd.args(["--frontend", &zmq_endpoint(front), "--prefix", "j"]).arg("--out").arg(&out).arg("--stop").arg(&stop);
    cmd.stdout(std::fs::File::create(&client_out).expect("client.out"));
    cmd.stderr(std::fs::File::create(dir.join("client.err")).expect("client.err"));
    let mut client = Child::spawn_keeping_output("python-client", &mut cmd, &dir.join("client.err"));
    let logs = |client: &Child, jm: &Child, a: &Child, b: &Child| {
        [client.log_tail(15), jm.log_tail(25), a.log_tail(15), b.log_tail(30)].join("\n")
    };

    let before = wait::until(Duration::from_secs(60), || {
        let c = ClientOut::read(&client_out);
        let ran = jobs::by_tag(&jobs::read(&out), "run");
        c.acked_between(0.0, f64::MAX).iter().filter(|t| ran.contains_key(*t)).count() >= BEFORE_JOBS
    });
    assert!(before, "{BEFORE_JOBS} jobs did not run before the kill\n{}", logs(&client, &jm, &owner, &router_b));

    // kill -9 of the owner.
    let killed_at = unix_now();
    let killed = Instant::now();
    owner.kill_group();
    let listening = standby.wait_listening(&mut router_b, TAKE_OVER_BOUND);
    let listened = killed.elapsed();
    assert!(listening, "the standby did not take over within {TAKE_OVER_BOUND:?}\n{}", router_b.log_tail(40));
    wait_only_up(&stats, "router2", Duration::from_secs(10))
        .unwrap_or_else(|why| panic!("haproxy does not see the new owner alone up: {why}\n{}", proxy.log_tail(20)));
    let proxied_at = unix_now();
    let after = wait::until(AFTER_BOUND, || {
        let c = ClientOut::read(&client_out);
        let ran = jobs::by_tag(&jobs::read(&out), "run");
        let acked = c.acked_between(proxied_at, f64::MAX);
        let sent_after = c.sent.iter().filter(|(_, (_, at))| *at > proxied_at).map(|(t, _)| t);
        sent_after.filter(|t| acked.contains(*t) && ran.contains_key(*t)).count() >= AFTER_JOBS
    });
    assert!(
        after,
        "{AFTER_JOBS} jobs sent after the take-over were not acknowledged and run within {AFTER_BOUND:?}\n{}",
        logs(&client, &jm, &owner, &router_b)
    );

    // Stop the client; every acknowledged job must run.
    std::fs::write(&stop, "").expect("stop file");
    let ended = wait::until(Duration::from_secs(20), || !client.is_alive());
    assert!(ended, "the client did not stop\n{}", client.log_tail(20));
    let c = ClientOut::read(&client_out);
    assert_eq!(c.total, Some(c.sent.len()), "the client did not finish cleanly\n{}", client.log_tail(20));
    let acked: BTreeSet<String> = c.acked_between(0.0, f64::MAX);
    let all_ran = wait::until(RUN_BOUND, || {
        let ran = jobs::by_tag(&jobs::read(&out), "run");
        acked.iter().all(|t| ran.contains_key(t))
    });
    std::thread::sleep(DUPLICATE_WINDOW);
    let events = jobs::read(&out);
    let ran = jobs::by_tag(&events, "run");
    let lost: Vec<&String> = acked.iter().filter(|t| !ran.contains_key(*t)).collect();
    assert!(all_ran && lost.is_empty(), "acknowledged, never ran: {lost:?}\n{}", logs(&client, &jm, &owner, &router_b));

    let acked_before = c.acked_between(0.0, killed_at);
    let acked_after = c.acked_between(killed_at, f64::MAX);
    let stray: Vec<&String> = ran.keys().filter(|t| !c.sent.contains_key(*t)).collect();
    assert!(stray.is_empty(), "jobs ran that the client never sent: {stray:?}");
    let twice: Vec<(&String, usize)> = ran.iter().filter(|(_, on)| on.len() > 1).map(|(t, on)| (t, on.len())).collect();
    let twice_after: Vec<&(&String, usize)> = twice.iter().filter(|(t, _)| !acked_before.contains(*t)).collect();
    assert!(twice_after.is_empty(), "jobs acknowledged by the new owner ran twice: {twice_after:?}");
    assert!(acked_after.len() >= AFTER_JOBS, "only {} jobs acknowledged after the kill", acked_after.len());
    let sent_after: Vec<&String> = c.sent.iter().filter(|(_, (_, at))| *at > proxied_at).map(|(t, _)| t).collect();
    let unanswered: Vec<&&String> = sent_after.iter().filter(|t| !acked_after.contains(**t)).collect();
    assert!(
        sent_after.len() >= AFTER_JOBS && unanswered.is_empty(),
        "of the {} jobs sent after haproxy saw the new owner up, not acknowledged: {unanswered:?}",
        sent_after.len()
    );
    assert!(c.refused.is_empty(), "the routers refused jobs: {:?}", c.refused);

    // On the new owner: the old one is dead, and the new one counts them.
    assert!(!owner.is_alive(), "the old owner is dead");
    let status = standby.status().unwrap_or_else(|why| panic!("the new owner's STATUS: {why}"));
    let completed = status["completed_messages_by_queue"]["default"].as_u64().unwrap_or(0);
    assert!(
        completed >= acked_after.len() as u64,
        "the new owner completed {completed} jobs, fewer than the {} it acknowledged: {status}",
        acked_after.len()
    );
    assert!(jm.is_alive(), "the same jobmanager ran throughout\n{}", jm.log_tail(20));
    assert!(client.exit_status().is_some_and(|st| st.success()), "the same client ran throughout");

    // What the peers saw.
    let last_ack_before = c.acked.values().copied().filter(|&t| t <= killed_at).fold(0.0, f64::max);
    let first_ack_after = c.acked.values().copied().filter(|&t| t > killed_at).fold(f64::MAX, f64::min);
    let first_run_after = events.iter().map(|e| e.time).filter(|&t| t > killed_at).fold(f64::MAX, f64::min);
    let unacked: Vec<&String> =
        c.sent.iter().filter(|(_, (id, _))| !c.acked.contains_key(id)).map(|(t, _)| t).collect();
    let b_log = router_b.log_text();
    let disconnected = b_log.contains("message from a worker the router does not know: DISCONNECT");
    let reinformed = b_log.matches("worker registered").count();
    let jm_log = jm.log_text();
    let informs = jm_log.matches("'INFORM'").count();
    let gave_up = jm_log.contains("The broker appears to have gone away");
    eprintln!(
        "{test}: kill -9 of the owner; the standby listened {listened:?} after it (haproxy saw it up {:.2} s after \
         the kill); the Python client's last acceptance before the kill {:.2} s before it, its first after it {:.2} \
         s after it (a gap of {:.2} s); the first job run after the kill {:.2} s after it; jobs sent {}, acknowledged \
         {} before the kill and {} after it, never acknowledged {} ({unacked:?}), run twice {} ({twice:?}); the new \
         owner told the jobmanager DISCONNECT: {disconnected}, registrations on it: {reinformed}; the jobmanager sent {informs} INFORMs in all, gave up on the router by its own \
         heartbeat liveness: {gave_up}",
        proxied_at - killed_at,
        killed_at - last_ack_before,
        first_ack_after - killed_at,
        first_ack_after - last_ack_before,
        first_run_after - killed_at,
        c.sent.len(),
        acked_before.len(),
        acked_after.len(),
        unacked.len(),
        twice.len(),
    );
    drop(jm);
    drop(proxy);
}
