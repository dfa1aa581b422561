//! `emq-bench emqp` over two owners (issue 31): two plain emq-routers on
//! fresh ports (durability `memory`, no control groups), the bench given
//! both as `--frontend "a;b" --backend "a;b"`: every job is received
//! exactly once and each owner accepted and completed its round-robin half
//! (their STATUS counters). Owner lists that do not match are refused.

use std::process::Command;
use std::time::Duration;

use crate::common::admin;
use crate::common::proc::{self, TestDir};
use crate::common::router::{Router, RouterKind};
use crate::common::watchdog::Watchdog;

fn counter(router: &Router, name: &str) -> u64 {
    let status = admin::request(&router.admin, "STATUS").unwrap_or_else(|e| panic!("{e}"));
    status["emq"]["counters"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}: {status}"))
}

#[test]
fn bench_spreads_over_two_owners_and_both_serve() {
    let _w = Watchdog::new("bench_spreads_over_two_owners_and_both_serve", 90);
    let (dir_a, dir_b, dir) = (TestDir::new("scaleout-a"), TestDir::new("scaleout-b"), TestDir::new("scaleout-bench"));
    let kind = RouterKind::Rust(crate::common::router::rust_router_bin());
    let a = Router::start_with(&dir_a, kind.clone(), &["--durability", "memory"]);
    let b = Router::start_with(&dir_b, kind, &["--durability", "memory"]);
    let bench = env!("CARGO_BIN_EXE_emq-bench");
    let frontend = format!("{};{}", a.frontend, b.frontend);
    let backend = format!("{};{}", a.backend, b.backend);
    let out_dir = dir.path.to_string_lossy().into_owned();
    let n = 600u64;
    #[rustfmt::skip]
    let args = [
        "emqp", "--frontend", &frontend, "--backend", &backend, "--target-name", "two-owners",
        "--clients", "2", "--workers", "4", "--slots", "2", "--in-flight", "8",
        "--requests", "600", "--warmup", "0s", "--probe-timeout", "5s", "--drain-timeout", "10s",
        "--no-progress", "--out", &out_dir, "--name", "t",
    ];
    let (status, stdout, stderr) =
        proc::run("load", Command::new(bench).args(args), &dir.path, Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "emq-bench emqp: {status:?}\n{stdout}\n{stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("t.json")).expect("t.json written")).expect("t.json parses");
    let r = &json["results"][0];
    for (key, want) in [("sent", n), ("received", n), ("lost", 0), ("duplicates", 0), ("errors", 0), ("accepted", n)] {
        assert_eq!(r[key], want, "{key} in {r}");
    }
    assert_eq!(json["settings"]["frontend"], frontend.as_str(), "the owner list kept as given");
    // Each client alternates its REQUESTs over the two owners: the two
    // halves differ by at most one job per client.
    let (acc_a, acc_b) = (counter(&a, "accepted_jobs"), counter(&b, "accepted_jobs"));
    assert_eq!(acc_a + acc_b, n, "owner a {acc_a} + owner b {acc_b}");
    assert!(acc_a.abs_diff(acc_b) <= 2, "round-robin halves: a {acc_a}, b {acc_b}");
    let (done_a, done_b) = (counter(&a, "completed_jobs"), counter(&b, "completed_jobs"));
    assert_eq!((done_a, done_b), (acc_a, acc_b), "each owner's own workers completed its jobs");

    // Two frontend owners, one backend owner: refused before any load.
    let one_backend = a.backend.clone();
    #[rustfmt::skip]
    let bad = [
        "emqp", "--frontend", &frontend, "--backend", &one_backend, "--requests", "10",
        "--no-progress", "--out", &out_dir, "--name", "bad",
    ];
    let (status, _, stderr) = proc::run("bad", Command::new(bench).args(bad), &dir.path, Duration::from_secs(30));
    assert!(status.is_some_and(|s| !s.success()), "mismatched owners accepted: {status:?}");
    assert!(stderr.contains("2 frontend owners but 1 backend owners"), "{stderr}");
    assert_eq!(counter(&a, "accepted_jobs"), acc_a, "nothing sent by the refused run");
}
