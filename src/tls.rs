//! Server-side TLS from PEM files, shared by the listeners that offer it
//! (the text protocol's `text_tls`, the HTTP endpoint's HTTPS).
//!
//! [`ServerTls::from_files`] reads a certificate chain, its private key and,
//! optionally, a file of client CA certificates; with the latter every
//! client must present a certificate that chains to one of them (mutual
//! TLS, [`WebPkiClientVerifier`]), without it no client certificate is
//! asked for. The crypto provider is rustls's `ring` one, named explicitly
//! (the process-wide default is never installed or read), TLS 1.2 and 1.3.
//!
//! Certificate rotation: the certificate and key files are watched. When a
//! new connection's handshake starts and at least [`RELOAD_CHECK_INTERVAL`]
//! has passed since the last look, their modification times are compared
//! with the loaded ones; if either changed, both files are read again and,
//! when they make a valid pair, used for this and every later handshake.
//! Connections already open keep the certificate they were given. A new
//! pair that cannot be used (unreadable, not PEM, key not matching the
//! certificate, or a half-written file) keeps the previous pair and is
//! logged once per change of the files. The client CA file is read once, at
//! start.
//!
//! Errors are one line naming the file and what is wrong with it
//! ([`TlsError`]); nothing here panics on file contents.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often at most the certificate and key files' modification times are
/// looked at for a reload (on a handshake, never on a timer).
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Most certificates read from one PEM file (a chain or a CA bundle); a
/// larger file is refused rather than held in memory. Public CA bundles
/// hold a few hundred.
pub const MAX_PEM_CERTIFICATES: usize = 1000;

/// Largest PEM file read (certificate chain, key, CA bundle), in bytes.
pub const MAX_PEM_FILE_BYTES: u64 = 4 << 20;

/// Why a TLS configuration could not be made from its files. Each names the
/// file concerned.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read (missing, no permission, too large).
    #[error("cannot read TLS {what} file {}: {why}", path.display())]
    Read {
        /// Which file: "certificate", "private key" or "client CA".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The reason, one line.
        why: String,
    },
    /// The file was read but holds no usable PEM item of the expected kind,
    /// or a malformed one.
    #[error("bad TLS {what} file {}: {why}", path.display())]
    Content {
        /// Which file: "certificate", "private key" or "client CA".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The reason, one line.
        why: String,
    },
    /// The key does not belong to the certificate, or the pair or the CA
    /// set was refused by rustls.
    #[error("TLS certificate {} with key {}: {why}", cert.display(), key.display())]
    Pair {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// The reason, one line.
        why: String,
    },
    /// The client CA certificates could not make a client verifier.
    #[error("TLS client CA file {}: {why}", path.display())]
    ClientCa {
        /// The client CA file.
        path: PathBuf,
        /// The reason, one line.
        why: String,
    },
}

/// A server TLS configuration made from PEM files, whose certificate is
/// re-read when the files change (module doc). Cheap to share: clone the
/// [`Arc`] from [`ServerTls::config`] into each listener.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    client_cert_required: bool,
    resolver: Arc<ReloadingCert>,
}

impl ServerTls {
    /// Reads `cert` (PEM, the server's certificate first, then its
    /// intermediates), `key` (PEM, PKCS#8, PKCS#1 or SEC1) and, when
    /// given, `client_ca` (PEM, one or more CA certificates; client
    /// certificates are then required and verified against them).
    ///
    /// # Errors
    /// A [`TlsError`] naming the file that cannot be read or used, or the
    /// pair when the key does not match the certificate.
    pub fn from_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let provider = ring_provider();
        let pair = load_pair(cert, key, &provider)?;
        let stamp = (modified(cert), modified(key));
        let resolver = Arc::new(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider: provider.clone(),
            state: Mutex::new(ReloadState { current: Arc::new(pair), stamp, refused: None, checked: Instant::now() }),
        });
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Pair { cert: cert.to_path_buf(), key: key.to_path_buf(), why: e.to_string() })?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for der in read_certs(ca, "client CA")? {
                    roots.add(der).map_err(|e| TlsError::Content {
                        what: "client CA",
                        path: ca.to_path_buf(),
                        why: e.to_string(),
                    })?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::ClientCa { path: ca.to_path_buf(), why: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_cert_resolver(resolver.clone());
        Ok(ServerTls { config: Arc::new(config), client_cert_required: client_ca.is_some(), resolver })
    }

    /// The configuration for new server connections
    /// (`rustls::ServerConnection::new(tls.config())`).
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }

    /// Whether client certificates are required (a client CA file was given).
    pub fn requires_client_cert(&self) -> bool {
        self.client_cert_required
    }

    /// Looks at the certificate and key files now (not waiting for
    /// [`RELOAD_CHECK_INTERVAL`]) and loads them if they changed; what a
    /// handshake does by itself at most once a second. Returns whether a new
    /// pair is now in use.
    pub fn reload_now(&self) -> bool {
        self.resolver.check(true)
    }
}

