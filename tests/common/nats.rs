//! A 3-node nats-server cluster with JetStream on loopback, for the tests of
//! the replicated job log (issue 27).
//!
//! [`server_or_skip`] finds the binary: `$EMQ_NATS_SERVER`, else the venv
//! that `tests/nats/setup.sh` fills (`$EMQ_NATS_VENV` or
//! `<project>/.venv-nats`, nats-server 2.15.1 pinned by version and hash),
//! else `nats-server` on `PATH`; it must be 2.10 or newer (`sync_interval`).
//! Where there is none the test prints one line saying why it skips; under
//! CI (`CI=true`, where `.ci/run` installs it) it fails instead.
//!
//! [`Cluster::start`] writes one config per node into the test's
//! [`TestDir`] (fresh client, cluster and monitoring ports, its own store
//! directory, JetStream with `sync_interval: always`), starts the three
//! servers as [`Child`]ren (their own process groups, killed by PID on drop
//! and by the watchdog) and waits, bounded, until every node is healthy and
//! all agree on a JetStream meta leader. A node can be killed (`kill -9`),
//! stopped (SIGTERM) and started again by index, on the same ports and
//! store. Dropping the cluster kills every node and removes the store
//! directories, also when the test panics (the logs stay in the test dir,
//! which keeps them when the test failed).
//!
//! One cluster at a time in this test binary: [`Cluster::start`] takes a
//! lock held until the cluster is dropped (three servers and their
//! elections share two cores with the rest of the suite).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ports::free_port;
use super::proc::{Child, TestDir};
use super::wait;

/// Nodes in a cluster (R3 needs three).
pub const NODES: usize = 3;

/// How long a cluster (or a restarted node) may take to be ready: healthy
/// and agreeing on a meta leader. Generous: CI shares two cores.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stopped node may take to exit before it is SIGKILLed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The oldest nats-server with `sync_interval` (upstream e7e8a330d).
const MIN_VERSION: (u32, u32) = (2, 10);

/// Connect, read and write timeout of one monitoring request.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// The name of the cluster (`cluster.name` in each config).
pub const CLUSTER_NAME: &str = "emqtest";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the one-cluster-at-a-time lock of [`Cluster::start`] for a test
/// that runs its own servers (tests/nemesis.rs: three servers in network
/// namespaces), so they do not share the two cores with another cluster.
pub fn exclusive() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where `tests/nats/setup.sh` puts the binary.
pub fn venv_server() -> PathBuf {
    let venv =
        std::env::var_os("EMQ_NATS_VENV").map(PathBuf::from).unwrap_or_else(|| project_root().join(".venv-nats"));
    venv.join("bin").join("nats-server")
}

/// `nats-server` on `PATH`, if any.
fn on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("nats-server")).find(|p| p.is_file())
}

/// The version `bin --version` prints (`nats-server: v2.15.1`), as
/// (major, minor, patch).
fn version_of(bin: &Path) -> Result<(u32, u32, u32), String> {
    let out = Command::new(bin).arg("--version").output().map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let word = text.split_whitespace().find(|w| w.starts_with('v')).unwrap_or("");
    let mut parts = word.trim_start_matches('v').split(['.', '-']).map(|p| p.parse::<u32>());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Ok((a, b, c)),
        _ => Err(format!("{} --version printed {:?}, not a version", bin.display(), text.trim())),
    }
}

/// The nats-server to run, or why there is none usable.
pub fn find_server() -> Result<PathBuf, String> {
    let (bin, from) = if let Some(bin) = std::env::var_os("EMQ_NATS_SERVER") {
        (PathBuf::from(bin), "EMQ_NATS_SERVER")
    } else if venv_server().is_file() {
        (venv_server(), "tests/nats/setup.sh's venv")
    } else if let Some(bin) = on_path() {
        (bin, "PATH")
    } else {
        return Err(format!(
            "no nats-server (EMQ_NATS_SERVER unset, none at {}, none on PATH): run `bash tests/nats/setup.sh`",
            venv_server().display()
        ));
    };
    let (major, minor, patch) = version_of(&bin)?;
    if (major, minor) < MIN_VERSION {
        return Err(format!(
            "{} (from {from}) is nats-server {major}.{minor}.{patch}, older than {}.{} (no sync_interval): \
             run `bash tests/nats/setup.sh`",
            bin.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        ));
    }
    Ok(bin)
}

