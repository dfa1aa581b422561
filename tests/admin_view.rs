//! One admin view over several router names (docs/admin.md, issue 31) on
//! a real 3-node nats-server cluster: two replicated routers of different
//! names, a worker on each, jobs waiting and dead on each. `emq-cli
//! status` over both sums their STATUSes, `--per-router` shows each,
//! `workers` and `dead list` carry the router's name; each router's STATUS
//! lists the other name with its addresses, its `/metrics` series carry
//! `router="<name>"` and its status page links the other's. With one
//! router stopped the view is partial and emq-cli still exits 0. Without
//! a nats-server the test says so in one line and skips.

use std::time::Duration;

use emq::client::text::TextClient;
use serde_json::Value;

use crate::common::proc::{self, Child, TestDir};
use crate::common::wait;
use crate::replicated_faults::rig::Node;

/// The worker of tests/cli.rs: a job whose body is `fail` fails.
const SCRIPT: &str = "#!/bin/sh\np=$(cat)\n[ \"$p\" = fail ] && exit 1\necho ok\n";

/// Runs emq-cli with `args`; its exit code, stdout and stderr.
fn cli(dir: &TestDir, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = crate::cli::bin("emq-cli");
    cmd.args(["--timeout", "2s"]).args(args);
    let (status, out, err) = proc::run("emq-cli", &mut cmd, &dir.path, Duration::from_secs(20));
    (status.and_then(|s| s.code()), out, err)
}

/// emq-cli `args` with `--json`, which must exit 0: its JSON.
fn cli_json(dir: &TestDir, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = cli(dir, &all);
    assert_eq!(code, Some(0), "emq-cli {args:?}: {out}\n{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("emq-cli {args:?} printed no JSON ({e}): {out}"))
}

/// `GET path` of an HTTP server: the whole answer.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("the HTTP server accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).expect("request sent");
    let mut page = String::new();
    s.read_to_string(&mut page).expect("answer read");
    page
}

/// A worker for queue `jobs` on `node`.
fn worker(dir: &TestDir, node: &Node, script: &std::path::Path) -> Child {
    let mut cmd = crate::cli::bin("emq-worker");
    cmd.args(["--backend", &node.backend(), "-Q", "jobs", "--stats-interval", "0s", "--"]).arg(script);
    Child::spawn("worker", &mut cmd, &dir.join(&format!("worker-{}.log", node.name)))
}

