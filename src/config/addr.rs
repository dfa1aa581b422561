//! The one address parser every program uses, for flags, variables, config
//! files and the client library alike. A refusal says what was given, what
//! is wrong with it and the form expected:
//!
//! ```
//! use emq::config::addr;
//! assert_eq!(addr::emqp("tcp://127.0.0.1:47291"), Ok(()));
//! let e = addr::emqp("127.0.0.1:47293").unwrap_err().to_string();
//! assert_eq!(e, "\"127.0.0.1:47293\" is not an eMQP address (no tcp://): \
//!                eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291");
//! let e = addr::text("tcp://127.0.0.1:47294").unwrap_err().to_string();
//! assert_eq!(e, "\"tcp://127.0.0.1:47294\" is not a text address (no tcp:// here): \
//!                the text address is host:port, e.g. 127.0.0.1:47294");
//! ```
//!
//! eMQP addresses are ZeroMQ endpoints: `tcp://host:port` (host a name, an
//! IP address, `[IPv6]` or `*`; port 1 to 65535, or `*` to bind any free
//! port), `ipc://path` or `inproc://name`. The text address is `host:port`.
//!
//! A host that can only be meant as an IP address must be a valid one: one
//! of digits and dots is read as an IPv4 address and must be four numbers
//! from 0 to 255 (`256.1.1.1`, `1.2.3` and `1.2.3.4.5` are refused at start,
//! not found unreachable later), and one in brackets must be an IPv6
//! address (a `%zone` after it is left to the system). Every program's
//! eMQP and text addresses go through this check: the settings of
//! emq-router, emq-worker, emq-cli, emq-scheduler and emq-pubsub, the
//! client library (every eMQP client's connect) and emq-bench's address
//! flags.
//!
//! ```
//! use emq::config::addr;
//! let e = addr::emqp("tcp://256.1.1.1:5").unwrap_err().to_string();
//! assert_eq!(e, "\"tcp://256.1.1.1:5\" is not an eMQP address \
//!                (\"256.1.1.1\" is not an IPv4 address: it needs four numbers from 0 to 255): \
//!                eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291");
//! ```

/// An address that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not {what} ({why}): {expected}")]
pub struct AddrError {
    /// The text as given.
    pub given: String,
    /// Which kind of address was expected (`an eMQP address`).
    pub what: &'static str,
    /// What is wrong.
    pub why: String,
    /// The form expected, with an example.
    pub expected: &'static str,
}

/// What an eMQP address looks like.
pub const EMQP_FORM: &str = "eMQP addresses look like tcp://host:port, e.g. tcp://127.0.0.1:47291";
/// What the text address looks like.
pub const TEXT_FORM: &str = "the text address is host:port, e.g. 127.0.0.1:47294";

/// Checks an eMQP (ZeroMQ) address.
///
/// # Errors
/// [`AddrError`] naming the problem and showing [`EMQP_FORM`].
pub fn emqp(given: &str) -> Result<(), AddrError> {
    let refuse = |why: String| AddrError { given: given.into(), what: "an eMQP address", why, expected: EMQP_FORM };
    let Some((scheme, rest)) = given.split_once("://") else {
        return Err(refuse("no tcp://".into()));
    };
    match scheme {
        "tcp" => host_port(rest, true).map_err(refuse),
        "ipc" | "inproc" if !rest.is_empty() => Ok(()),
        "ipc" | "inproc" => Err(refuse(format!("nothing after {scheme}://"))),
        other => Err(refuse(format!("unknown transport {other:?}; use tcp"))),
    }
}

