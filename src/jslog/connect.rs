//! The one place emq connects to NATS: emq-router's replicated job log
//! (`durability = "replicated"`, [`super::bridge::Bridge::start`]) and
//! emq-scheduler's NATS store ([`crate::scheduler::nats_store`], through the
//! same bridge) both build their [`async_nats::ConnectOptions`] here, from
//! the same settings (`nats_*`, docs/replicated.md "Secure connections").
//!
//! # TLS
//! `nats_tls_ca` (a PEM file of CA certificates) makes the client require
//! TLS and trust those CAs; a `tls://` URL requires TLS with the system's
//! roots. `nats_tls_cert` and `nats_tls_key` (together) add a client
//! certificate (mutual TLS).
//!
//! # Credentials
//! At most one kind ([`check`]): `nats_user` with `nats_password_file`,
//! `nats_token_file`, `nats_nkey_file` (an NKey user seed, `SU...`), or
//! `nats_creds` (a decentralized-auth `.creds` file). Secrets are read from
//! files only, never taken as flag values (a flag's value shows in `ps`
//! and in shell history); each file is read once at start, at most
//! [`limits::NATS_SECRET_MAX_BYTES`], its contents trimmed of surrounding
//! whitespace (a trailing newline is no part of a password). A missing,
//! unreadable, empty or oversized file, or a seed that is not a user seed,
//! stops the start with [`JsError::Secret`] naming the setting and the
//! file. No secret is ever logged or put in an error; a file readable by
//! other users is named in a warning. (async-nats traces its `CONNECT`,
//! password and all, at `trace` level; [`crate::logging`] caps its
//! connection module at `debug` whatever the log filter says.)

use std::io::Read;
use std::path::{Path, PathBuf};

use super::JsError;
use crate::config::NatsConfig;
use crate::limits;

/// The TLS files and credentials of a NATS connection, as emq-scheduler
/// keeps them (emq-router keeps the same fields in its [`NatsConfig`]).
#[derive(Debug, Clone, Default)]
pub struct NatsSecurity {
    /// `nats_tls_ca`: CA certificates (PEM).
    pub tls_ca: Option<PathBuf>,
    /// `nats_tls_cert`: client certificate (PEM).
    pub tls_cert: Option<PathBuf>,
    /// `nats_tls_key`: its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// `nats_creds`: a `.creds` file (user JWT and NKey seed).
    pub creds: Option<PathBuf>,
    /// `nats_user`: a user name (with `password_file`).
    pub user: Option<String>,
    /// `nats_password_file`: the file holding `user`'s password.
    pub password_file: Option<PathBuf>,
    /// `nats_token_file`: the file holding a token.
    pub token_file: Option<PathBuf>,
    /// `nats_nkey_file`: the file holding an NKey user seed.
    pub nkey_file: Option<PathBuf>,
}

/// The NATS settings' check, kept with the settings
/// ([`crate::config::check_nats_settings`]) so that `config` names
/// nothing of `jslog`.
pub use crate::config::check_nats_settings as check;

/// Connects to `config.urls` with [`options`]`(config, name)`, waiting at
/// most `nats_ack_timeout` × 3.
///
/// # Errors
/// [`JsError::Secret`] from [`options`]; [`JsError::Connect`] when no
/// server answers in time, or the servers refuse the credentials or the
/// TLS handshake fails (the message says which settings to check).
pub async fn connect(config: &NatsConfig, name: String) -> Result<async_nats::Client, JsError> {
    let urls = config.urls.join(",");
    let timeout = config.ack_timeout * 3;
    let options = options(config, name).await?;
    match tokio::time::timeout(timeout, async_nats::connect_with_options(config.urls.clone(), options)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(JsError::Connect { urls, why: explain(&e) }),
        Err(_) => Err(JsError::Connect {
            urls,
            why: format!("no server answered within {timeout:?} (check nats_urls and that the servers run)"),
        }),
    }
}