/// STATUS of `node`, waited for until `check` passes (30 s).
fn status_until(node: &Node, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    wait::until_ok(Duration::from_secs(30), || {
        let st = node.status()?;
        if check(&st) {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .unwrap_or_else(|last| panic!("{}: {what}; last STATUS {last}", node.name))
}

/// The other router `name` as `node`'s STATUS lists it.
fn other<'a>(st: &'a Value, name: &str) -> Option<&'a Value> {
    let list = st.pointer("/emq/wal/nats/other_routers/routers")?.as_array()?;
    list.iter().find(|r| r["name"] == name)
}

#[test]
fn one_view_over_two_router_names() {
    let Some(s) = crate::replicated_faults::setup("admin_view", 240) else { return };
    let dir = &s.dir;
    let a = Node::new(dir, s.cluster.urls(), "va", &[]).with_metrics(dir);
    let b = Node::new(dir, s.cluster.urls(), "vb", &[]).with_metrics(dir);
    let mut ra = a.start();
    let mut rb = b.start();
    let script = dir.join("job.sh");
    std::fs::write(&script, SCRIPT).expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let mut workers = [worker(dir, &a, &script), worker(dir, &b, &script)];
    for node in [&a, &b] {
        status_until(node, "the worker serves jobs", |st| {
            st["served_queues"].as_array().is_some_and(|q| q.iter().any(|q| q == "jobs"))
        });
    }
    // On each: one job dead at once, one done; waiting jobs on a queue no
    // worker serves (two on va, one on vb), and one queue of its own.
    for node in [&a, &b] {
        for (body, headers) in [("fail", "retry:0"), ("ok", "")] {
            let (code, out, err) = cli(
                dir,
                &[
                    "--frontend",
                    &node.frontend(),
                    "--admin",
                    &node.admin(),
                    "request",
                    "jobs",
                    body,
                    "--headers",
                    headers,
                ],
            );
            assert_eq!(code, Some(0), "{out}\n{err}");
        }
    }
    let mut text = TextClient::connect(a.text(), Duration::from_secs(5)).expect("text connects to va");
    for q in ["idle", "idle", "only_a"] {
        text.sched(b"x", Some(q)).expect("SCHED");
    }
    text.sync().expect("SCHEDs answered");
    let mut text = TextClient::connect(b.text(), Duration::from_secs(5)).expect("text connects to vb");
    text.sched(b"x", Some("idle")).expect("SCHED");
    text.sync().expect("SCHED answered");
    let sa = status_until(&a, "one job dead", |st| st["dead_messages_by_queue"]["jobs"] == 1);
    let sb = status_until(&b, "one job dead", |st| st["dead_messages_by_queue"]["jobs"] == 1);
    let both = format!("{};{}", a.admin(), b.admin());

    // status: the sum of both STATUSes.
    let sum = cli_json(dir, &["--admin", &both, "status"]);
    assert_eq!(sum["partial"], false, "{sum}");
    let names: Vec<&str> = (0..2).map(|i| sum["owners"][i]["router"].as_str().unwrap_or("-")).collect();
    assert_eq!(names, ["va", "vb"], "{sum}");
    for key in [
        "waiting_messages_by_queue",
        "accepted_messages_by_queue",
        "dead_messages_by_queue",
        "completed_messages_by_queue",
    ] {
        for q in ["jobs", "idle", "only_a"] {
            let n = |v: &Value| v[key][q].as_u64().unwrap_or(0);
            assert_eq!(n(&sum), n(&sa) + n(&sb), "{key}[{q}]: {sum}\nva {sa}\nvb {sb}");
        }
    }
    assert_eq!(sum["waiting_messages_by_queue"]["idle"], 3, "{sum}");
    assert_eq!(sum["dead_messages_by_queue"]["jobs"], 2, "{sum}");
    let counter = |v: &Value| v["emq"]["counters"]["accepted_jobs"].as_u64().unwrap_or(0);
    assert_eq!((counter(&sum), counter(&sa) + counter(&sb)), (8, 8), "{sum}");
    assert_eq!(sum["emq"]["workers"], 2, "{sum}");
    assert!(sum.get("end_to_end_p50_ms_by_queue").is_none(), "percentiles are not summed: {sum}");
    let (code, table, err) = cli(dir, &["--admin", &both, "status"]);
    assert_eq!(code, Some(0), "{table}\n{err}");
    let head = format!("summed STATUS of 2 of 2 router name(s): va ({}), vb ({})\n", a.admin(), b.admin());
    assert!(table.starts_with(&head), "{table}");
    assert!(table.lines().any(|l| l.split_whitespace().take(2).eq(["idle", "3"])), "{table}");

    // --per-router: each apart.
    let each = cli_json(dir, &["--admin", &both, "--per-router", "status"]);
    let admins: Vec<&str> = (0..2).map(|i| each["routers"][i]["admin"].as_str().unwrap_or("-")).collect();
    assert_eq!(admins, [a.admin(), b.admin()], "{each}");
    assert_eq!(each["routers"][1]["owner"], 1, "{each}");
    assert_eq!(each["routers"][1]["status"]["waiting_messages_by_queue"]["idle"], 1, "{each}");
    let each = cli_json(dir, &["--admin", &both, "--per-router", "workers"]);
    assert_eq!(
        (each["routers"][0]["router"].as_str(), each["routers"][1]["router"].as_str()),
        (Some("va"), Some("vb"))
    );

    // workers and dead list: the router column.
    let w = cli_json(dir, &["--admin", &both, "workers"]);
    let routers: Vec<&str> =
        w["workers"].as_array().into_iter().flatten().filter_map(|w| w["router"].as_str()).collect();
    assert_eq!(routers, ["va", "vb"], "{w}");
    let (code, table, err) = cli(dir, &["--admin", &both, "workers"]);
    assert_eq!(code, Some(0), "{err}");
    let header =
        |t: &str, n: usize| t.lines().nth(1).map(|l| l.split_whitespace().take(n).collect::<Vec<_>>().join(" "));
    assert_eq!(header(&table, 3).as_deref(), Some("ROUTER WORKER STATE"), "{table}");
    let rows: Vec<&str> = table.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(rows, ["va", "vb"], "{table}");
    let dead = cli_json(dir, &["--admin", &both, "dead", "list"]);
    let mut routers: Vec<&str> =
        dead["jobs"].as_array().into_iter().flatten().filter_map(|j| j["router"].as_str()).collect();
    routers.sort_unstable();
    assert_eq!((routers, dead["total"].as_u64()), (vec!["va", "vb"], Some(2)), "{dead}");
    let (code, table, _) = cli(dir, &["--admin", &both, "dead", "list"]);
    assert_eq!(code, Some(0));
    assert_eq!(header(&table, 3).as_deref(), Some("ROUTER ID QUEUE"), "{table}");
    assert_eq!(table.lines().last(), Some("(2 dead jobs)"), "{table}");
    let lat = cli_json(dir, &["--admin", &both, "latency"]);
    assert_eq!(lat["routers"].as_array().map(Vec::len), Some(2), "{lat}");
    // A command for one router name refuses two.
    let (code, _, err) = cli(dir, &["--admin", &both, "disconnect"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("this command talks to one router name"), "{err}");

    // STATUS of each lists the other, with its addresses.
    for (node, peer) in [(&a, &b), (&b, &a)] {
        let st = status_until(node, "lists the other router", |st| other(st, &peer.name).is_some());
        let o = other(&st, &peer.name).cloned().unwrap_or_default();
        assert_eq!(o["live"], true, "{o}");
        assert_eq!(o["admin"].as_str(), Some(peer.admin().as_str()), "{o}");
        assert_eq!(o["frontend"].as_str(), Some(peer.frontend().as_str()), "{o}");
        let page = format!("http://{}/", peer.metrics().unwrap_or_default());
        assert_eq!(o["status_page"].as_str(), Some(page.as_str()), "{o}");
        assert_eq!(st["emq"]["router_name"].as_str(), Some(node.name.as_str()), "{st}");
    }

    // /metrics: every series names the router; the status page links the other.
    let ma = a.metrics().unwrap_or_default();
    let metrics = http_get(&ma, "/metrics");
    assert!(metrics.lines().any(|l| l == "emq_up{router=\"va\"} 1"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "emq_jobs_waiting{router=\"va\",queue=\"idle\"} 2"), "{metrics}");
    let unlabelled: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("emq_") && !l.contains("{router=\"va\"")).collect();
    assert!(unlabelled.is_empty(), "series without the router label: {unlabelled:?}");
    let page = http_get(&ma, "/");
    let link = format!("<a href=\"http://{}/\">vb</a>", b.metrics().unwrap_or_default());
    assert!(page.contains(&link) && page.contains("<p id=\"routers\">Router name va; other routers"), "{page}");

    // vb stopped: the view is partial, emq-cli exits 0, and va's STATUS
    // says vb has no lease (a clean stop frees the name at once).
    workers[1].terminate(Duration::from_secs(10));
    rb.terminate(Duration::from_secs(15));
    let part = cli_json(dir, &["--admin", &both, "status"]);
    assert_eq!(part["partial"], true, "{part}");
    assert!(part["owners"][1]["error"].is_string() && part["owners"][0]["error"].is_null(), "{part}");
    assert_eq!(part["waiting_messages_by_queue"]["idle"], 2, "{part}");
    let (code, table, err) = cli(dir, &["--admin", &both, "status"]);
    assert_eq!(code, Some(0), "a partial view exits 0: {table}\n{err}");
    assert!(table.contains(&format!("PARTIAL: owner 1 {} did not answer", b.admin())), "{table}");
    assert!(err.contains("partial view: 1 of 2 router names did not answer"), "{err}");
    let st = status_until(&a, "vb has no lease", |st| other(st, "vb").is_some_and(|o| o["live"] == false));
    assert!(other(&st, "vb").is_some_and(|o| o["admin"].is_null()), "{st}");
    // No router answers: exit status 1.
    ra.terminate(Duration::from_secs(15));
    let (code, _, err) = cli(dir, &["--admin", &both, "status"]);
    assert_eq!(code, Some(1), "{err}");
    workers[0].terminate(Duration::from_secs(10));
}