/// Splits and checks a list of eMQP addresses, separated by commas
/// (`tcp://a:47291,tcp://b:47291`; spaces around an address are ignored):
/// the routers a client, worker or scheduler follows (docs/failover.md).
/// One address is a list of one, so every single address written before
/// lists existed means what it meant.
///
/// ```
/// use emq::config::addr;
/// assert_eq!(addr::emqp_list("tcp://a:1, tcp://b:2"), Ok(vec!["tcp://a:1".to_string(), "tcp://b:2".to_string()]));
/// assert_eq!(addr::emqp_list("tcp://a:1"), Ok(vec!["tcp://a:1".to_string()]));
/// ```
///
/// # Errors
/// [`AddrError`] for the first address that does not parse, or for an
/// empty list or an empty item (`tcp://a:1,,tcp://b:2`).
pub fn emqp_list(given: &str) -> Result<Vec<String>, AddrError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for item in given.split([',', ';']).map(str::trim) {
        if item.is_empty() {
            let why = if given.trim().is_empty() { "no address" } else { "an empty item in the list" };
            return Err(AddrError {
                given: given.into(),
                what: "a list of eMQP addresses",
                why: why.into(),
                expected: EMQP_LIST_FORM,
            });
        }
        emqp(item)?;
        if seen.insert(item) {
            out.push(item.to_string());
        }
    }
    Ok(out)
}

/// Splits a list of eMQP addresses into owners (docs/scaleout.md):
/// `;` separates the router names a program spreads its work over, `,`
/// the addresses of one name (its owner and standby, docs/failover.md).
/// `tcp://a:1,tcp://a2:1;tcp://b:1` is two owners, the first with a
/// standby. A list without `;` is one owner, so every list written before
/// scale-out means what it meant. An address named twice is kept once, in
/// its first owner.
///
/// ```
/// use emq::config::addr;
/// let owners = addr::emqp_owners("tcp://a:1, tcp://a2:1; tcp://b:1").unwrap();
/// assert_eq!(owners, vec![vec!["tcp://a:1".to_string(), "tcp://a2:1".into()], vec!["tcp://b:1".into()]]);
/// assert_eq!(addr::emqp_owners("tcp://a:1,tcp://b:1").unwrap().len(), 1);
/// assert!(addr::emqp_owners("tcp://a:1;;tcp://b:1").is_err());
/// let many = (1..=65).map(|p| format!("tcp://a:{p}")).collect::<Vec<_>>().join(";");
/// assert!(addr::emqp_owners(&many).unwrap_err().to_string().contains("65 owners, more than 64"));
/// ```
///
/// # Errors
/// As [`emqp_list`], for the whole list or any owner's part; more than
/// [`crate::limits::MAX_OWNERS`] owners.
pub fn emqp_owners(given: &str) -> Result<Vec<Vec<String>>, AddrError> {
    emqp_list(given)?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for part in given.split(';') {
        let group: Vec<String> = emqp_list(part)?.into_iter().filter(|a| seen.insert(a.clone())).collect();
        if !group.is_empty() {
            out.push(group);
        }
    }
    too_many_owners(given, "a list of eMQP addresses", EMQP_LIST_FORM, out.len())?;
    Ok(out)
}

/// Refuses a list of more than [`crate::limits::MAX_OWNERS`] owners.
fn too_many_owners(given: &str, what: &'static str, expected: &'static str, n: usize) -> Result<(), AddrError> {
    if n <= crate::limits::MAX_OWNERS {
        return Ok(());
    }
    let why = format!("{n} owners, more than {}", crate::limits::MAX_OWNERS);
    let shown: String = given.chars().take(200).collect();
    Err(AddrError { given: shown, what, why, expected })
}

/// Splits a list of text addresses (`host:port`) into owners as
/// [`emqp_owners`] does: `;` between router names, `,` between the
/// addresses of one name.
///
/// ```
/// use emq::config::addr;
/// let owners = addr::text_owners("127.0.0.1:1;127.0.0.1:2").unwrap();
/// assert_eq!(owners, vec![vec!["127.0.0.1:1".to_string()], vec!["127.0.0.1:2".to_string()]]);
/// ```
///
/// # Errors
/// [`AddrError`] for the first address that does not parse, an empty list
/// or an empty item.
pub fn text_owners(given: &str) -> Result<Vec<Vec<String>>, AddrError> {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for part in given.split(';') {
        let mut group = Vec::new();
        for item in part.split(',').map(str::trim) {
            if item.is_empty() {
                let why = if given.trim().is_empty() { "no address" } else { "an empty item in the list" };
                return Err(AddrError {
                    given: given.into(),
                    what: "a list of text addresses",
                    why: why.into(),
                    expected: TEXT_FORM,
                });
            }
            text(item)?;
            if seen.insert(item) {
                group.push(item.to_string());
            }
        }
        if !group.is_empty() {
            out.push(group);
        }
    }
    too_many_owners(given, "a list of text addresses", TEXT_FORM, out.len())?;
    Ok(out)
}

