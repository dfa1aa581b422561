//! The text protocol over TLS and with tokens (docs/security.md "Text
//! protocol: TLS and tokens", text-protocol.md "Authentication") against a
//! real emq-router: certificates made here with rcgen (a CA, a server
//! certificate for 127.0.0.1 and localhost, a client certificate), a rustls
//! client, exact replies, the counters in STATUS, a recording relay that
//! shows what crosses the wire, and emq-cli over TLS with a token.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use emq::text::auth::token_line;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::Value;

use crate::common::admin::request;
use crate::common::ports::free_port;
use crate::common::proc::TestDir;
use crate::common::relay::Relay;
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::common::{wait, watchdog};

/// The test PKI, written as PEM files into the test's directory.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    roots: RootCertStore,
}

fn pki(dir: &TestDir) -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "emq test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
    let leaf = |names: &[&str]| {
        let key = KeyPair::generate().expect("key");
        let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        (params.signed_by(&key, &ca).expect("sign").pem(), key.serialize_pem())
    };
    let (sc, sk) = leaf(&["127.0.0.1", "localhost"]);
    let (cc, ck) = leaf(&["client.emq.test"]);
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write PEM");
        p
    };
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).expect("root");
    Pki {
        ca: write("ca.pem", &ca.pem()),
        server_cert: write("server.pem", &sc),
        server_key: write("server.key", &sk),
        client_cert: write("client.pem", &cc),
        client_key: write("client.key", &ck),
        roots,
    }
}

fn client_config(pki: &Pki, with_cert: bool) -> Arc<ClientConfig> {
    let b = ClientConfig::builder_with_provider(emq::tls::ring_provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(pki.roots.clone());
    Arc::new(if with_cert {
        let chain = CertificateDer::pem_file_iter(&pki.client_cert).expect("c").collect::<Result<Vec<_>, _>>();
        let key = PrivateKeyDer::from_pem_file(&pki.client_key).expect("k");
        b.with_client_auth_cert(chain.expect("chain"), key).expect("client cert")
    } else {
        b.with_no_client_auth()
    })
}

/// A router with a TLS listener (and `extra` flags); its TLS address.
fn router(dir: &TestDir, pki: &Pki, extra: &[&str]) -> (Router, String) {
    let tls = format!("127.0.0.1:{}", free_port());
    let cert = pki.server_cert.to_string_lossy().into_owned();
    let key = pki.server_key.to_string_lossy().into_owned();
    let mut flags = vec!["--text-tls", &tls, "--text-tls-cert-file", &cert, "--text-tls-key-file", &key];
    flags.extend_from_slice(extra);
    let mut r = Router::start_with(dir, RouterKind::Rust(rust_router_bin()), &flags);
    // Both listeners are bound before either serves: the plain one
    // listening means the TLS one does (probing it would count a failed
    // handshake).
    r.wait_text();
    (r, tls)
}

fn text_stats(r: &Router) -> Value {
    request(&r.admin, "STATUS").expect("STATUS")["emq"]["text"].clone()
}

/// A line-protocol connection over any stream, with exact expectations.
struct Line<S: Read + Write> {
    s: BufReader<S>,
}

impl<S: Read + Write> Line<S> {
    fn send(&mut self, bytes: &[u8]) {
        let w = self.s.get_mut();
        w.write_all(bytes).and_then(|()| w.flush()).expect("send");
    }

    fn expect(&mut self, want: &[u8]) {
        let mut line = Vec::new();
        self.s.read_until(b'\n', &mut line).expect("read a line");
        assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(want));
    }

    /// The server closed: the end of the stream (a reset counts too).
    fn expect_closed(&mut self) {
        let mut rest = Vec::new();
        match self.s.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "more after the end: {:?}", String::from_utf8_lossy(&rest)),
            Err(e) => assert!(
                matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof),
                "{e}"
            ),
        }
    }
}

fn tcp(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s
}

