//! What operators see of a failover (issue 28, part 5), on a real 3-node
//! nats-server cluster: a standby answers admin while it waits (STATUS
//! with its role, the owner and the owner's lease age; any other command
//! `ERROR NOT_OWNER` naming the owner), and after taking over its STATUS
//! and `emq-cli status` say owner, the epoch, whom it took the name from
//! and how long the replay took; a standby stopped with SIGTERM while it
//! waits exits at once, cleanly, also while the NATS cluster does not
//! answer. Without a nats-server the test says so
//! in one line and skips.

use std::time::{Duration, Instant};

use crate::common::{proc, wait};
use crate::replicated_faults::rig::{Node, Paused};
use crate::replicated_faults::{load, start};

/// From the owner's `kill -9` to the standby serving (tests/failover.rs).
const TAKE_OVER_BOUND: Duration = Duration::from_secs(22);

/// Sends admin command `word` to `node` and returns the answer's frames
/// (without the empty frame's predecessor: `["", "eMQP/1.0", WORD, msgid, …]`).
fn admin(node: &Node, word: &str) -> Vec<Vec<u8>> {
    let ctx = zmq::Context::new();
    let sock = load::dealer(&ctx, &node.admin());
    sock.send_multipart([&b""[..], b"eMQP/1.0", word.as_bytes(), b"m1"], 0).expect("send an admin command");
    load::recv_within(&sock, 5000).unwrap_or_else(|| panic!("no answer to {word} within 5 s"))
}

fn text(frames: &[Vec<u8>], i: usize) -> String {
    frames.get(i).map(|f| String::from_utf8_lossy(f).into_owned()).unwrap_or_default()
}