/// The nats-server for `test`, or `None` after one line saying why the test
/// skips. Under CI (`CI=true`) a missing binary fails the test instead:
/// `.ci/run` installs it, and CI must not skip these tests.
pub fn server_or_skip(test: &str) -> Option<PathBuf> {
    match find_server() {
        Ok(bin) => Some(bin),
        Err(why) => {
            assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{test} needs nats-server under CI: {why}");
            eprintln!("skipped: {test} needs nats-server >= 2.10: {why}");
            None
        }
    }
}

/// One server of the cluster.
pub struct Node {
    /// Its `server_name` (`n1`, `n2`, `n3`), as JetStream reports leaders.
    pub name: String,
    /// Client port (`nats://127.0.0.1:<port>`).
    pub client_port: u16,
    /// Route port between the servers.
    pub cluster_port: u16,
    /// Monitoring (HTTP) port: `/healthz`, `/jsz`, `/varz`.
    pub http_port: u16,
    /// Its JetStream store directory.
    pub store: PathBuf,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// `nats://127.0.0.1:<client port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.client_port)
    }
}

/// Three nats-servers with JetStream, routed to one another (see the
/// module docs).
pub struct Cluster {
    /// The nodes, index 0..[`NODES`].
    pub nodes: Vec<Node>,
    bin: PathBuf,
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// The config of node `i` (0-based) of `nodes`, then `extra` (more
/// top-level settings: `tls {...}`, `authorization {...}`).
fn config(i: usize, nodes: &[Node], extra: &str) -> String {
    let me = &nodes[i];
    let routes: Vec<String> = nodes.iter().map(|n| format!("nats-route://127.0.0.1:{}", n.cluster_port)).collect();
    format!(
        "server_name: {name}\n\
         listen: 127.0.0.1:{client}\n\
         http: 127.0.0.1:{http}\n\
         jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n  sync_interval: always\n}}\n\
         cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{cluster}\n  routes: [ {routes} ]\n}}\n{extra}",
        name = me.name,
        client = me.client_port,
        http = me.http_port,
        store = me.store.display(),
        cluster = me.cluster_port,
        routes = routes.join(", "),
    )
}

impl Cluster {
    /// Starts three servers with `bin` (from [`server_or_skip`]), their
    /// configs, logs and stores under `dir`, and waits until the cluster is
    /// ready ([`Cluster::wait_ready`]). Panics, with the servers' log tails,
    /// when it is not within [`READY_TIMEOUT`].
    pub fn start(bin: &Path, dir: &TestDir) -> Cluster {
        Cluster::start_with(bin, dir, "")
    }

    /// [`Cluster::start`] with `extra` appended to every node's config
    /// (client TLS and authorization, say: the monitoring port, which the
    /// readiness wait uses, stays plain HTTP).
    pub fn start_with(bin: &Path, dir: &TestDir, extra: &str) -> Cluster {
        let lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let nodes: Vec<Node> = (1..=NODES)
            .map(|n| Node {
                name: format!("n{n}"),
                client_port: free_port(),
                cluster_port: free_port(),
                http_port: free_port(),
                store: dir.join(&format!("nats-n{n}-store")),
                conf: dir.join(&format!("nats-n{n}.conf")),
                log: dir.join(&format!("nats-n{n}.log")),
                child: None,
            })
            .collect();
        for i in 0..NODES {
            std::fs::create_dir_all(&nodes[i].store).expect("create a nats store dir");
            std::fs::write(&nodes[i].conf, config(i, &nodes, extra)).expect("write a nats config");
        }
        let mut cluster = Cluster { nodes, bin: bin.to_path_buf(), _one_at_a_time: lock };
        for i in 0..NODES {
            cluster.spawn(i);
        }
        if let Err(why) = cluster.wait_ready(READY_TIMEOUT) {
            panic!("the nats cluster did not form: {why}\n{}", cluster.log_tails(20));
        }
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut cmd = Command::new(&self.bin);
        cmd.arg("-c").arg(&node.conf);
        node.child = Some(Child::spawn(&format!("nats-{}", node.name), &mut cmd, &node.log));
    }

    /// The client URLs of every node (running or not), for a client that
    /// should fail over between them.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The index of the node named `name` (`n1` → 0).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// True while node `i` runs.
    pub fn is_running(&mut self, i: usize) -> bool {
        self.nodes[i].child.as_mut().is_some_and(Child::is_alive)
    }

    /// The PID of node `i` while it runs.
    pub fn pid(&mut self, i: usize) -> Option<i32> {
        if self.is_running(i) {
            self.nodes[i].child.as_ref().map(Child::pid)
        } else {
            None
        }
    }