/// rustls's ring provider. rustls 0.23.48 marks it deprecated because ring
/// has no post-quantum key exchange; the default aws-lc provider that has one
/// needs cmake to build, absent here. Classical X25519/ECDHE key exchange.
#[allow(deprecated)]
pub fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The pair served to new handshakes, re-read when the files change.
struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<ReloadState>,
}

struct ReloadState {
    current: Arc<CertifiedKey>,
    /// Modification times of (certificate, key) when `current` was loaded.
    stamp: (Option<SystemTime>, Option<SystemTime>),
    /// Modification times of a pair that was refused (logged once).
    refused: Option<(Option<SystemTime>, Option<SystemTime>)>,
    checked: Instant,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

impl ReloadingCert {
    /// Reloads the pair if the files changed since it was loaded (and, unless
    /// `now`, the last look was [`RELOAD_CHECK_INTERVAL`] ago). Returns
    /// whether a new pair was loaded.
    fn check(&self, now: bool) -> bool {
        let mut st = self.state.lock();
        if !now && st.checked.elapsed() < RELOAD_CHECK_INTERVAL {
            return false;
        }
        st.checked = Instant::now();
        let stamp = (modified(&self.cert), modified(&self.key));
        if stamp == st.stamp || Some(stamp) == st.refused {
            return false;
        }
        match load_pair(&self.cert, &self.key, &self.provider) {
            Ok(pair) => {
                st.current = Arc::new(pair);
                st.stamp = stamp;
                st.refused = None;
                tracing::info!(cert = %self.cert.display(), key = %self.key.display(), "TLS certificate reloaded; new connections use it");
                true
            }
            Err(e) => {
                st.refused = Some(stamp);
                tracing::warn!(error = %e, "TLS certificate changed but cannot be used; the previous one stays in use");
                false
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.check(false);
        Some(self.state.lock().current.clone())
    }
}

/// The file's modification time, `None` when it cannot be read (then a
/// reload is tried when it comes back).
fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads `path` whole, refusing a file over [`MAX_PEM_FILE_BYTES`].
fn read_limited(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    let err = |why: String| TlsError::Read { what, path: path.to_path_buf(), why };
    let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
    if len > MAX_PEM_FILE_BYTES {
        return Err(err(format!("{len} bytes, more than the {MAX_PEM_FILE_BYTES} allowed")));
    }
    std::fs::read(path).map_err(|e| err(e.to_string()))
}

/// The certificates of a PEM file, in order; at least one.
fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_limited(path, what)?;
    let err = |why: String| TlsError::Content { what, path: path.to_path_buf(), why };
    let mut certs = Vec::new();
    for item in CertificateDer::pem_slice_iter(&bytes) {
        let der = item.map_err(|e| err(format!("not PEM: {e}")))?;
        if certs.len() == MAX_PEM_CERTIFICATES {
            return Err(err(format!("more than {MAX_PEM_CERTIFICATES} certificates")));
        }
        certs.push(der);
    }
    if certs.is_empty() {
        return Err(err("no PEM CERTIFICATE block in it".into()));
    }
    Ok(certs)
}

/// The certificate chain and its key, checked to belong together.
fn load_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let chain = read_certs(cert, "certificate")?;
    let bytes = read_limited(key, "private key")?;
    let der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Content {
        what: "private key",
        path: key.to_path_buf(),
        why: match e {
            rustls_pki_types::pem::Error::NoItemsFound => "no PEM PRIVATE KEY block in it".into(),
            e => format!("not PEM: {e}"),
        },
    })?;
    CertifiedKey::from_der(chain, der, provider).map_err(|e| TlsError::Pair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, ServerConnection};

    use super::*;

    struct Ca {
        issuer: CertifiedIssuer<'static, KeyPair>,
    }

    impl Ca {
        fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(rcgen::DnType::CommonName, name);
            let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca");
            Ca { issuer }
        }

        /// (certificate PEM, key PEM) for `names`.
        fn leaf(&self, names: &[&str]) -> (String, String) {
            let key = KeyPair::generate().expect("key");
            let params =
                CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
            let cert = params.signed_by(&key, &self.issuer).expect("sign");
            (cert.pem(), key.serialize_pem())
        }