fn plain(addr: &str) -> Line<TcpStream> {
    Line { s: BufReader::new(tcp(addr)) }
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr`, checking the certificate for 127.0.0.1;
/// the handshake finished (or its error).
fn try_tls(addr: &str, config: Arc<ClientConfig>) -> std::io::Result<Line<Tls>> {
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let conn = ClientConnection::new(config, name).expect("client");
    let mut s = StreamOwned::new(conn, tcp(addr));
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(Line { s: BufReader::new(s) })
}

fn tls(addr: &str, pki: &Pki) -> Line<Tls> {
    try_tls(addr, client_config(pki, false)).expect("TLS handshake")
}

#[test]
fn text_over_tls_answers_exactly_and_a_plain_client_on_the_tls_port_is_closed() {
    let _w = watchdog::Watchdog::new("text_tls_basic", 60);
    let dir = TestDir::new("text-tls-basic");
    let pki = pki(&dir);
    let (r, tls_addr) = router(&dir, &pki, &[]);
    let mut c = tls(&tls_addr, &pki);
    c.send(b"SCHED hello over tls@q\nASK q\n");
    c.expect(b"WANT? hello over tls\n");
    c.send(b"ACK\nASK q\nACK\nEND\n");
    c.expect(b"NOPE\n");
    c.expect(b"ERR NO_TASK no task is offered on this connection\n");
    c.expect_closed();

    // A plain-TCP client on the TLS port: no text answer, closed, counted.
    let mut p = tcp(&tls_addr);
    p.write_all(b"SCHED plain@q\n").expect("send");
    let mut got = Vec::new();
    let _ = p.read_to_end(&mut got);
    assert!(!got.starts_with(b"ERR") && !got.starts_with(b"WANT"), "{got:?}");
    let ok = wait::until(Duration::from_secs(5), || text_stats(&r)["tls_handshake_failures"] == 1);
    let s = text_stats(&r);
    assert!(ok, "{s}");
    assert_eq!((&s["tls_connections_total"], &s["tls_handshakes"]), (&Value::from(2), &Value::from(1)), "{s}");
    // Nothing of the plain client's line was run.
    let mut c = tls(&tls_addr, &pki);
    c.send(b"ASK q\n");
    c.expect(b"NOPE\n");
}

#[test]
fn tokens_noauth_auth_failed_two_at_once_and_reload() {
    let _w = watchdog::Watchdog::new("text_tls_tokens", 60);
    let dir = TestDir::new("text-tls-tokens");
    let pki = pki(&dir);
    let tokens = dir.join("tokens");
    let write_tokens = |lines: &[(&str, &str)], bump: u64| {
        let text: String = lines.iter().map(|(n, t)| token_line(n, t.as_bytes()) + "\n").collect();
        std::fs::write(&tokens, format!("# test tokens\n{text}")).expect("write tokens");
        // A rewrite within the file system's clock tick still changes the mtime.
        let f = std::fs::File::options().write(true).open(&tokens).expect("open");
        let t = std::time::SystemTime::now() + Duration::from_secs(bump);
        f.set_modified(t).expect("mtime");
    };
    write_tokens(&[("old", "token-old"), ("new", "token-new")], 0);
    let tokens_flag = tokens.to_string_lossy().into_owned();
    let (mut r, tls_addr) = router(&dir, &pki, &["--text-auth-tokens-file", &tokens_flag]);
    let text = r.wait_text();

    let mut c = plain(&text);
    c.send(b"SCHED x@q\nSCHED y@q\n");
    c.expect(b"ERR NOAUTH authenticate first: AUTH <token>\n");
    c.expect_closed();
    let mut c = tls(&tls_addr, &pki);
    c.send(b"AUTH wrong\nSCHED z@q\n");
    c.expect(b"ERR AUTH_FAILED the token is not valid\n");
    c.expect_closed();
    // Both tokens work at once, plain and TLS; no reply to a good AUTH.
    let mut c = plain(&text);
    c.send(b"AUTH token-old\nSCHED a@q\nASK q\n");
    c.expect(b"WANT? a\n");
    let mut c2 = tls(&tls_addr, &pki);
    c2.send(b"AUTH token-new\nASK q\n");
    c2.expect(b"NOPE\n");
    c.send(b"ACK\nEND\n");
    c.expect_closed();

    // Rotation: only the new token is in the file now.
    write_tokens(&[("newer", "token-newer")], 5);
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = plain(&text);
    c.send(b"AUTH token-old\nASK q\n");
    c.expect(b"ERR AUTH_FAILED the token is not valid\n");
    c.expect_closed();
    let mut c = tls(&tls_addr, &pki);
    c.send(b"AUTH token-newer\nASK q\n");
    c.expect(b"NOPE\n");
    // A bad file keeps the set it replaces.
    std::fs::write(&tokens, "broken line\n").expect("write");
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = plain(&text);
    c.send(b"AUTH token-newer\nASK q\n");
    c.expect(b"NOPE\n");

    let s = text_stats(&r);
    assert_eq!((&s["auth_ok"], &s["auth_failed"], &s["auth_noauth"]), (&4.into(), &2.into(), &1.into()), "{s}");
    let log = r.child.log_text();
    assert!(!log.contains("token-old") && !log.contains("token-new"), "a token in the log:\n{log}");
    assert!(log.contains("text tokens file changed but cannot be used"), "{log}");
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    let _w = watchdog::Watchdog::new("text_tls_mtls", 60);
    let dir = TestDir::new("text-tls-mtls");
    let pki = pki(&dir);
    let ca = pki.ca.to_string_lossy().into_owned();
    let (r, tls_addr) = router(&dir, &pki, &["--text-tls-client-ca-file", &ca]);
    // TLS 1.3: the client may finish first and learn of the refusal at
    // its first read.
    let refused = match try_tls(&tls_addr, client_config(&pki, false)) {
        Err(_) => true,
        Ok(mut c) => {
            let _ = c.s.get_mut().write_all(b"ASK q\n").and_then(|()| c.s.get_mut().flush());
            let mut line = String::new();
            !matches!(c.s.read_line(&mut line), Ok(n) if n > 0)
        }
    };
    assert!(refused, "a client without a certificate was served");
    let mut c = try_tls(&tls_addr, client_config(&pki, true)).expect("handshake with a client certificate");
    c.send(b"SCHED m@q\nASK q\n");
    c.expect(b"WANT? m\n");
    let ok = wait::until(Duration::from_secs(5), || text_stats(&r)["tls_handshake_failures"] == 1);
    assert!(ok, "{}", text_stats(&r));
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn no_plaintext_on_the_wire_of_the_tls_port() {
    let _w = watchdog::Watchdog::new("text_tls_wire", 60);
    let dir = TestDir::new("text-tls-wire");
    let pki = pki(&dir);
    let (mut r, tls_addr) = router(&dir, &pki, &[]);
    let text = r.wait_text();

    let via = Relay::start_to(&text);
    let mut c = plain(via.addr());
    c.send(b"SCHED marker-plain-7731@wireq\nASK wireq\n");
    c.expect(b"WANT? marker-plain-7731\n");
    c.send(b"ACK\nEND\n");
    c.expect_closed();
    assert!(via.saw(b"SCHED marker-plain-7731"), "control: the plain port carries the line");

    let via = Relay::start_to(&tls_addr);
    let mut c = tls(via.addr(), &pki);
    c.send(b"SCHED marker-tls-9917@wireq\nASK wireq\n");
    c.expect(b"WANT? marker-tls-9917\n");
    c.send(b"ACK\nEND\n");
    c.expect_closed();
    let wire = via.recorded();
    assert!(wire.len() > 500, "the relay saw the TLS session ({} bytes)", wire.len());
    for marker in [&b"marker-tls-9917"[..], b"SCHED", b"WANT?", b"wireq"] {
        assert!(!contains(&wire, marker), "{:?} crossed the wire in clear", String::from_utf8_lossy(marker));
    }
}

fn cli(args: &[&str], tls: &str, pki: &Pki, token: Option<&Path>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-cli"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["--text", tls, "--tls-ca"]).arg(&pki.ca).args(["--timeout", "5s"]);
    if let Some(t) = token {
        cmd.arg("--token-file").arg(t);
    }
    cmd.args(args).output().expect("emq-cli runs")
}

#[test]
fn emq_cli_over_tls_with_a_token() {
    let _w = watchdog::Watchdog::new("text_tls_cli", 60);
    let dir = TestDir::new("text-tls-cli");
    let pki = pki(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_emq-cli")).args(["token", "new", "app"]).output().expect("runs");
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 4, "{printed}");
    let (token, line) = (lines[1], lines[3]);
    assert_eq!(token.len(), 43, "32 bytes in base64url: {token}");
    assert_eq!(line, token_line("app", token.as_bytes()));
    std::fs::write(dir.join("tokens"), format!("{line}\n")).expect("write");
    std::fs::write(dir.join("token"), format!("{token}\n")).expect("write");
    let tokens = dir.join("tokens").to_string_lossy().into_owned();
    let (_r, tls_addr) = router(&dir, &pki, &["--text-auth-tokens-file", &tokens]);
    let token_file = dir.join("token");

    let out = cli(&["sched", "from-cli", "--queue", "cliq"], &tls_addr, &pki, Some(&token_file));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = cli(&["ask", "cliq"], &tls_addr, &pki, Some(&token_file));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-cli"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = cli(&["sched", "no-token", "--queue", "cliq"], &tls_addr, &pki, None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOAUTH"), "{err}");
}

/// Runs `emq-bench text` against `addr` with the test CA and `token`;
/// `(exit code, stdout, stderr)`.
fn bench(dir: &TestDir, addr: &str, pki: &Pki, token: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-bench"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("EMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["text", "--addr", addr, "--no-progress", "--name", "tls"])
        .arg("--out")
        .arg(dir.join("bench"))
        .arg("--tls-ca")
        .arg(&pki.ca)
        .arg("--token-file")
        .arg(token)
        .args(["--probe-timeout", "5s", "--drain-timeout", "5s"])
        .args(extra);
    let (status, out, err) = crate::common::proc::run("emq-bench", &mut cmd, &dir.path, Duration::from_secs(60));
    (status.and_then(|s| s.code()), out, err)
}

#[test]
fn emq_bench_text_mode_over_tls_with_a_token() {
    let _w = watchdog::Watchdog::new("text_tls_bench", 120);
    let dir = TestDir::new("text-tls-bench");
    let pki = pki(&dir);
    std::fs::write(dir.join("tokens"), token_line("bench", b"bench-token") + "\n").expect("write");
    std::fs::write(dir.join("token"), "bench-token\n").expect("write");
    std::fs::write(dir.join("wrong"), "not-the-token\n").expect("write");
    let tokens = dir.join("tokens").to_string_lossy().into_owned();
    let (r, tls_addr) = router(&dir, &pki, &["--text-auth-tokens-file", &tokens]);

    let load = ["--clients", "2", "--workers", "3", "--requests", "3000", "--warmup", "0s"];
    let (code, out, err) = bench(&dir, &tls_addr, &pki, &dir.join("token"), &load);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench/tls.json")).expect("record")).expect("JSON");
    let got = &record["results"][0];
    assert_eq!((&got["received"], &got["lost"], &got["errors"]), (&3000.into(), &0.into(), &0.into()), "{got}");
    assert_eq!((&record["settings"]["tls"], &record["settings"]["token"]), (&true.into(), &true.into()));
    // Five connections, each a TLS handshake and a good AUTH; every job
    // taken and acknowledged.
    let s = text_stats(&r);
    assert_eq!((&s["tls_handshakes"], &s["auth_ok"], &s["auth_failed"]), (&5.into(), &5.into(), &0.into()), "{s}");
    let st = request(&r.admin, "STATUS").expect("STATUS");
    assert_eq!(st["waiting_messages_by_queue"]["bench-0"].as_u64().unwrap_or(0), 0, "{st}");

    // A wrong token: the run fails at once, naming the refusal; nothing is stored.
    let (code, out, err) = bench(&dir, &tls_addr, &pki, &dir.join("wrong"), &["--requests", "10"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains(
            "target down: the server closed a producer's connection after `ERR AUTH_FAILED the token is not valid`"
        ),
        "{err}"
    );
    assert!(text_stats(&r)["auth_failed"].as_u64().unwrap_or(0) >= 1, "{}", text_stats(&r));
    let st = request(&r.admin, "STATUS").expect("STATUS");
    assert_eq!(st["waiting_messages_by_queue"]["bench-0"].as_u64().unwrap_or(0), 0, "{st}");
    // The beanstalk mode refuses TLS settings.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emq-bench"));
    cmd.args(["beanstalk", "--addr", &tls_addr, "--tls-ca"]).arg(&pki.ca);
    let (status, _, err) = crate::common::proc::run("emq-bench", &mut cmd, &dir.path, Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(err.contains("apply to the text mode only"), "{err}");
}
