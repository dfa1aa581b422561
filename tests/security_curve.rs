//! CURVE endpoints (ZeroMQ RFC 26) with the router's ZAP handler (RFC 27),
//! against real emq-router, emq-worker and emq-cli processes; keys are made
//! at test time (docs/security.md "CURVE").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use emq::client::emqp::{Client, Outcome};
use emq::curve::{read_secret_key_file, write_key_pair};
use serde_json::Value;

use crate::common::admin::request;
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::refusals;
use crate::common::router::rust_router_bin;
use crate::common::{wait, watchdog};

/// A router with CURVE endpoints and the key directories of a test.
#[allow(dead_code)]
struct Setup {
    dir: TestDir,
    frontend: String,
    admin: String,
    backend_curve: String,
    frontend_curve: String,
    admin_curve: String,
    /// The HTTP port (`/metrics`, the status page).
    metrics: u16,
    router: Child,
}

/// `dir/keys/<sub>/NAME.key{,_secret}`, made with the library.
fn keygen(dir: &TestDir, sub: &str, name: &str) -> PathBuf {
    let d = dir.join("keys").join(sub);
    std::fs::create_dir_all(&d).unwrap();
    write_key_pair(&d, name).unwrap().1
}

/// The public `.key` next to a `.key_secret`.
fn public(secret: &Path) -> PathBuf {
    secret.with_extension("key")
}

/// Moves `NAME.key` of `sub` into its allow-list directory `allowed/<sub>`.
fn allow(dir: &TestDir, sub: &str, secret: &Path) {
    let d = dir.join("allowed").join(sub);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(public(secret), d.join(public(secret).file_name().unwrap())).unwrap();
}

impl Setup {
    /// Keys for the router, one allowed worker (`w1`), client (`c1`) and
    /// admin (`a1`); the router started with every CURVE endpoint.
    fn start(name: &str, env: &[(&str, &str)]) -> (Setup, Keys) {
        let dir = TestDir::new(name);
        let keys = Keys {
            router: keygen(&dir, "router", "router"),
            worker: keygen(&dir, "workers", "w1"),
            client: keygen(&dir, "clients", "c1"),
            admin: keygen(&dir, "admins", "a1"),
            stranger: keygen(&dir, "strangers", "x1"),
        };
        allow(&dir, "workers", &keys.worker);
        allow(&dir, "clients", &keys.client);
        allow(&dir, "admins", &keys.admin);
        let setup = Setup::start_router(dir, &keys.router, env, &[]).unwrap_or_else(|log| panic!("{log}"));
        (setup, keys)
    }

