//! Secure connections to NATS (the replicated job log, the scheduler's
//! NATS store): a real 3-node nats-server cluster (`tests/common/nats.rs`)
//! whose client port requires TLS (a CA and a server certificate for
//! 127.0.0.1 made now with rcgen; the routes between the servers stay
//! plain) and authorization (a user with a password, an NKey user).
//!
//! * With the CA and the right password, or the CA and the NKey seed file,
//!   `emq-router --durability replicated` serves jobs end to end (text
//!   SCHED, then ASK/ACK); `emq-scheduler` with the NATS store and the
//!   password takes its lease. No log holds the password or the seed.
//! * A wrong password, no CA (the servers require TLS) or a missing
//!   password file stops the router's start with one clear line naming
//!   the settings to check; nothing is made on the cluster (no stream, no
//!   bucket) and no data directory is written.
//!
//! Without a nats-server a test says so in one line and skips; under CI it
//! fails.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};

use crate::common::nats::{self, Cluster, NODES};
use crate::common::ports::{free_port, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::wait;
use crate::common::watchdog::Watchdog;
use crate::durability::{drain, sched, Node};

/// The password user of the servers' authorization.
const USER: &str = "emq";
/// Its password, as the servers' config has it (the file adds a newline,
/// which is trimmed).
const PASSWORD: &str = "s3cret-Pa55word";

/// What a test holds, dropped in this order: the cluster (servers killed,
/// stores removed), then the test dir (kept when the test failed), then
/// the watchdog.
struct Secured {
    cluster: Cluster,
    dir: TestDir,
    /// The CA's certificate (PEM), for `--nats-tls-ca`.
    ca: PathBuf,
    /// A file holding [`PASSWORD`] and a newline (mode 600).
    password: PathBuf,
    /// A file holding the NKey user's seed (mode 600).
    seed_file: PathBuf,
    /// The seed, to check no log holds it.
    seed: String,
    _watchdog: Watchdog,
}

/// A private file holding `text`.
fn secret_file(path: PathBuf, text: &str) -> PathBuf {
    std::fs::write(&path, text).expect("write a secret file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path
}

/// A CA and a server certificate for 127.0.0.1 (and `localhost`) it signed,
/// written as PEM into `dir`: (CA certificate, server certificate, server
/// key).
fn certificates(dir: &TestDir) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "emq test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key")).expect("CA certificate");
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
    server.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
    server.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let key = KeyPair::generate().expect("server key");
    let cert = server.signed_by(&key, &ca).expect("server certificate");
    let paths = (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server-key.pem"));
    std::fs::write(&paths.0, ca.pem()).expect("write ca.pem");
    std::fs::write(&paths.1, cert.pem()).expect("write server.pem");
    secret_file(paths.2.clone(), &key.serialize_pem());
    paths
}