/// What a failed connect means, with the settings to check.
fn explain(e: &async_nats::ConnectError) -> String {
    use async_nats::ConnectErrorKind as Kind;
    let text = e.to_string();
    // A certificate the client does not trust comes as an I/O error
    // ("IO error: invalid peer certificate: UnknownIssuer").
    let tls = matches!(e.kind(), Kind::Tls) || text.contains("certificate") || text.to_lowercase().contains("tls");
    let hint = match e.kind() {
        _ if tls => {
            "TLS failed: check nats_tls_ca (the CA that signed the servers' certificates, which must name the \
             host of nats_urls), nats_tls_cert and nats_tls_key, and whether the servers use TLS"
        }
        Kind::AuthorizationViolation => {
            "the servers refused the credentials: check nats_user and nats_password_file, nats_token_file, \
             nats_nkey_file or nats_creds against the servers' authorization"
        }
        Kind::Authentication => {
            "the credentials could not answer the server's challenge: check nats_nkey_file or nats_creds"
        }
        _ => "check nats_urls and that the servers run",
    };
    // The refusal's source only repeats it ("nats: authorization violation").
    let what = match e.kind() {
        Kind::AuthorizationViolation => e.kind().to_string(),
        _ => text,
    };
    format!("{what} ({hint})")
}

/// The connect options `config` names: the client's name (`name`, shown
/// by the servers' `/connz`), timeouts, TLS files and credentials (module
/// docs). Reads the secret files.
///
/// # Errors
/// [`JsError::Secret`] for a secret file that is missing, unreadable,
/// empty, over [`limits::NATS_SECRET_MAX_BYTES`] or (`nats_nkey_file`) not
/// an NKey user seed; [`JsError::Connect`] for an unusable `nats_creds`.
pub async fn options(config: &NatsConfig, name: String) -> Result<async_nats::ConnectOptions, JsError> {
    let mut o = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(config.ack_timeout)
        .request_timeout(Some(config.ack_timeout))
        .max_reconnects(None::<usize>);
    if let Some(ca) = &config.tls_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    } else if config.urls.iter().any(|u| u.starts_with("tls://")) {
        o = o.require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        o = o.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
    }
    if let (Some(user), Some(file)) = (&config.user, &config.password_file) {
        o = o.user_and_password(user.clone(), read_secret("nats_password_file", file)?);
    }
    if let Some(file) = &config.token_file {
        o = o.token(read_secret("nats_token_file", file)?);
    }
    if let Some(file) = &config.nkey_file {
        o = o.nkey(read_seed(file)?);
    }
    if let Some(creds) = &config.creds {
        o = o.credentials_file(creds).await.map_err(|e| JsError::Connect {
            urls: config.urls.join(","),
            why: format!("setting nats_creds: credentials file {}: {e}", creds.display()),
        })?;
    }
    Ok(o)
}

/// The contents of the secret file `path` (setting `setting`), trimmed.
///
/// # Errors
/// [`JsError::Secret`]: the file cannot be opened or read, is over
/// [`limits::NATS_SECRET_MAX_BYTES`], is not UTF-8 or holds only
/// whitespace. The error never holds the contents.
pub fn read_secret(setting: &'static str, path: &Path) -> Result<String, JsError> {
    let fail = |why: String| JsError::Secret { setting, path: path.to_path_buf(), why };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open it: {e}")))?;
    warn_if_shared(setting, path, &file);
    let mut bytes = Vec::new();
    file.take(limits::NATS_SECRET_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > limits::NATS_SECRET_MAX_BYTES {
        return Err(fail(format!("larger than {} bytes: not a secret file", limits::NATS_SECRET_MAX_BYTES)));
    }
    let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(fail("empty (only whitespace)".into()));
    }
    Ok(secret.to_string())
}

/// The NKey user seed in `path` (`nats_nkey_file`), checked.
fn read_seed(path: &Path) -> Result<String, JsError> {
    let seed = read_secret("nats_nkey_file", path)?;
    let fail = |why: String| JsError::Secret { setting: "nats_nkey_file", path: path.to_path_buf(), why };
    let pair = nkeys::KeyPair::from_seed(&seed).map_err(|e| fail(format!("not an NKey seed ({e})")))?;
    if !pair.public_key().starts_with('U') {
        return Err(fail("an NKey seed, but not a user's (a user seed starts SU)".into()));
    }
    Ok(seed)
}

