//! Starting the broker under test on fresh loopback ports.
//!
//! Which broker (`EMQ_INTEROP_ROUTER`):
//! * unset or `rust`: the `emq-router` binary of this crate, found as
//!   `$EMQ_ROUTER_BIN`, else cargo's `CARGO_BIN_EXE_emq-router`, else
//!   `target/<profile>/emq-router` next to the test binary;
//! * `python`: the real Python EventMQ 0.3.13 `emq-router` from the interop
//!   venv (to prove the tests against the reference implementation);
//! * anything else: a path to a binary taking `emq-router`'s flags.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::ports::{free_port, is_listening, zmq_endpoint};
use super::proc::{Child, TestDir};
use super::{python, wait};

/// How long a router may take until all its ports accept connections.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Which router implementation a test runs against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterKind {
    /// An `emq-router` binary (flags `--frontend` etc.).
    Rust(PathBuf),
    /// The Python EventMQ 0.3.13 router from the venv.
    Python,
}

impl RouterKind {
    /// The kind chosen by `EMQ_INTEROP_ROUTER` (see the module docs).
    pub fn from_env() -> RouterKind {
        match std::env::var("EMQ_INTEROP_ROUTER").ok().as_deref() {
            None | Some("") | Some("rust") => RouterKind::Rust(rust_router_bin()),
            Some("python") => RouterKind::Python,
            Some(path) => RouterKind::Rust(PathBuf::from(path)),
        }
    }
}

/// The crate's `emq-router` binary (see the module docs for the search order).
pub fn rust_router_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("EMQ_ROUTER_BIN") {
        return PathBuf::from(path);
    }
    if let Some(path) = option_env!("CARGO_BIN_EXE_emq-router") {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/tests-<hash> → target/<profile>/emq-router
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("test binary is in target/<profile>/deps");
    profile_dir.join("emq-router")
}

/// A running router and its addresses; killed (with its process group) on drop.
pub struct Router {
    /// Which implementation this is.
    pub kind: RouterKind,
    /// eMQP frontend (clients, schedulers), `tcp://127.0.0.1:P`.
    pub frontend: String,
    /// eMQP backend (workers).
    pub backend: String,
    /// Admin socket (emq-cli).
    pub admin: String,
    /// Text protocol `127.0.0.1:P` (`None` for the Python router).
    pub text: Option<String>,
    /// The metrics HTTP server, `127.0.0.1:P` (`None` for the Python router).
    pub metrics: Option<String>,
    /// The process.
    pub child: Child,
}

impl Router {
    /// Starts the router chosen by [`RouterKind::from_env`] on fresh ports
    /// and waits until its frontend, backend and admin ports accept TCP
    /// connections. Panics (with the
    /// router's log) if it does not come up within [`START_TIMEOUT`].
    pub fn start(dir: &TestDir) -> Router {
        Router::start_kind(dir, RouterKind::from_env())
    }

    /// Like [`Router::start`] for a given kind.
    pub fn start_kind(dir: &TestDir, kind: RouterKind) -> Router {
        Router::start_with(dir, kind, &[])
    }

    /// Like [`Router::start_kind`], with `extra` flags after the addresses
    /// (a Rust router only: the Python router takes none).
    pub fn start_with(dir: &TestDir, kind: RouterKind, extra: &[&str]) -> Router {
        Router::start_with_output(dir, kind, extra, None)
    }

    /// Like [`Router::start_with`], with the router's stdout and stderr
    /// going to `output` (both) instead of `router.log` when given.
    pub fn start_with_output(
        dir: &TestDir,
        kind: RouterKind,
        extra: &[&str],
        output: Option<std::io::PipeWriter>,
    ) -> Router {
        let (fp, bp, ap) = (free_port(), free_port(), free_port());
        let (frontend, backend, admin) = (zmq_endpoint(fp), zmq_endpoint(bp), zmq_endpoint(ap));
        // Only the eMQP ports are waited for; see [`Router::wait_text`].
        let ports = [fp, bp, ap];
        let (mut cmd, text, metrics) = match &kind {
            RouterKind::Python => {
                assert!(extra.is_empty(), "the Python router takes no flags: {extra:?}");
                (python_cmd(dir, &frontend, &backend, &admin), None, None)
            }
            RouterKind::Rust(bin) => {
                assert!(
                    bin.is_file(),
                    "router binary {} does not exist (build it: cargo build --bin emq-router; or set \
                     EMQ_ROUTER_BIN, or EMQ_INTEROP_ROUTER=python to test the Python router)",
                    bin.display()
                );
                let tp = free_port();
                let text = format!("127.0.0.1:{tp}");
                let metrics = format!("127.0.0.1:{}", free_port());
                let mut cmd = rust_cmd(bin, &frontend, &backend, &admin, &text, &metrics);
                cmd.arg("--data-dir").arg(dir.join("router-data")).args(extra);
                (cmd, Some(text), Some(metrics))
            }
        };
        let log = dir.join("router.log");
        let mut child = match output {
            None => Child::spawn("router", &mut cmd, &log),
            Some(out) => {
                let err = out.try_clone().expect("clone the output pipe");
                Child::spawn_keeping_output("router", cmd.stdout(out).stderr(err), &log)
            }
        };
        let up = wait::until(START_TIMEOUT, || !child.is_alive() || ports.iter().all(|&p| is_listening(p)));
        assert!(
            up && child.is_alive(),
            "router {kind:?} did not listen on ports {ports:?} within {START_TIMEOUT:?} (exit status {:?})\n{}",
            child.exit_status(),
            child.log_tail(40)
        );
        Router { kind, frontend, backend, admin, text, metrics, child }
    }

    /// Waits until the text protocol port accepts connections; panics after
    /// [`START_TIMEOUT`] or for the Python router (it has none).
    pub fn wait_text(&mut self) -> String {
        let text = self.text.clone().expect("the Python router has no text protocol");
        let port: u16 = text.rsplit(':').next().and_then(|p| p.parse().ok()).expect("text address has a port");
        let up = wait::until(START_TIMEOUT, || !self.child.is_alive() || is_listening(port));
        assert!(up && self.child.is_alive(), "router text port {text} not listening\n{}", self.child.log_tail(40));
        text
    }

    /// True when this is the Python reference router.
    pub fn is_python(&self) -> bool {
        self.kind == RouterKind::Python
    }
}

fn rust_cmd(bin: &PathBuf, frontend: &str, backend: &str, admin: &str, text: &str, metrics: &str) -> Command {
    let mut cmd = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["--frontend", frontend, "--backend", backend, "--admin", admin, "--text", text]);
    cmd.args(["--metrics", metrics]);
    // EventMQ's unknown-queue rule from the first second, as the tests
    // that compare with it expect (a test's own flag still wins).
    cmd.env("EMQ_QUEUE_LEARN_GRACE", "0s");
    cmd
}

fn python_cmd(dir: &TestDir, frontend: &str, backend: &str, admin: &str) -> Command {
    let mut cmd = python::venv_cmd("emq-router");
    cmd.env("EVENTMQ_FRONTEND_ADDR", frontend)
        .env("EVENTMQ_BACKEND_ADDR", backend)
        .env("EVENTMQ_ADMINISTRATIVE_ADDR", admin)
        // the Python router creates the WAL's directory even with the WAL off
        .env("EVENTMQ_WAL", dir.join("wal").join("wal.log"));
    cmd
}
