//! What a text client needs for TLS and tokens from files (emq-cli,
//! emq-bench): a rustls client configuration trusting a CA file (with an
//! optional client certificate), the server name from the address, and a
//! token file.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use crate::client::text::TextClientOptions;
use crate::protocol::text::Secret;

/// Longest token file read, in bytes (a token is 43 characters).
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// A client configuration trusting the CA certificates in `ca` (PEM),
/// presenting `cert_key` (PEM chain, PEM key) when given; rustls's ring
/// provider, TLS 1.2 and 1.3.
///
/// # Errors
/// One line naming the file that cannot be read or used.
pub fn client_config(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let certs = read_certs(ca)?;
    for cert in certs {
        roots.add(cert).map_err(|e| format!("TLS CA file {}: {e}", ca.display()))?;
    }
    let builder = ClientConfig::builder_with_provider(crate::tls::ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match cert_key {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = read_certs(cert)?;
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|e| format!("TLS client key file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("TLS client certificate {} with key {}: {e}", cert.display(), key.display()))?
        }
    };
    Ok(Arc::new(config))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS certificate file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("TLS certificate file {}: no PEM CERTIFICATE block in it", path.display()));
    }
    Ok(certs)
}

/// The name the server's certificate must carry: `name` if given, else
/// the host part of `addr` (`host:port`, `[v6]:port`); an IP address
/// checks the certificate's IP addresses.
///
/// # Errors
/// Not a DNS name or IP address.
pub fn server_name(addr: &str, name: Option<&str>) -> Result<ServerName<'static>, String> {
    let host = match name {
        Some(n) => n,
        None => addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']'),
    };
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is not a TLS server name: {e}"))
}

/// The token in `path`: its first line, spaces around it removed.
///
/// # Errors
/// The file cannot be read, is larger than [`MAX_TOKEN_FILE_BYTES`], or
/// holds no token.
pub fn read_token_file(path: &Path) -> Result<Secret, String> {
    let err = |why: String| format!("token file {}: {why}", path.display());
    let len = std::fs::metadata(path).map_err(|e| err(e.to_string()))?.len();
    if len > MAX_TOKEN_FILE_BYTES {
        return Err(err(format!("{len} bytes, more than the {MAX_TOKEN_FILE_BYTES} allowed")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    match text.lines().next().map(str::trim) {
        Some(token) if !token.is_empty() => Ok(Secret(token.as_bytes().to_vec())),
        _ => Err(err("no token in it".into())),
    }
}

/// The options the usual client flags give: TLS when `ca` is set (to
/// `addr`, checked against `name` or the address's host), a client
/// certificate, a token file.
///
/// # Errors
/// One line naming the file or setting that cannot be used.
pub fn options(
    addr: &str,
    ca: Option<&Path>,
    name: Option<&str>,
    cert_key: Option<(&Path, &Path)>,
    token_file: Option<&Path>,
) -> Result<TextClientOptions, String> {
    let tls = match ca {
        Some(ca) => Some((client_config(ca, cert_key)?, server_name(addr, name)?)),
        None if cert_key.is_some() => return Err("a client certificate needs --tls-ca (TLS)".into()),
        None => None,
    };
    let token = token_file.map(read_token_file).transpose()?;
    Ok(TextClientOptions { tls, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert_eq!(server_name("localhost:1", None).unwrap(), ServerName::try_from("localhost").unwrap());
        assert_eq!(server_name("127.0.0.1:1", None).unwrap(), ServerName::try_from("127.0.0.1").unwrap());
        assert_eq!(server_name("[::1]:1", None).unwrap(), ServerName::try_from("::1").unwrap());
        assert_eq!(
            server_name("10.0.0.1:1", Some("emq.example")).unwrap(),
            ServerName::try_from("emq.example").unwrap()
        );
        assert!(server_name("bad name:1", None).is_err());
    }
}
