//! The metrics HTTP server's passwords and TLS (docs/security.md "HTTP: TLS
//! and passwords"), against a real `emq-router` over 127.0.0.1: Basic auth
//! from `metrics_basic_auth_file` (401 with `WWW-Authenticate` without or
//! with wrong credentials, 200 with right ones, the file reloaded when it
//! changes, a bad new file keeping the old users), HTTPS with
//! `metrics_tls_cert_file` (a client trusting the CA is served, one that
//! does not fails its handshake, a plain-HTTP client is refused and
//! counted), client certificates with `metrics_tls_client_ca_file`, and no
//! plaintext on the wire: a recording relay sees `emq_` in a plain scrape
//! and not in an HTTPS one. Certificates (rcgen) and bcrypt hashes are made
//! at test time.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::common::proc::TestDir;
use crate::common::relay::Relay;
use crate::common::router::{rust_router_bin, Router, RouterKind};
use crate::common::wait;
use crate::common::watchdog::Watchdog;

const T: Duration = Duration::from_secs(5);

/// A test CA (rcgen), signing server and client certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        Ca { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA") }
    }

    /// `(certificate PEM, key PEM)` for `names` (IP addresses become IP
    /// subject alternative names).
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        (params.signed_by(&key, &self.issuer).expect("signed").pem(), key.serialize_pem())
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).expect("root");
        roots
    }
}

/// A rustls client trusting `ca`, presenting `cert` (PEM certificate and
/// key) when given.
#[allow(deprecated)] // rustls marks the ring provider so (no post-quantum key exchange)
fn client_config(ca: &Ca, cert: Option<&(String, String)>) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(ca.roots());
    Arc::new(match cert {
        None => b.with_no_client_auth(),
        Some((c, k)) => {
            let chain = CertificateDer::pem_slice_iter(c.as_bytes()).collect::<Result<Vec<_>, _>>().expect("chain");
            b.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(k.as_bytes()).expect("key")).expect("auth")
        }
    })
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).expect("file written");
    path.to_path_buf()
}

/// Replaces the file at `path` at once (a new file renamed over it), as an
/// operator should.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).expect("file written");
    std::fs::rename(&tmp, path).expect("file renamed");
}

/// An `htpasswd -nBC 4 user` line (cost 4 keeps the test fast; the router
/// takes any cost up to 12).
fn user_line(user: &str, password: &str) -> String {
    format!("{user}:{}\n", bcrypt::hash(password, 4).expect("bcrypt"))
}

fn start(dir: &TestDir, extra: &[&str]) -> (Router, String) {
    let router = Router::start_with(dir, RouterKind::Rust(rust_router_bin()), extra);
    let addr = router.metrics.clone().expect("a Rust router serves metrics");
    let port: u16 = addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    let up = wait::until(T, || crate::common::ports::is_listening(port));
    assert!(up, "metrics port {addr} not listening");
    (router, addr)
}