/// What a list of eMQP addresses looks like.
pub const EMQP_LIST_FORM: &str = "eMQP addresses look like tcp://host:port, several separated by commas (one router \
     name's owner and standby) or semicolons (several router names), e.g. tcp://10.0.0.1:47291,tcp://10.0.0.2:47291";

/// [`emqp`] as a command-line value parser (`#[arg(value_parser =
/// addr::emqp_arg)]`): the address itself when it passes.
///
/// # Errors
/// [`AddrError`], as [`emqp`].
pub fn emqp_arg(given: &str) -> Result<String, AddrError> {
    emqp(given).map(|()| given.to_string())
}

/// [`emqp_list`] as a command-line value parser: the list as given
/// (several addresses separated by commas) when every address passes.
///
/// # Errors
/// [`AddrError`], as [`emqp_list`].
pub fn emqp_list_arg(given: &str) -> Result<String, AddrError> {
    emqp_list(given).map(|list| list.join(","))
}

/// [`text`] as a command-line value parser: the address itself when it
/// passes.
///
/// # Errors
/// [`AddrError`], as [`text`].
pub fn text_arg(given: &str) -> Result<String, AddrError> {
    text(given).map(|()| given.to_string())
}

/// [`text_owners`] as a command-line value parser: the list as written
/// (emq-bench's `--addr`).
///
/// # Errors
/// As [`text_owners`].
pub fn text_owners_arg(given: &str) -> Result<String, AddrError> {
    text_owners(given).map(|_| given.to_string())
}

/// Checks a text-protocol address (`host:port`) and splits it.
///
/// # Errors
/// [`AddrError`] naming the problem and showing [`TEXT_FORM`].
pub fn text(given: &str) -> Result<(), AddrError> {
    let refuse = |why: String| AddrError { given: given.into(), what: "a text address", why, expected: TEXT_FORM };
    if let Some((scheme, _)) = given.split_once("://") {
        return Err(refuse(format!("no {scheme}:// here")));
    }
    host_port(given, false).map_err(refuse)
}

/// Checks `host:port`; `star` allows `*` for either.
fn host_port(text: &str, star: bool) -> Result<(), String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("no :port".into());
    };
    if host.is_empty() {
        return Err("no host before the port".into());
    }
    if host.contains('/') {
        return Err(format!("{host:?} is not a host name"));
    }
    if host == "*" && !star {
        return Err("the host must not be *".into());
    }
    ip_literal(host)?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 || !star => Ok(()),
        _ if star && port == "*" => Ok(()),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// Checks a host that can only be an IP address: digits and dots (IPv4)