#[test]
fn a_standby_answers_admin_and_after_taking_over_says_what_it_took() {
    let test = "failover_status";
    let Some((mut s, node, mut owner, _ledger)) = start(test, 180, "fst", &[]) else { return };
    let standby = node.elsewhere(&s.dir, "b").with_flags(&["--standby"]);
    let mut router = standby.spawn();

    // The standby's admin answers while it waits.
    let waiting = wait::until(Duration::from_secs(15), || {
        standby.status().is_ok_and(|st| st["emq"]["wal"]["nats"]["ownership"]["role"] == "standby")
    });
    assert!(waiting, "the standby's STATUS never says standby\n{}", router.log_tail(30));
    let st = standby.status().expect("STATUS of the standby");
    let own = &st["emq"]["wal"]["nats"]["ownership"];
    let holder = own["holder"].as_str().unwrap_or_default().to_string();
    assert!(holder.contains(&node.frontend().replace("tcp://", "")), "the holder names the owner: {own}");
    let age = own["lease_age_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(age <= 10_000, "the owner's lease, renewed every 3.3 s, is {age} ms old: {own}");
    assert_eq!(st["emq"]["role"], "standby", "{st}");
    assert_eq!(st["emq"]["wal"]["nats"]["router_name"], "fst", "{st}");
    let refused = admin(&standby, "ROUTER_SHOW_WORKERS");
    assert_eq!(text(&refused, 2), "ERROR", "{refused:?}");
    assert_eq!(text(&refused, 4), "m1", "the ERROR refers to the command's msgid");
    assert_eq!(text(&refused, 5), "NOT_OWNER");
    assert!(text(&refused, 6).contains(&holder), "the refusal names the owner: {}", text(&refused, 6));
    // emq-cli status against the standby says so in words.
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cli.args(["--admin", &standby.admin(), "status"]);
    let (done, out, err) = proc::run("emq-cli-status", &mut cli, &s.dir.path, Duration::from_secs(10));
    assert!(done.is_some_and(|d| d.success()), "emq-cli status: {out}\n{err}");
    assert!(out.contains("standby: serves nothing until the owner's lease expires"), "{out}");
    assert!(out.contains("role standby, owner "), "{out}");

    // Both routers of the name in one emq-cli call: status shows each, any
    // other command goes to the owner whatever the order.
    let both = format!("{},{}", standby.admin(), node.admin());
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cli.args(["--admin", &both, "status", "--json"]);
    let (done, out, err) = proc::run("emq-cli-status-all", &mut cli, &s.dir.path, Duration::from_secs(20));
    assert!(done.is_some_and(|d| d.success()), "emq-cli status of both: {out}\n{err}");
    let all: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let roles: Vec<&str> =
        (0..2).map(|i| all["routers"][i]["status"]["emq"]["wal"]["nats"]["role"].as_str().unwrap_or("-")).collect();
    assert_eq!(roles, ["standby", "owner"], "{all}");
    assert_eq!(all["routers"][0]["admin"].as_str(), Some(standby.admin().as_str()), "{all}");
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cli.args(["--admin", &both, "status"]);
    let (done, out, err) = proc::run("emq-cli-status-all", &mut cli, &s.dir.path, Duration::from_secs(20));
    assert!(done.is_some_and(|d| d.success()), "{out}\n{err}");
    assert!(out.contains(&format!("== router {}\n", standby.admin())), "{out}");
    assert!(out.contains(&format!("== router {}\n", node.admin())), "{out}");
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cli.args(["--admin", &both, "workers", "--json"]);
    let (done, out, err) = proc::run("emq-cli-workers", &mut cli, &s.dir.path, Duration::from_secs(20));
    assert!(done.is_some_and(|d| d.success()), "workers goes to the owner, not the standby: {out}\n{err}");

    // A third router waiting as a standby stops at once on SIGTERM.
    let third = node.elsewhere(&s.dir, "c").with_flags(&["--standby"]);
    let mut c = third.spawn();
    let said = wait::until(Duration::from_secs(15), || c.log_text().contains("standby: the router name is held"));
    assert!(said, "the third router does not wait\n{}", c.log_tail(20));
    // With the whole cluster paused, its lease requests are being retried:
    // the signal ends those too.
    let paused = Paused::stop(&mut s.cluster, &[0, 1, 2]);
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let code = c.stop_with(libc::SIGTERM, Duration::from_secs(5));
    paused.resume();
    assert_eq!(code, Some(0), "a waiting standby exits 0 on SIGTERM\n{}", c.log_tail(20));
    assert!(t0.elapsed() < Duration::from_secs(3), "it took {:?}", t0.elapsed());
    assert!(c.log_text().contains("stopped while waiting as a standby"), "{}", c.log_tail(10));

    // kill -9 of the owner: the standby takes over and says what it took.
    // SAFETY: plain syscall on the process group of a child of this test.
    unsafe { libc::killpg(owner.pid(), libc::SIGKILL) };
    owner.kill_group();
    let up = standby.wait_listening(&mut router, TAKE_OVER_BOUND);
    assert!(up, "the standby did not take over\n{}", router.log_tail(40));
    let st = standby.status().expect("STATUS of the new owner");
    let own = &st["emq"]["wal"]["nats"]["ownership"];
    assert_eq!(st["emq"]["wal"]["nats"]["role"], "owner", "{st}");
    assert_eq!((own["role"].as_str(), own["takeovers"].as_u64()), (Some("owner"), Some(1)), "{own}");
    assert_eq!(own["took_over_from"].as_str(), Some(holder.as_str()), "{own}");
    assert!(own["epoch"].as_u64().is_some_and(|e| e > 0), "{own}");
    assert!(own["replay"]["took_ms"].is_u64(), "{own}");
    assert_eq!(own["replay"]["streams_read"], own["replay"]["streams"], "{own}");
    let mine = own["holder"].as_str().unwrap_or_default();
    assert!(mine.contains(&standby.frontend().replace("tcp://", "")), "the holder is the new owner: {own}");
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    cli.args(["--admin", &standby.admin(), "status"]);
    let (done, out, err) = proc::run("emq-cli-status", &mut cli, &s.dir.path, Duration::from_secs(10));
    assert!(done.is_some_and(|d| d.success()), "emq-cli status: {out}\n{err}");
    assert!(out.contains(", role owner (epoch "), "{out}");
    assert!(out.contains("accepting jobs"), "{out}");
    let log = router.log_text();
    assert!(log.contains("serving: this router owns its name"), "one line when it serves\n{log}");
    router.terminate(Duration::from_secs(10));
}