    /// Starts emq-router with CURVE endpoints; `Err(its log)` when it exits.
    fn start_router(dir: TestDir, router_key: &Path, env: &[(&str, &str)], extra: &[&str]) -> Result<Setup, String> {
        let ports: Vec<u16> = (0..7).map(|_| free_port()).collect();
        let e: Vec<String> = ports.iter().map(|p| zmq_endpoint(*p)).collect();
        let mut cmd = Command::new(rust_router_bin());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("EMQ_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(["--frontend", &e[0], "--backend", &e[1], "--admin", &e[2], "--text", "off"])
            .arg("--metrics")
            .arg(format!("127.0.0.1:{}", ports[6]))
            .args(["--frontend-curve", &e[3], "--backend-curve", &e[4], "--admin-curve", &e[5]])
            .arg("--curve-secret-key-file")
            .arg(router_key)
            .arg("--curve-clients-dir")
            .arg(dir.join("allowed/clients"))
            .arg("--curve-workers-dir")
            .arg(dir.join("allowed/workers"))
            .arg("--curve-admins-dir")
            .arg(dir.join("allowed/admins"))
            .args(["--durability", "memory"])
            .args(extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        for sub in ["clients", "workers", "admins"] {
            std::fs::create_dir_all(dir.join("allowed").join(sub)).unwrap();
        }
        let mut router = Child::spawn("router", &mut cmd, &dir.join("router.log"));
        let up = wait::until(Duration::from_secs(30), || !router.is_alive() || ports.iter().all(|&p| is_listening(p)));
        if !up || !router.is_alive() {
            let _ = router.exit_status();
            return Err(router.log_text());
        }
        Ok(Setup {
            frontend: e[0].clone(),
            admin: e[2].clone(),
            frontend_curve: e[3].clone(),
            backend_curve: e[4].clone(),
            admin_curve: e[5].clone(),
            metrics: ports[6],
            dir,
            router,
        })
    }

    fn status(&self) -> Value {
        request(&self.admin, "STATUS").unwrap_or_else(|e| panic!("{e}\n{}", self.router.log_tail(30)))
    }

    /// The body of an HTTP GET of `path` on the router's metrics port.
    fn http(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics)).expect("metrics port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("an HTTP answer");
        answer
    }

    /// A handshake count of `socket` from STATUS.
    fn handshakes(&self, socket: &str, outcome: &str) -> u64 {
        self.status()["emq"]["curve"]["sockets"][socket]["handshakes"][outcome].as_u64().unwrap_or(0)
    }

    /// Waits until a handshake count of `socket` reaches `n`.
    fn wait_handshakes(&self, socket: &str, outcome: &str, n: u64) {
        let ok = wait::until(Duration::from_secs(30), || self.handshakes(socket, outcome) >= n);
        assert!(ok, "{socket} {outcome} handshakes: {} < {n}\n{}", self.handshakes(socket, outcome), self.status());
    }

    /// Jobs waiting in `queue` (STATUS).
    #[allow(dead_code)]
    fn waiting(&self, queue: &str) -> u64 {
        self.status()["queues"][queue]["jobs_waiting"]
            .as_u64()
            .or_else(|| self.status()["queues"][queue]["waiting"].as_u64())
            .unwrap_or(0)
    }

    /// Schedules one job on the plain frontend.
    fn schedule(&self, body: &str) {
        let mut c = Client::connect(&self.frontend).unwrap().with_timeout(Duration::from_secs(5));
        let outcome = c.request("default", "", body.as_bytes()).unwrap();
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{outcome:?}");
    }

    /// An emq-worker on `backend` with `key` and `server_key`.
    fn worker(&self, name: &str, backend: &str, key: Option<&Path>, server_key: Option<&Path>) -> Child {
        let out = self.dir.join("runs.txt");
        let script = self.dir.join("job.sh");
        if !script.exists() {
            std::fs::write(&script, "#!/bin/sh\np=$(cat)\nprintf '%s\\n' \"$p\" >> \"$OUT\"\necho ok\n").unwrap();
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-worker"));
        cmd.args(["-B", backend, "-Q", "default", "--stats-interval", "0s"]).env("OUT", &out);
        if let Some(k) = key {
            cmd.arg("--curve-key-file").arg(k);
        }
        if let Some(k) = server_key {
            cmd.arg("--curve-server-key").arg(k);
        }
        cmd.arg("--").arg(&script);
        Child::spawn(name, &mut cmd, &self.dir.join(&format!("{name}.log")))
    }

    /// Lines the job script wrote.
    fn runs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("runs.txt")).unwrap_or_default().lines().map(String::from).collect()
    }

    /// Waits until `body` ran.
    fn wait_ran(&self, body: &str) {
        let ok = wait::until(Duration::from_secs(20), || self.runs().iter().any(|l| l == body));
        assert!(ok, "{body} did not run: {:?}\n{}", self.runs(), self.router.log_tail(30));
    }
}

/// The test's key files (each the `.key_secret`; its `.key` is next to it).
struct Keys {
    router: PathBuf,
    worker: PathBuf,
    client: PathBuf,
    admin: PathBuf,
    stranger: PathBuf,
}

#[test]
fn curve_backend_worker_with_the_right_key_runs_a_job() {
    let _w = watchdog::start("curve_backend_ok", Duration::from_secs(90));
    let (s, keys) = Setup::start("curve-backend-ok", &[]);
    let mut worker = s.worker("w1", &s.backend_curve, Some(&keys.worker), Some(&public(&keys.router)));
    s.schedule("job-1");
    s.wait_ran("job-1");
    s.wait_handshakes("backend", "ok", 1);
    let st = s.status();
    assert_eq!(st["emq"]["curve"]["zap_requests"]["backend"]["200"], 1, "{st}");
    assert!(read_secret_key_file(&keys.worker).is_ok());
    worker.terminate(Duration::from_secs(10));
}