/// or brackets (IPv6). Names (`localhost`, `db-1.example`), interface names
/// and `*` pass; so does an IPv6 zone (`[fe80::1%eth0]`), after the address.
fn ip_literal(host: &str) -> Result<(), String> {
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(format!("{host:?} has no closing ]"));
        };
        let addr = inner.split_once('%').map_or(inner, |(addr, _zone)| addr);
        return match addr.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => Err(format!("{host:?} is not an IPv6 address in brackets")),
        };
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') && host.parse::<std::net::Ipv4Addr>().is_err() {
        return Err(format!("{host:?} is not an IPv4 address: it needs four numbers from 0 to 255"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(r: Result<(), AddrError>) -> String {
        r.unwrap_err().why
    }

    #[test]
    fn emqp_addresses() {
        for ok in
            ["tcp://127.0.0.1:1", "tcp://*:47291", "tcp://127.0.0.1:*", "tcp://[::1]:5", "ipc:///tmp/x", "inproc://a"]
        {
            assert_eq!(emqp(ok), Ok(()), "{ok}");
        }
        assert_eq!(why(emqp("localhost:1")), "no tcp://");
        assert_eq!(why(emqp("udp://a:1")), "unknown transport \"udp\"; use tcp");
        assert_eq!(why(emqp("tcp://a")), "no :port");
        assert_eq!(why(emqp("tcp://:1")), "no host before the port");
        assert_eq!(why(emqp("tcp://a:0")), "port \"0\" is not a number from 1 to 65535");
        assert_eq!(why(emqp("tcp://a:70000")), "port \"70000\" is not a number from 1 to 65535");
        assert_eq!(why(emqp("ipc://")), "nothing after ipc://");
    }

    #[test]
    fn ip_literals_must_be_valid() {
        for ok in [
            "tcp://0.0.0.0:1",
            "tcp://255.255.255.255:1",
            "tcp://[::]:1",
            "tcp://[fe80::1%eth0]:1",
            "tcp://[::ffff:1.2.3.4]:1",
            "tcp://db-1.example:1",
            "tcp://eth0:1",
            "tcp://1a.2.3.4:1",
        ] {
            assert_eq!(emqp(ok), Ok(()), "{ok}");
        }
        let v4 = |h: &str| format!("{h:?} is not an IPv4 address: it needs four numbers from 0 to 255");
        for bad in ["256.1.1.1", "1.2.3", "1.2.3.4.5", "1..2.3", "01.2.3.4", "999", "1.2.3.4."] {
            assert_eq!(why(emqp(&format!("tcp://{bad}:5"))), v4(bad), "{bad}");
            assert_eq!(why(text(&format!("{bad}:5"))), v4(bad), "{bad}");
        }
        assert_eq!(why(emqp("tcp://[::g]:5")), "\"[::g]\" is not an IPv6 address in brackets");
        assert_eq!(why(emqp("tcp://[1.2.3.4]:5")), "\"[1.2.3.4]\" is not an IPv6 address in brackets");
        assert_eq!(why(emqp("tcp://[::1:5")), "\"[::1\" has no closing ]");
        assert_eq!(why(text("[::1:5")), "\"[::1\" has no closing ]");
    }

    #[test]
    fn emqp_address_lists() {
        let list = |s: &str| emqp_list(s).map_err(|e| e.why);
        assert_eq!(list("tcp://127.0.0.1:47291"), Ok(vec!["tcp://127.0.0.1:47291".to_string()]));
        assert_eq!(
            list(" tcp://a:1 ,tcp://b:2,ipc:///tmp/x"),
            Ok(vec!["tcp://a:1".to_string(), "tcp://b:2".to_string(), "ipc:///tmp/x".to_string()])
        );
        assert_eq!(list("tcp://a:1,tcp://a:1"), Ok(vec!["tcp://a:1".to_string()]), "a repeat is dropped");
        assert_eq!(list(""), Err("no address".to_string()));
        assert_eq!(list(" , "), Err("an empty item in the list".to_string()));
        assert_eq!(list("tcp://a:1,,tcp://b:2"), Err("an empty item in the list".to_string()));
        assert_eq!(list("tcp://a:1,"), Err("an empty item in the list".to_string()));
        let e = emqp_list("tcp://a:1,b:2").unwrap_err();
        assert_eq!((e.given.as_str(), e.why.as_str()), ("b:2", "no tcp://"));
    }

    #[test]
    fn text_addresses() {
        for ok in ["127.0.0.1:47294", "localhost:1", "[::1]:2", "0.0.0.0:0"] {
            assert_eq!(text(ok), Ok(()), "{ok}");
        }
        assert_eq!(why(text("tcp://127.0.0.1:1")), "no tcp:// here");
        assert_eq!(why(text("127.0.0.1")), "no :port");
        assert_eq!(why(text("*:1")), "the host must not be *");
        assert_eq!(why(text("h:x")), "port \"x\" is not a number from 1 to 65535");
    }
}