    /// `kill -9` of node `i` (and its process group); returns once reaped.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            child.kill_group();
        }
    }

    /// SIGTERM to node `i` (a clean shutdown), SIGKILL after [`STOP_GRACE`];
    /// returns once it is gone.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            child.terminate(STOP_GRACE);
        }
    }

    /// Starts node `i` again (same ports, config and store) after
    /// [`Cluster::kill`] or [`Cluster::stop`]; does not wait for it (see
    /// [`Cluster::wait_ready`]). Panics if it still runs.
    pub fn restart(&mut self, i: usize) {
        assert!(!self.is_running(i), "nats node {} is still running", self.nodes[i].name);
        self.spawn(i);
    }

    /// GET `path` (e.g. `/jsz?streams=true`) from node `i`'s monitoring
    /// port, parsed as JSON.
    pub fn monitor(&self, i: usize, path: &str) -> Result<serde_json::Value, String> {
        let node = &self.nodes[i];
        let body = http_get(node.http_port, path).map_err(|e| format!("{} GET {path}: {e}", node.name))?;
        serde_json::from_str(&body).map_err(|e| format!("{} GET {path}: not JSON ({e}): {body:.200}", node.name))
    }

    /// The JetStream meta leader's name as every running node reports it
    /// (`/jsz` `meta_cluster.leader`), once every running node is healthy
    /// (`/healthz`) and all name the same running node; else why not.
    pub fn meta_leader(&mut self) -> Result<String, String> {
        let running: Vec<usize> = (0..NODES).filter(|&i| self.is_running(i)).collect();
        let mut leader: Option<String> = None;
        for &i in &running {
            let name = &self.nodes[i].name;
            let health = self.monitor(i, "/healthz")?;
            if health["status"] != "ok" {
                return Err(format!("{name} /healthz: {health}"));
            }
            let jsz = self.monitor(i, "/jsz")?;
            let theirs = jsz["meta_cluster"]["leader"].as_str().unwrap_or("").to_string();
            if theirs.is_empty() {
                return Err(format!("{name} knows no meta leader yet"));
            }
            match &leader {
                Some(l) if *l != theirs => return Err(format!("{name} says the meta leader is {theirs}, not {l}")),
                _ => leader = Some(theirs),
            }
        }
        let leader = leader.ok_or("no node is running")?;
        match self.index_of(&leader) {
            Some(i) if running.contains(&i) => Ok(leader),
            _ => Err(format!("the meta leader named, {leader}, is not running")),
        }
    }

    /// Waits up to `timeout` until [`Cluster::meta_leader`] names one:
    /// every running node healthy and agreeing on a running meta leader.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let why = match self.meta_leader() {
                Ok(leader) => return Ok(leader),
                Err(why) => why,
            };
            for i in 0..NODES {
                let node = &mut self.nodes[i];
                if let Some(child) = node.child.as_mut() {
                    if let Some(status) = child.exit_status() {
                        return Err(format!("nats node {} exited ({status})", node.name));
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready after {timeout:?}: {why}"));
            }
            std::thread::sleep(wait::POLL);
        }
    }

    /// The last `n` lines of every node's log.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = std::fs::read(&node.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            out += &format!(
                "--- nats {} log tail, {} ---\n{}\n",
                node.name,
                node.log.display(),
                lines[start..].join("\n")
            );
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..NODES {
            self.kill(i);
        }
        for node in &self.nodes {
            let _ = std::fs::remove_dir_all(&node.store);
        }
    }
}

/// A plain HTTP/1.0 GET of `path` on 127.0.0.1:`port`; the body of a 200.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut conn = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(HTTP_TIMEOUT)).map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(HTTP_TIMEOUT)).map_err(|e| e.to_string())?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no end of headers in {text:.200}"))?;
    let status = head.lines().next().unwrap_or("");
    // /healthz answers 503 with a JSON body while JetStream is not ready.
    if !status.contains(" 200 ") && !status.contains(" 503 ") {
        return Err(format!("answered {status:?}"));
    }
    Ok(body.to_string())
}

/// A current-thread tokio runtime with I/O and time, the shape emq will
/// embed async-nats in (one thread drives it).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a current-thread tokio runtime")
}

/// Like [`wait::until_ok`], for async checks: awaits `check` every
/// [`wait::POLL`] until it returns `Ok` or `timeout` has passed (then the
/// last reason).
pub async fn until_ok_async<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let why = match check().await {
            Ok(value) => return Ok(value),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(format!("still not done after {timeout:?}: {why}"));
        }
        tokio::time::sleep(wait::POLL).await;
    }
}