        fn roots(&self) -> RootCertStore {
            let mut roots = RootCertStore::empty();
            roots.add(self.issuer.der().clone()).expect("root");
            roots
        }
    }

    fn provider() -> Arc<CryptoProvider> {
        ring_provider()
    }

    fn client(ca: &Ca, cert: Option<(&str, &str)>) -> ClientConfig {
        let b = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(ca.roots());
        match cert {
            None => b.with_no_client_auth(),
            Some((c, k)) => {
                let chain = CertificateDer::pem_slice_iter(c.as_bytes()).collect::<Result<Vec<_>, _>>().expect("c");
                let key = PrivateKeyDer::from_pem_slice(k.as_bytes()).expect("k");
                b.with_client_auth_cert(chain, key).expect("client cert")
            }
        }
    }

    /// Runs a handshake in memory; returns the server's end-entity
    /// certificate as the client saw it, or the first error.
    fn handshake(server: &ServerTls, client: ClientConfig) -> Result<Vec<u8>, rustls::Error> {
        let name = ServerName::try_from("localhost").expect("name");
        let mut c = ClientConnection::new(Arc::new(client), name)?;
        let mut s = ServerConnection::new(server.config())?;
        for _ in 0..20 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).expect("client write");
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).expect("server read");
            }
            let server_result = s.process_new_packets();
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).expect("server write");
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).expect("client read");
            }
            let client_result = c.process_new_packets();
            server_result?;
            client_result?;
            if !c.is_handshaking() && !s.is_handshaking() {
                c.writer().write_all(b"PING\n").expect("w");
                let mut buf = Vec::new();
                c.write_tls(&mut buf).expect("w");
                s.read_tls(&mut &buf[..]).expect("r");
                s.process_new_packets()?;
                let mut got = [0u8; 5];
                s.reader().read_exact(&mut got).expect("plaintext");
                assert_eq!(&got, b"PING\n");
                let certs = c.peer_certificates().expect("server certificate");
                return Ok(certs[0].to_vec());
            }
        }
        panic!("handshake did not finish");
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn serves_and_reloads_a_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("test CA");
        let (c1, k1) = ca.leaf(&["localhost", "127.0.0.1"]);
        let cert = write(dir.path(), "cert.pem", &c1);
        let key = write(dir.path(), "key.pem", &k1);
        let tls = ServerTls::from_files(&cert, &key, None).expect("config");
        assert!(!tls.requires_client_cert());
        let first = handshake(&tls, client(&ca, None)).expect("handshake");
        assert_eq!(first, CertificateDer::from_pem_slice(c1.as_bytes()).expect("der").to_vec());

        // A broken new pair keeps the old one.
        let (c2, k2) = ca.leaf(&["localhost"]);
        std::fs::write(&cert, &c2).expect("write");
        std::fs::write(&key, "garbage").expect("write");
        bump(&cert);
        assert!(!tls.reload_now());
        assert_eq!(handshake(&tls, client(&ca, None)).expect("old pair"), first);

        // The repaired pair is taken for new handshakes.
        std::fs::write(&key, &k2).expect("write");
        bump(&key);
        assert!(tls.reload_now());
        let second = handshake(&tls, client(&ca, None)).expect("new pair");
        assert_eq!(second, CertificateDer::from_pem_slice(c2.as_bytes()).expect("der").to_vec());
        assert!(!tls.reload_now(), "unchanged files are not read again");
    }

    /// Moves the file's mtime forward a second, so a rewrite within the same
    /// clock tick still counts as a change.
    fn bump(path: &Path) {
        let f = std::fs::File::options().write(true).open(path).expect("open");
        let t = modified(path).expect("mtime") + Duration::from_secs(1);
        f.set_modified(t).expect("set mtime");
    }

    #[test]
    fn client_ca_requires_a_client_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("test CA");
        let (c, k) = ca.leaf(&["localhost"]);
        let cert = write(dir.path(), "cert.pem", &c);
        let key = write(dir.path(), "key.pem", &k);
        let ca_file = write(dir.path(), "ca.pem", &ca.issuer.pem());
        let tls = ServerTls::from_files(&cert, &key, Some(&ca_file)).expect("config");
        assert!(tls.requires_client_cert());
        assert!(handshake(&tls, client(&ca, None)).is_err(), "no client certificate");
        let other = Ca::new("other CA");
        let (oc, ok) = other.leaf(&["client"]);
        assert!(handshake(&tls, client(&ca, Some((&oc, &ok)))).is_err(), "client certificate of another CA");
        let (cc, ck) = ca.leaf(&["client"]);
        handshake(&tls, client(&ca, Some((&cc, &ck)))).expect("client certificate of the CA");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("test CA");
        let (c, k) = ca.leaf(&["localhost"]);
        let (_, other_key) = ca.leaf(&["localhost"]);
        let cert = write(dir.path(), "cert.pem", &c);
        let key = write(dir.path(), "key.pem", &k);
        let missing = dir.path().join("missing.pem");
        let empty = write(dir.path(), "empty.pem", "hello\n");
        let wrong_key = write(dir.path(), "wrong.pem", &other_key);
        let msg = |r: Result<ServerTls, TlsError>| r.expect_err("must fail").to_string();

        let m = msg(ServerTls::from_files(&missing, &key, None));
        assert!(m.starts_with("cannot read TLS certificate file ") && m.contains("missing.pem"), "{m}");
        let m = msg(ServerTls::from_files(&empty, &key, None));
        assert!(m.starts_with("bad TLS certificate file ") && m.contains("empty.pem: no PEM CERTIFICATE block"), "{m}");
        let m = msg(ServerTls::from_files(&cert, &empty, None));
        assert!(m.starts_with("bad TLS private key file ") && m.contains("no PEM PRIVATE KEY block"), "{m}");
        let m = msg(ServerTls::from_files(&cert, &wrong_key, None));
        assert!(m.starts_with("TLS certificate ") && m.contains("wrong.pem"), "{m}");
        let m = msg(ServerTls::from_files(&cert, &key, Some(&empty)));
        assert!(m.starts_with("bad TLS client CA file ") && m.contains("empty.pem"), "{m}");
        assert!(!m.contains('\n'), "one line: {m}");
    }
}
