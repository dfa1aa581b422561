//! CURVE endpoints (ZeroMQ RFC 26) with the router's ZAP handler (RFC 27),
//! against real emq-router, emq-worker and emq-cli processes; keys are made
//! at test time (docs/security.md "CURVE").

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use emq::client::emqp::{Client, Outcome};
use emq::zmq_io::curve::{read_secret_key_file, write_key_pair};
use serde_json::Value;

use crate::common::admin::request;
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
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
        let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        let e: Vec<String> = ports.iter().map(|p| zmq_endpoint(*p)).collect();
        let mut cmd = Command::new(rust_router_bin());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("EMQ_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(["--frontend", &e[0], "--backend", &e[1], "--admin", &e[2], "--text", "off", "--metrics", "off"])
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
            dir,
            router,
        })
    }

    fn status(&self) -> Value {
        request(&self.admin, "STATUS").unwrap_or_else(|e| panic!("{e}\n{}", self.router.log_tail(30)))
    }

    /// A handshake count of `socket` from STATUS.
    fn handshakes(&self, socket: &str, outcome: &str) -> u64 {
        self.status()["emq"]["curve"]["sockets"][socket]["handshakes"][outcome].as_u64().unwrap_or(0)
    }

    /// Waits until a handshake count of `socket` reaches `n`.
    fn wait_handshakes(&self, socket: &str, outcome: &str, n: u64) {
        let ok = wait::until(Duration::from_secs(15), || self.handshakes(socket, outcome) >= n);
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
    #[allow(dead_code)]
    client: PathBuf,
    #[allow(dead_code)]
    admin: PathBuf,
    #[allow(dead_code)]
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