/// Runs emq-cli with `args`; `(success, stdout, stderr)`.
fn cli(s: &Setup, args: &[&str], key: Option<&Path>, server_key: Option<&Path>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("EMQ_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(["--timeout", "3s"]);
    if let Some(k) = key {
        cmd.arg("--curve-key-file").arg(k);
    }
    if let Some(k) = server_key {
        cmd.arg("--curve-server-key").arg(k);
    }
    cmd.args(args);
    let (status, out, err) = crate::common::proc::run("emq-cli", &mut cmd, &s.dir.path, Duration::from_secs(20));
    (status.is_some_and(|s| s.success()), out, err)
}

impl Setup {
    /// Jobs waiting in `default` (STATUS `waiting_messages_by_queue`).
    fn default_waiting(&self) -> u64 {
        self.status()["waiting_messages_by_queue"]["default"].as_u64().unwrap_or(0)
    }

    /// Workers registered (STATUS `connected_workers`).
    fn workers(&self) -> usize {
        request(&self.admin, "ROUTER_SHOW_WORKERS").unwrap()["connected_workers"].as_object().map_or(0, |m| m.len())
    }
}

#[test]
fn curve_backend_refuses_wrong_keys_and_counts_each_outcome() {
    let _w = watchdog::start("curve_backend_refusals", Duration::from_secs(120));
    let (s, keys) = Setup::start("curve-backend-refusals", &[]);
    s.schedule("held");
    let router_pub = public(&keys.router);
    let mut unknown = s.worker("unknown", &s.backend_curve, Some(&keys.stranger), Some(&router_pub));
    s.wait_handshakes("backend", "unknown_key", 1);
    let mut wrong_server =
        s.worker("wrong-server", &s.backend_curve, Some(&keys.worker), Some(&public(&keys.stranger)));
    s.wait_handshakes("backend", "bad_server_key_or_protocol", 1);
    // A plain peer counts `mechanism_mismatch`, or `no_detail` when it saw
    // the mismatch first (a libzmq race, `refusals::four`).
    let plain_count = || s.handshakes("backend", "mechanism_mismatch") + s.handshakes("backend", "no_detail");
    let before = plain_count();
    let mut plain = s.worker("plain", &s.backend_curve, None, None);
    assert!(wait::until(Duration::from_secs(30), || plain_count() > before), "{}", s.status());
    let before = s.handshakes("backend", "unknown_key");
    let mut client_key = s.worker("client-key", &s.backend_curve, Some(&keys.client), Some(&router_pub));
    let mut admin_key = s.worker("admin-key", &s.backend_curve, Some(&keys.admin), Some(&router_pub));
    s.wait_handshakes("backend", "unknown_key", before + 2);
    // Nothing reached the broker: no worker, the job still waits.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((s.workers(), s.default_waiting(), s.runs().len()), (0, 1, 0), "{}", s.status());
    assert_eq!(s.handshakes("backend", "ok"), 0);
    let st = s.status();
    assert!(st["emq"]["curve"]["zap_requests"]["backend"]["400"].as_u64().unwrap_or(0) >= 3, "{st}");
    assert!(s.router.log_text().contains("CURVE peer refused by ZAP"), "{}", s.router.log_tail(20));
    // The same counts in /metrics (read after STATUS, and the refused
    // peers keep retrying: at least STATUS's) and on the status page.
    let st = s.status();
    let metrics = s.http("/metrics");
    let value = |prefix: String| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{prefix} in\n{metrics}"));
        line[prefix.len()..].trim().parse().unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    for outcome in ["unknown_key", "bad_server_key_or_protocol", "mechanism_mismatch", "no_detail"] {
        let n = st["emq"]["curve"]["sockets"]["backend"]["handshakes"][outcome].as_u64().unwrap();
        let got =
            value(format!("emq_curve_handshakes_total{{router=\"emq\",socket=\"backend\",result=\"{outcome}\"}} "));
        let seen = n >= 1 || outcome == "mechanism_mismatch" || outcome == "no_detail";
        assert!(seen && got >= n, "{outcome}: /metrics {got}, STATUS {n}");
    }
    let refused = st["emq"]["curve"]["zap_requests"]["backend"]["400"].as_u64().unwrap();
    let got = value("emq_zap_requests_total{router=\"emq\",domain=\"backend\",status=\"400\"} ".to_string());
    assert!(got >= refused, "ZAP 400: /metrics {got}, STATUS {refused}");
    let page = s.http("/");
    assert!(page.contains("<p id=\"curve\">CURVE handshakes: ") && page.contains("backend 0 ok, "), "{page}");
    for w in [&mut unknown, &mut wrong_server, &mut plain, &mut client_key, &mut admin_key] {
        w.kill_group();
    }
}

#[test]
fn curve_admin_and_frontend_take_their_own_keys_only() {
    let _w = watchdog::start("curve_admin_frontend", Duration::from_secs(120));
    let (s, keys) = Setup::start("curve-admin-frontend", &[]);
    let router_pub = public(&keys.router);
    let (ok, out, err) =
        cli(&s, &["--admin", &s.admin_curve, "--json", "status"], Some(&keys.admin), Some(&router_pub));
    assert!(ok, "admin key over admin_curve: {out}\n{err}");
    s.wait_handshakes("admin", "ok", 1);
    let (ok, out, err) = cli(&s, &["--admin", &s.admin_curve, "status"], Some(&keys.worker), Some(&router_pub));
    assert!(!ok, "a workers key over admin_curve was let in: {out}\n{err}");
    s.wait_handshakes("admin", "unknown_key", 1);
    let args = ["--frontend", &s.frontend_curve, "request", "default", "from-curve"];
    let (ok, out, err) = cli(&s, &args, Some(&keys.client), Some(&router_pub));
    assert!(ok, "client key over frontend_curve: {out}\n{err}");
    s.wait_handshakes("frontend", "ok", 1);
    assert_eq!(s.default_waiting(), 1, "{}", s.status());
}

#[test]
fn curve_frontend_refuses_wrong_keys_accepts_nothing_and_counts_each_outcome() {
    let _w = watchdog::start("curve_frontend_refusals", Duration::from_secs(150));
    let (s, keys) = Setup::start("curve-frontend-refusals", &[]);
    s.schedule("held");
    let router_pub = public(&keys.router);
    let cases = refusals::four(&keys.client, &router_pub, &keys.stranger, &keys.worker);
    let attempt = |case: &refusals::Refusal| {
        let body = format!("refused-{}", case.name);
        let args = ["--frontend", &s.frontend_curve, "request", "default", &body];
        let (ok, out, err) = cli(&s, &args, case.key.as_deref(), case.server.as_deref());
        assert!(!out.contains("accepted"), "{}: {out}\n{err}", case.name);
        ok
    };
    refusals::check(&cases, attempt, |outcome| s.handshakes("frontend", outcome));
    // Nothing reached the broker: the job held before is still the only one.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((s.default_waiting(), s.handshakes("frontend", "ok")), (1, 0), "{}", s.status());
    let st = s.status();
    assert!(st["emq"]["curve"]["zap_requests"]["frontend"]["400"].as_u64().unwrap_or(0) >= 2, "{st}");
    assert!(st["emq"]["curve"]["zap_requests"]["frontend"]["200"].is_null(), "{st}");
    // The right key works.
    let args = ["--frontend", &s.frontend_curve, "request", "default", "allowed"];
    let (ok, out, err) = cli(&s, &args, Some(&keys.client), Some(&router_pub));
    assert!(ok, "client key over frontend_curve: {out}\n{err}");
    s.wait_handshakes("frontend", "ok", 1);
    assert_eq!(s.default_waiting(), 2, "{}", s.status());
}

#[test]
fn curve_admin_refuses_wrong_keys_with_no_effect_and_counts_each_outcome() {
    let _w = watchdog::start("curve_admin_refusals", Duration::from_secs(150));
    let (s, keys) = Setup::start("curve-admin-refusals", &[]);
    let router_pub = public(&keys.router);
    let reloads = || s.status()["emq"]["curve"]["reloads"].as_u64();
    assert_eq!(reloads(), Some(0));
    // RELOAD_KEYS changes state (the reload count): refused, it has none.
    let cases = refusals::four(&keys.admin, &router_pub, &keys.stranger, &keys.client);
    let attempt = |case: &refusals::Refusal| {
        let args = ["--admin", &s.admin_curve, "--json", "reload-keys"];
        let (ok, out, err) = cli(&s, &args, case.key.as_deref(), case.server.as_deref());
        assert!(!out.contains("reloaded"), "{}: {out}\n{err}", case.name);
        ok
    };
    refusals::check(&cases, attempt, |outcome| s.handshakes("admin", outcome));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((reloads(), s.handshakes("admin", "ok")), (Some(0), 0), "{}", s.status());
    let st = s.status();
    assert!(st["emq"]["curve"]["zap_requests"]["admin"]["400"].as_u64().unwrap_or(0) >= 2, "{st}");
    // The right key works, and its RELOAD_KEYS takes effect.
    let (ok, out, err) =
        cli(&s, &["--admin", &s.admin_curve, "--json", "reload-keys"], Some(&keys.admin), Some(&router_pub));
    assert!(ok && out.contains("\"reloaded\":true"), "{out}\n{err}");
    s.wait_handshakes("admin", "ok", 1);
    assert_eq!(reloads(), Some(1));
}

#[test]
fn curve_without_a_zap_handler_fails_closed() {
    let _w = watchdog::start("curve_fail_closed", Duration::from_secs(90));
    let (s, keys) = Setup::start("curve-fail-closed", &[("EMQ_TEST_NO_ZAP", "1")]);
    s.schedule("held");
    let mut w = s.worker("w1", &s.backend_curve, Some(&keys.worker), Some(&public(&keys.router)));
    s.wait_handshakes("backend", "no_detail", 1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((s.workers(), s.default_waiting(), s.handshakes("backend", "ok")), (0, 1, 0));
    w.kill_group();
}

#[test]
fn curve_revocation_by_reload_and_by_disconnect() {
    let _w = watchdog::start("curve_revocation", Duration::from_secs(150));
    let (s, keys) = Setup::start("curve-revocation", &[]);
    let router_pub = public(&keys.router);
    let mut live = s.worker("live", &s.backend_curve, Some(&keys.worker), Some(&router_pub));
    s.schedule("before");
    s.wait_ran("before");
    std::fs::remove_file(s.dir.join("allowed/workers/w1.key")).unwrap();
    let (ok, out, err) = cli(&s, &["--admin", &s.admin, "--json", "reload-keys"], None, None);
    assert!(ok && out.contains("\"reloaded\":true"), "{out}\n{err}");
    let mut again = s.worker("again", &s.backend_curve, Some(&keys.worker), Some(&router_pub));
    s.wait_handshakes("backend", "unknown_key", 1);
    again.kill_group();
    s.schedule("still-live");
    s.wait_ran("still-live");
    let refused = s.handshakes("backend", "unknown_key");
    let (ok, out, err) = cli(&s, &["--admin", &s.admin, "reload-keys", "--disconnect"], None, None);
    assert!(ok, "{out}\n{err}");
    // The live worker is cut and refused when it reconnects.
    s.wait_handshakes("backend", "unknown_key", refused + 1);
    let gone = wait::until(Duration::from_secs(20), || s.workers() == 0);
    assert!(gone, "the revoked worker is still registered: {}", s.status());
    s.schedule("after");
    std::thread::sleep(Duration::from_secs(1));
    assert!(!s.runs().contains(&"after".to_string()), "{:?}", s.runs());
    assert_eq!(s.default_waiting(), 1);
    live.kill_group();
}

#[test]
fn curve_secret_key_readable_by_others_is_refused_at_start() {
    let _w = watchdog::start("curve_key_mode", Duration::from_secs(60));
    let dir = TestDir::new("curve-key-mode");
    let key = keygen(&dir, "router", "router");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let Err(log) = Setup::start_router(dir, &key, &[], &[]) else { panic!("the router started") };
    assert!(log.contains("router.key_secret: secret key file has mode 0644"), "{log}");
}
