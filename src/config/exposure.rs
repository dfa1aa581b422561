//! The safe default for plain listeners (docs/security.md, "Safe
//! default"): a listener with neither encryption nor authentication (a
//! NULL-mechanism eMQP socket, the plaintext text protocol, plain HTTP)
//! may bind only a loopback address unless `allow_insecure_remote` is set;
//! then each such listener is named in a warning at start.
//!
//! Loopback is `127.0.0.0/8` and `::1` (an `ipc://` or `inproc://` eMQP
//! endpoint is not on the network and passes too). Everything else counts
//! as remote: `0.0.0.0`, `::`, ZeroMQ's `*`, any other address, and every
//! host or interface name (names are not resolved: write `127.0.0.1` for a
//! local-only listener).
//!
//! Each program passes [`check_plain_listeners`] the list of its **plain**
//! listeners only: an encrypted endpoint (a `*_curve` eMQP endpoint, the
//! text protocol over TLS, an HTTP listener with TLS configured) is left
//! out of the list by the program, which is the hook for those exceptions.

use std::net::IpAddr;

use super::ConfigError;

/// The setting, flag and variable that allow plain remote listeners.
pub const ALLOW_SETTING: &str = "allow_insecure_remote (--allow-insecure-remote, EMQ_ALLOW_INSECURE_REMOTE)";

/// A plain listener: the name of the setting that gives its address, and
/// the address as given (`tcp://host:port` for eMQP, `host:port` for the
/// text and HTTP listeners).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainListener {
    /// The setting's name (`frontend`, `text`, `pubsub_in`).
    pub setting: &'static str,
    /// The address to bind, as given.
    pub addr: String,
}

impl PlainListener {
    /// The listener of `setting` at `addr`.
    pub fn new(setting: &'static str, addr: impl Into<String>) -> PlainListener {
        PlainListener { setting, addr: addr.into() }
    }
}

/// True when `addr` binds only the loopback interface (module docs):
/// `tcp://127.x.y.z:port`, `tcp://[::1]:port`, `127.x.y.z:port`,
/// `[::1]:port`, or an `ipc://` / `inproc://` endpoint.
///
/// ```
/// use emq::config::exposure::is_loopback;
/// assert!(is_loopback("tcp://127.0.0.1:47291") && is_loopback("[::1]:47294") && is_loopback("ipc:///run/emq"));
/// assert!(!is_loopback("tcp://*:47291") && !is_loopback("0.0.0.0:47294") && !is_loopback("tcp://localhost:1"));
/// ```
pub fn is_loopback(addr: &str) -> bool {
    let rest = match addr.split_once("://") {
        Some(("ipc" | "inproc", _)) => return true,
        Some((_, rest)) => rest,
        None => addr,
    };
    let Some((host, _port)) = rest.rsplit_once(':') else { return false };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Refuses the first of `plain` that binds a non-loopback address, unless
/// `allow` (`allow_insecure_remote`); with `allow`, logs a warning naming
/// each such listener and returns `Ok`.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the listener's setting, e.g.
/// `setting frontend: "tcp://0.0.0.0:47291" is a plain listener (no
/// encryption, no authentication) on a non-loopback address: bind a loopback
/// address (127.0.0.1 or ::1), use the encrypted (CURVE or TLS) endpoint
/// instead, or set allow_insecure_remote (--allow-insecure-remote,
/// EMQ_ALLOW_INSECURE_REMOTE) to accept the risk`.
pub fn check_plain_listeners(plain: &[PlainListener], allow: bool) -> Result<(), ConfigError> {
    for listener in plain.iter().filter(|l| !is_loopback(&l.addr)) {
        if allow {
            tracing::warn!(
                setting = listener.setting,
                addr = %listener.addr,
                "a plain listener (no encryption, no authentication) on a non-loopback address, allowed by \
                 allow_insecure_remote"
            );
        } else {
            return Err(ConfigError::Invalid {
                name: listener.setting,
                why: format!(
                    "{:?} is a plain listener (no encryption, no authentication) on a non-loopback address: bind \
                     a loopback address (127.0.0.1 or ::1), use the encrypted (CURVE or TLS) endpoint instead, \
                     or set {ALLOW_SETTING} to accept the risk",
                    listener.addr
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_127_slash_8_and_colon_colon_1_only() {
        for local in [
            "tcp://127.0.0.1:1",
            "tcp://127.1.2.3:*",
            "tcp://[::1]:5",
            "127.0.0.1:47294",
            "127.255.255.254:2",
            "[::1]:3",
            "ipc:///tmp/x",
            "inproc://a",
        ] {
            assert!(is_loopback(local), "{local}");
        }
        for remote in [
            "tcp://*:47291",
            "tcp://0.0.0.0:1",
            "tcp://[::]:1",
            "tcp://10.0.0.1:1",
            "tcp://localhost:1",
            "tcp://eth0:1",
            "0.0.0.0:47294",
            "[::]:1",
            "192.168.1.2:3",
            "localhost:1",
            "128.0.0.1:1",
            "[::ffff:10.0.0.1]:1",
        ] {
            assert!(!is_loopback(remote), "{remote}");
        }
    }

    #[test]
    fn a_remote_plain_listener_is_refused_unless_allowed_then_warned_of() {
        let plain = [PlainListener::new("frontend", "tcp://127.0.0.1:1"), PlainListener::new("text", "0.0.0.0:2")];
        assert_eq!(
            check_plain_listeners(&plain, false).unwrap_err().to_string(),
            "setting text: \"0.0.0.0:2\" is a plain listener (no encryption, no authentication) on a non-loopback \
             address: bind a loopback address (127.0.0.1 or ::1), use the encrypted (CURVE or TLS) endpoint \
             instead, or set allow_insecure_remote (--allow-insecure-remote, EMQ_ALLOW_INSECURE_REMOTE) to \
             accept the risk"
        );
        let (result, log) = crate::logging::capture("warn", || check_plain_listeners(&plain, true));
        assert!(result.is_ok());
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("setting=\"text\"") || log.contains("setting=text"), "{log}");
        assert!(log.contains("0.0.0.0:2") && !log.contains("127.0.0.1:1"), "{log}");
        assert_eq!(check_plain_listeners(&plain[..1], false).map_err(|e| e.to_string()), Ok(()));
    }
}