/// A cluster requiring TLS and a user (the password user or the NKey
/// user) of every client, with the files the clients need; `None` (after
/// one line) without a nats-server.
fn secured(test: &str, limit_secs: u64) -> Option<Secured> {
    let bin = nats::server_or_skip(test)?;
    let dir = TestDir::new(test);
    let (ca, cert, key) = certificates(&dir);
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().expect("a new key pair has a seed");
    let extra = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  timeout: 5\n}}\n\
         authorization {{\n  users: [\n    {{user: {USER}, password: \"{PASSWORD}\"}}\n    {{nkey: {}}}\n  ]\n}}\n",
        cert.display(),
        key.display(),
        nkey.public_key()
    );
    let started = Instant::now();
    let cluster = Cluster::start_with(&bin, &dir, &extra);
    eprintln!("{test}: TLS + authorization cluster ready in {:?}", started.elapsed());
    let password = secret_file(dir.join("nats-password"), &format!("{PASSWORD}\n"));
    let seed_file = secret_file(dir.join("nats.nk"), &format!("{seed}\n"));
    let watchdog = Watchdog::new(test, limit_secs);
    Some(Secured { cluster, dir, ca, password, seed_file, seed, _watchdog: watchdog })
}

impl Secured {
    /// A router on fresh ports, its data directory and log named `label`.
    fn node(&self, label: &str) -> Node {
        Node {
            ports: [free_port(), free_port(), free_port(), free_port()],
            data: self.dir.join(&format!("{label}-data")),
            log: self.dir.join(&format!("{label}.log")),
            metrics: None,
        }
    }

    /// A replicated router's flags on the cluster with router name `name`,
    /// then `extra`.
    fn flags(&self, name: &str, extra: &[String]) -> Vec<String> {
        let mut flags: Vec<String> = ["--durability", "replicated", "--nats-lease", "3s"].map(String::from).to_vec();
        flags.extend(["--nats-urls".to_string(), self.cluster.urls().join(",")]);
        flags.extend(["--router-name".to_string(), format!("{name}-{}", std::process::id())]);
        flags.extend(extra.iter().cloned());
        flags
    }

    /// `--nats-tls-ca <ca>`.
    fn with_ca(&self) -> Vec<String> {
        vec!["--nats-tls-ca".into(), path(&self.ca)]
    }

    /// `--nats-user emq --nats-password-file <file>`.
    fn with_password(&self, file: &Path) -> Vec<String> {
        vec!["--nats-user".into(), USER.into(), "--nats-password-file".into(), path(file)]
    }

    /// Streams (the routers' logs, key-value buckets) on every node.
    fn streams(&self) -> Vec<u64> {
        (0..NODES)
            .map(|i| {
                let jsz = self.cluster.monitor(i, "/jsz").unwrap_or_else(|e| panic!("{e}"));
                jsz["streams"].as_u64().unwrap_or_else(|| panic!("no stream count in {jsz}"))
            })
            .collect()
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// Runs a router with `flags` that must refuse to start; its one error
/// line (the last line of its output), after checking it exited non-zero,
/// made no data directory and logged no secret.
fn refused(s: &Secured, label: &str, flags: &[String]) -> String {
    let node = s.node(label);
    let started = Instant::now();
    let (status, log) = node.run_to_exit(&strs(flags), &s.dir);
    eprintln!("{label}: exited after {:?}: {status:?}\n{log}", started.elapsed());
    assert!(status.is_some_and(|st| st.code() == Some(1)), "{label} must exit 1: {status:?}\n{log}");
    assert!(!node.data.exists(), "{label} wrote its data directory");
    assert!(!log.contains(PASSWORD) && !log.contains(&s.seed), "{label} logged a secret: {log}");
    log.lines().last().unwrap_or("").to_string()
}

/// Five text SCHEDs through `node`, then all five taken by ASK/ACK.
fn round_trip(node: &Node, queue: &str) {
    sched(&node.text(), queue, 5);
    assert_eq!(drain(&node.text(), queue), (0..5).map(|i| format!("job-{i:04}")).collect::<Vec<_>>());
}

#[test]
fn nats_tls_with_a_password_or_an_nkey_seed_serves_replicated_jobs_and_the_scheduler_store_starts() {
    let test = "nats_secure_ok";
    let Some(s) = secured(test, 150) else { return };

    let by_password = s.node("password");
    let flags = s.flags("pw", &[s.with_ca(), s.with_password(&s.password)].concat());
    let mut router = by_password.start(&strs(&flags));
    round_trip(&by_password, "secure");
    let status = by_password.status();
    let wal = &status["emq"]["wal"];
    assert_eq!((&wal["durability"], &wal["nats"]["connected"]), (&"replicated".into(), &true.into()), "{status}");

    let by_nkey = s.node("nkey");
    let flags = s.flags("nk", &[s.with_ca(), vec!["--nats-nkey-file".into(), path(&s.seed_file)]].concat());
    let mut nkey_router = by_nkey.start(&strs(&flags));
    round_trip(&by_nkey, "seeded");

    // emq-scheduler's NATS store over the same one connect function.
    let admin = zmq_endpoint(free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-scheduler"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["--frontend", &by_password.frontend(), "--scheduler-admin", &admin])
        .args(["--name", &format!("secure-{}", std::process::id()), "--nats-bucket", "sched_secure"])
        .args(["--nats-urls", &s.cluster.urls().join(","), "--nats-lease", "3s", "--nats-timeout", "1s"])
        .args(strs(&[s.with_ca(), s.with_password(&s.password)].concat()))
        .arg("--data-dir")
        .arg(s.dir.join("scheduler-data"))
        .env("RUST_LOG", "info");
    let mut scheduler = Child::spawn("emq-scheduler", &mut cmd, &s.dir.join("scheduler.log"));
    let active = wait::until(Duration::from_secs(30), || {
        scheduler.log_text().contains("holding the lease on the scheduler name: active")
    });
    assert!(active, "the scheduler did not take its lease\n{}", scheduler.log_tail(30));

    for (what, log) in [
        ("password router", router.log_text()),
        ("nkey router", nkey_router.log_text()),
        ("scheduler", scheduler.log_text()),
    ] {
        assert!(!log.contains(PASSWORD) && !log.contains(&s.seed), "the {what} logged a secret: {log}");
    }
    scheduler.kill_group();
    nkey_router.kill_group();
    router.kill_group();
}

#[test]
fn nats_a_wrong_password_or_no_ca_stops_the_router_clearly_and_writes_nothing() {
    let test = "nats_secure_refused";
    let Some(s) = secured(test, 120) else { return };
    let urls = s.cluster.urls().join(",");

    let wrong = secret_file(s.dir.join("wrong-password"), "not-the-password\n");
    let line = refused(&s, "wrong", &s.flags("wrong", &[s.with_ca(), s.with_password(&wrong)].concat()));
    assert_eq!(
        line,
        format!(
            "emq-router: cannot start: cannot connect to the NATS JetStream cluster at {urls}: authorization \
             violation (the servers refused the credentials: check nats_user and nats_password_file, \
             nats_token_file, nats_nkey_file or nats_creds against the servers' authorization)"
        )
    );
    assert!(!line.contains("not-the-password"));

    let line = refused(&s, "no-ca", &s.flags("no-ca", &s.with_password(&s.password)));
    let prefix = format!(
        "emq-router: cannot start: cannot connect to the NATS JetStream cluster at {urls}: IO error: invalid peer \
         certificate: UnknownIssuer"
    );
    assert!(line.starts_with(&prefix), "{line}");
    assert!(
        line.ends_with(
            "(TLS failed: check nats_tls_ca (the CA that signed the servers' certificates, which must name the \
             host of nats_urls), nats_tls_cert and nats_tls_key, and whether the servers use TLS)"
        ),
        "{line}"
    );

    let missing = s.dir.join("no-such-password");
    let line = refused(&s, "missing", &s.flags("missing", &[s.with_ca(), s.with_password(&missing)].concat()));
    assert_eq!(
        line,
        format!(
            "emq-router: cannot start: setting nats_password_file: {}: cannot open it: No such file or \
             directory (os error 2)",
            missing.display()
        )
    );

    let two = [s.with_ca(), s.with_password(&s.password), vec!["--nats-nkey-file".into(), path(&s.seed_file)]];
    let line = refused(&s, "two-kinds", &s.flags("two", &two.concat()));
    assert_eq!(
        line,
        "emq-router: setting nats_nkey_file: give one kind of NATS credentials, not nats_user and \
         nats_nkey_file: nats_user with nats_password_file, nats_token_file, nats_nkey_file or nats_creds"
    );

    // Nothing half-made on the cluster: no router took a name (its lease
    // bucket), made a layout or a stream.
    assert_eq!(s.streams(), vec![0; NODES], "{}", s.cluster.log_tails(5));
}