/// Warns (once per start) when other users may read the secret file.
fn warn_if_shared(setting: &'static str, path: &Path, file: &std::fs::File) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = file.metadata() {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                setting,
                file = %path.display(),
                mode = format_args!("{:o}", mode & 0o777),
                "a NATS secret file is readable or writable by other users: chmod 600 it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawRouterConfig;

    fn nats(pairs: &[(&str, &str)]) -> Result<(), String> {
        let mut raw = RawRouterConfig {
            durability: Some("replicated".into()),
            nats_urls: Some(vec!["nats://127.0.0.1:4222".into()]),
            ..Default::default()
        };
        for (k, v) in pairs {
            match *k {
                "user" => raw.nats_user = Some(v.to_string()),
                "password" => raw.nats_password_file = Some(v.into()),
                "token" => raw.nats_token_file = Some(v.into()),
                "nkey" => raw.nats_nkey_file = Some(v.into()),
                "creds" => raw.nats_creds = Some(v.into()),
                _ => unreachable!(),
            }
        }
        raw.validate().map(drop).map_err(|e| e.to_string())
    }

    #[test]
    fn one_kind_of_credentials_and_a_user_with_its_password_file() {
        assert_eq!(nats(&[]), Ok(()));
        assert_eq!(nats(&[("user", "emq"), ("password", "/p")]), Ok(()));
        assert_eq!(nats(&[("token", "/t")]), Ok(()));
        assert_eq!(nats(&[("nkey", "/n")]), Ok(()));
        assert_eq!(
            nats(&[("user", "emq")]),
            Err("setting nats_password_file: nats_user needs nats_password_file (a file holding the password: \
                 secrets are never given as flag values)"
                .into())
        );
        assert_eq!(nats(&[("password", "/p")]), Err("setting nats_user: nats_password_file needs nats_user".into()));
        assert_eq!(
            nats(&[("user", "emq"), ("password", "/p"), ("token", "/t")]),
            Err("setting nats_token_file: give one kind of NATS credentials, not nats_user and nats_token_file: \
                 nats_user with nats_password_file, nats_token_file, nats_nkey_file or nats_creds"
                .into())
        );
        let err = nats(&[("nkey", "/n"), ("creds", "/c")]).unwrap_err();
        assert!(
            err.starts_with("setting nats_creds: give one kind of NATS credentials, not nats_nkey_file and nats_creds"),
            "{err}"
        );
    }

    /// async-nats traces its CONNECT line (password and all) at `trace`:
    /// the log filter never lets it through, even `trace` for everything.
    #[test]
    fn async_nats_connect_traces_are_never_logged() {
        let ((), log) = crate::logging::capture("trace", || {
            tracing::trace!(target: "async_nats::connection", "write operation: CONNECT pass=hunter2");
            tracing::debug!(target: "async_nats::connection", "debug line");
            tracing::trace!(target: "async_nats::other", "other trace");
        });
        assert!(!log.contains("hunter2"), "{log}");
        assert!(log.contains("debug line") && log.contains("other trace"), "{log}");
    }

    #[test]
    fn secret_files_are_trimmed_and_refused_clearly_without_their_contents() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ok = file("ok", b"  s3cret pass \n");
        assert_eq!(read_secret("nats_password_file", &ok).unwrap(), "s3cret pass");
        let missing = dir.path().join("missing");
        let err = read_secret("nats_password_file", &missing).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "setting nats_password_file: {}: cannot open it: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let empty = file("empty", b" \n\n");
        let err = read_secret("nats_token_file", &empty).unwrap_err().to_string();
        assert_eq!(err, format!("setting nats_token_file: {}: empty (only whitespace)", empty.display()));
        let big = file("big", &vec![b'x'; limits::NATS_SECRET_MAX_BYTES as usize + 1]);
        let err = read_secret("nats_token_file", &big).unwrap_err().to_string();
        assert!(err.ends_with("larger than 65536 bytes: not a secret file"), "{err}");
        let not_seed = file("notseed", b"SUnotaseed\n");
        let err = read_seed(&not_seed).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("setting nats_nkey_file: {}: not an NKey seed (", not_seed.display())),
            "{err}"
        );
        assert!(!err.contains("SUnotaseed"), "{err}");
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let err = read_seed(&file("account", account.as_bytes())).unwrap_err().to_string();
        assert!(err.ends_with("an NKey seed, but not a user's (a user seed starts SU)"), "{err}");
        assert!(!err.contains(&account), "{err}");
        let user = nkeys::KeyPair::new_user().seed().unwrap();
        assert_eq!(read_seed(&file("user", format!("{user}\n").as_bytes())).unwrap(), user);
    }
}