/// The request for `path`, with Basic credentials when given.
fn request(path: &str, credentials: Option<(&str, &str)>) -> Vec<u8> {
    let mut r = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if let Some((user, password)) = credentials {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        r.push_str(&format!("Authorization: Basic {b64}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// Sends `request` on `s` and reads the answer to the close.
fn exchange(s: &mut impl ReadWrite, request: &[u8]) -> std::io::Result<String> {
    s.write_all(request)?;
    s.flush()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

trait ReadWrite: Read + Write {}
impl<S: Read + Write> ReadWrite for S {}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("the HTTP server accepts");
    s.set_read_timeout(Some(T)).expect("read timeout");
    s.set_write_timeout(Some(T)).expect("write timeout");
    s
}

/// A plain-HTTP exchange.
fn plain(addr: &str, path: &str, credentials: Option<(&str, &str)>) -> String {
    exchange(&mut connect(addr), &request(path, credentials)).expect("plain HTTP answer")
}

/// An HTTPS exchange with `config`: the answer, or the TLS or I/O error.
fn https(
    addr: &str,
    config: &Arc<ClientConfig>,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> Result<String, String> {
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
    let conn = ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    let mut s = StreamOwned::new(conn, connect(addr));
    exchange(&mut s, &request(path, credentials)).map_err(|e| e.to_string())
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// The value of `emq_events_total{event="<event>"}` in a scrape.
fn event(text: &str, event: &str) -> u64 {
    let prefix = format!("emq_events_total{{router=\"emq\",event=\"{event}\"}} ");
    let line = text.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    line.and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("{prefix} missing\n{text}"))
}

fn assert_401(answer: &str, what: &str) {
    assert_eq!(status_line(answer), "HTTP/1.1 401 Unauthorized", "{what}: {answer}");
    assert!(answer.contains("\r\nWWW-Authenticate: Basic realm=\"emq\"\r\n"), "{what}: {answer}");
    assert!(answer.ends_with("\r\n\r\nauthentication required (Basic)\n"), "{what}: {answer}");
    assert!(!answer.contains("emq_"), "{what}: {answer}");
}

#[test]
fn http_basic_auth_refuses_missing_and_wrong_credentials_and_reloads_the_file() {
    let _w = Watchdog::new("http_basic_auth", 90);
    let dir = TestDir::new("http-basic-auth");
    let users = write(&dir.join("http-users"), &format!("# scrapers\n{}", user_line("prometheus", "old-secret")));
    let (mut router, addr) = start(&dir, &["--metrics-basic-auth-file", users.to_str().expect("utf-8 path")]);

    for path in ["/metrics", "/"] {
        assert_401(&plain(&addr, path, None), &format!("{path} without credentials"));
        assert_401(&plain(&addr, path, Some(("prometheus", "wrong"))), &format!("{path} with a wrong password"));
    }
    assert_401(&plain(&addr, "/metrics", Some(("nobody", "old-secret"))), "an unknown user");
    let metrics = plain(&addr, "/metrics", Some(("prometheus", "old-secret")));
    assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");
    assert_eq!(event(&metrics, "http_auth_failures"), 3, "{metrics}");
    assert_eq!(event(&metrics, "http_auth_throttled"), 0, "{metrics}");
    assert_eq!(event(&metrics, "http_refused"), 5, "the five 401s: {metrics}");
    let page = plain(&addr, "/", Some(("prometheus", "old-secret")));
    assert_eq!(status_line(&page), "HTTP/1.1 200 OK", "{page}");
    assert!(
        page.contains(
            "<p id=\"http\">HTTP access: Basic auth (1 user(s)); 3 failed password check(s), 0 refused unchecked \
             after too many (429).</p>"
        ),
        "{page}"
    );
    let again = plain(&addr, "/metrics", Some(("prometheus", "old-secret")));
    assert_eq!(event(&again, "http_auth_cache_hits"), 2, "the page and this scrape: {again}");

    // A new password: the old one is refused within the reload check (1 s),
    // the new one served.
    replace(&users, &user_line("prometheus", "new-secret"));
    let reloaded = wait::until(Duration::from_secs(5), || {
        status_line(&plain(&addr, "/metrics", Some(("prometheus", "old-secret")))) == "HTTP/1.1 401 Unauthorized"
    });
    assert!(reloaded, "the old password still served after the file changed\n{}", router.child.log_tail(20));
    let metrics = plain(&addr, "/metrics", Some(("prometheus", "new-secret")));
    assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");

    // A bad new file keeps the users loaded before, and is logged once.
    replace(&users, "prometheus:not-a-hash\n");
    std::thread::sleep(Duration::from_millis(1_200));
    for _ in 0..3 {
        let metrics = plain(&addr, "/metrics", Some(("prometheus", "new-secret")));
        assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");
        std::thread::sleep(Duration::from_millis(600));
    }
    let log = router.child.log_text();
    assert_eq!(log.matches("line 1: user prometheus: not a bcrypt hash").count(), 1, "{log}");
    assert!(!log.contains("new-secret") && !log.contains("old-secret") && !log.contains("Basic "), "{log}");
    assert!(router.child.is_alive(), "{}", router.child.log_tail(20));
}

#[test]
fn http_tls_serves_clients_trusting_the_ca_and_refuses_others_and_plain_http() {
    let _w = Watchdog::new("http_tls", 90);
    let dir = TestDir::new("http-tls");
    let ca = Ca::new("emq test CA");
    let (cert, key) = ca.leaf(&["127.0.0.1", "localhost"]);
    let cert = write(&dir.join("http.pem"), &cert);
    let key = write(&dir.join("http-key.pem"), &key);
    let path = |p: &PathBuf| p.to_str().expect("utf-8 path").to_string();
    let (cert_s, key_s) = (path(&cert), path(&key));
    let (router, addr) = start(&dir, &["--metrics-tls-cert-file", &cert_s, "--metrics-tls-key-file", &key_s]);

    let trusting = client_config(&ca, None);
    let other = client_config(&Ca::new("another CA"), None);
    let refused = https(&addr, &other, "/metrics", None).expect_err("a client not trusting the CA is refused");
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    let plain_answer = plain(&addr, "/metrics", None);
    assert!(plain_answer.starts_with("HTTP/1.0 400 Bad Request\r\n"), "{plain_answer}");
    assert!(plain_answer.ends_with("this port speaks HTTPS (TLS): use https://\n"), "{plain_answer}");
    let metrics = https(&addr, &trusting, "/metrics", None).expect("served over TLS");
    assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");
    assert_eq!(event(&metrics, "http_tls_failures"), 2, "{metrics}");
    let page = https(&addr, &trusting, "/", None).expect("served over TLS");
    assert!(page.contains("<p id=\"http\">HTTP access: TLS; 0 failed"), "{page}");

    // No plaintext on the wire: a recording relay in front of the TLS
    // listener, and, for control, in front of a plain router.
    let via = Relay::start_to(&addr);
    let metrics = https(via.addr(), &trusting, "/metrics", None).expect("served through the relay");
    assert!(metrics.contains("emq_events_total"), "{metrics}");
    let wire = via.recorded();
    assert!(wire.len() > metrics.len(), "the whole answer went through: {} bytes", wire.len());
    assert!(!contains(&wire, b"emq_") && !contains(&wire, b"GET /metrics"), "plaintext over TLS");
    drop(router);
    let plain_dir = TestDir::new("http-tls-control");
    let (_plain_router, plain_addr) = start(&plain_dir, &[]);
    let via = Relay::start_to(&plain_addr);
    let metrics = plain(via.addr(), "/metrics", None);
    assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");
    assert!(via.saw(b"emq_"), "the control shows the marker");
}

#[test]
fn http_tls_client_ca_requires_a_client_certificate_and_passwords_still_apply() {
    let _w = Watchdog::new("http_mtls", 90);
    let dir = TestDir::new("http-mtls");
    let ca = Ca::new("emq test CA");
    let (cert, key) = ca.leaf(&["127.0.0.1"]);
    let files = [
        write(&dir.join("http.pem"), &cert),
        write(&dir.join("http-key.pem"), &key),
        write(&dir.join("ca.pem"), &ca.pem()),
        write(&dir.join("http-users"), &user_line("prometheus", "secret")),
    ];
    let [cert, key, client_ca, users] = files.map(|p| p.to_str().expect("utf-8 path").to_string());
    let (router, addr) = start(
        &dir,
        &[
            "--metrics-tls-cert-file",
            &cert,
            "--metrics-tls-key-file",
            &key,
            "--metrics-tls-client-ca-file",
            &client_ca,
            "--metrics-basic-auth-file",
            &users,
        ],
    );

    let anonymous = https(&addr, &client_config(&ca, None), "/metrics", Some(("prometheus", "secret")));
    let refused = anonymous.expect_err("a client without a certificate is refused");
    assert!(refused.contains("CertificateRequired") || refused.contains("HandshakeFailure"), "{refused}");
    let stranger = Ca::new("another CA");
    let foreign = client_config(&ca, Some(&stranger.leaf(&["scraper"])));
    let refused = https(&addr, &foreign, "/metrics", Some(("prometheus", "secret")));
    assert!(refused.is_err(), "a certificate of another CA is refused: {refused:?}");

    let with_cert = client_config(&ca, Some(&ca.leaf(&["scraper"])));
    let answer = https(&addr, &with_cert, "/metrics", None).expect("served over mutual TLS");
    assert_401(&answer, "mutual TLS without a password");
    let metrics = https(&addr, &with_cert, "/metrics", Some(("prometheus", "secret"))).expect("served");
    assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK", "{metrics}");
    assert_eq!(event(&metrics, "http_tls_failures"), 2, "{metrics}");
    let page = https(&addr, &with_cert, "/", Some(("prometheus", "secret"))).expect("served");
    assert!(page.contains("HTTP access: TLS with client certificates, Basic auth (1 user(s)); 0 failed"), "{page}");
    drop(router);
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
