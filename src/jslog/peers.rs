//! The other router names of a stream prefix, as a replicated router sees
//! them on the cluster: for STATUS (`emq.wal.nats.other_routers`), the
//! status page (links to their pages) and `emq-cli` (docs/admin.md).
//!
//! Every router of a stream prefix shares two key-value buckets
//! ([`super::owner`]): `<prefix>_routers`, one lease key per live router
//! name whose value is its holder record ([`holder_record`]), and
//! `<prefix>_layouts`, one key per name that has streams. A name with a
//! lease is `live`; a name with streams and no lease is not (its router
//! stopped, or died and its lease expired). The lease code lists both
//! every [`limits::PEER_ROUTERS_POLL`] ([`list`]) and keeps the answer
//! here ([`Peers`]).
//!
//! Holder records are JSON objects; every field is optional when read, so
//! the records of older routers (no `admin`, no `status_page`) and of
//! other programs stay readable. A value that is not such an object, or
//! longer than [`limits::PEER_HOLDER_MAX_BYTES`], is kept as `unreadable`.

use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::RouterConfig;
use crate::limits;

/// A router's holder record: what the lease key of its name holds.
/// Fields absent from older records are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Holder {
    /// The machine's host name.
    pub host: Option<String>,
    /// The router's process id.
    pub pid: Option<u64>,
    /// Its eMQP frontend address, as configured.
    pub frontend: Option<String>,
    /// Its admin address (`tcp://host:port`; a wildcard host replaced by
    /// `host`); absent when the port is chosen at bind time.
    pub admin: Option<String>,
    /// The URL of its status page (`http://host:port/`, `https://` with
    /// `metrics_tls_cert_file`); absent when `metrics` is off.
    pub status_page: Option<String>,
    /// When it started, Unix milliseconds.
    pub since_unix_ms: Option<u64>,
}

/// Another router name of the stream prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRouter {
    /// The router name (a key of the buckets).
    pub name: String,
    /// Whether a lease on the name is held (a router runs with it).
    pub live: bool,
    /// Its holder record, when live and readable.
    pub holder: Option<Holder>,
    /// Whether the lease holds a value that is no holder record.
    pub unreadable: bool,
    /// Time since the lease was last renewed, by the NATS server's clock
    /// against this machine's (renewed every third of `nats_lease`).
    pub lease_age: Option<Duration>,
}

impl PeerRouter {
    /// The link to its status page when its record gives one that is an
    /// `http://` or `https://` URL (it comes from the cluster: anything
    /// else is not linked).
    pub fn status_page(&self) -> Option<&str> {
        let url = self.holder.as_ref()?.status_page.as_deref()?;
        (url.starts_with("http://") || url.starts_with("https://")).then_some(url)
    }

    /// As JSON (docs/emqp.md "STATUS"): `name`, `live`, `lease_age_ms`,
    /// `unreadable`, and the holder record's fields (`host`, `pid`,
    /// `frontend`, `admin`, `status_page`, `since_unix_ms`; null when
    /// unknown).
    pub fn to_json(&self) -> Value {
        let h = self.holder.clone().unwrap_or_default();
        json!({
            "name": self.name,
            "live": self.live,
            "lease_age_ms": self.lease_age.map(|a| a.as_millis() as u64),
            "unreadable": self.unreadable,
            "host": h.host,
            "pid": h.pid,
            "frontend": h.frontend,
            "admin": h.admin,
            "status_page": h.status_page,
            "since_unix_ms": h.since_unix_ms,
        })
    }
}

/// What the last listing found.
#[derive(Debug, Default)]
struct View {
    routers: Vec<PeerRouter>,
    /// Names past [`limits::PEER_ROUTERS_MAX`], not listed.
    not_listed: usize,
    /// When the last listing ended well.
    read: Option<Instant>,
    /// Why the last listing failed (cleared by the next good one).
    error: Option<String>,
}

/// The other router names, shared by the lease code that lists them and
/// the threads that show them.
#[derive(Debug, Default)]
pub struct Peers {
    view: Mutex<View>,
}

impl Peers {
    /// A listing ended well: `routers` (by name), `not_listed` more.
    pub fn set(&self, routers: Vec<PeerRouter>, not_listed: usize) {
        let mut v = self.view.lock();
        v.routers = routers;
        v.not_listed = not_listed;
        v.read = Some(Instant::now());
        v.error = None;
    }

    /// A listing failed: the previous one stays, with `why`.
    pub fn failed(&self, why: String) {
        self.view.lock().error = Some(why);
    }

    /// The other router names as last listed, by name.
    pub fn list(&self) -> Vec<PeerRouter> {
        self.view.lock().routers.clone()
    }

    /// As JSON: `routers` ([`PeerRouter::to_json`], by name), `not_listed`,
    /// `read_ms_ago` (null before the first listing), `error` (the last
    /// listing's failure, null when it went well).
    pub fn to_json(&self) -> Value {
        let v = self.view.lock();
        json!({
            "routers": v.routers.iter().map(PeerRouter::to_json).collect::<Vec<_>>(),
            "not_listed": v.not_listed,
            "read_ms_ago": v.read.map(|r| r.elapsed().as_millis() as u64),
            "error": v.error,
        })
    }
}

/// `tcp://*:5` or `0.0.0.0:5` with the wildcard host replaced by `host`
/// (others connect to the machine's name); `None` for port 0 (chosen at
/// bind time, unknown when the record is written).
fn reachable(addr: &str, host: &str) -> Option<String> {
    let (scheme, rest) = match addr.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), addr),
    };
    let (h, port) = rest.rsplit_once(':')?;
    if port == "0" {
        return None;
    }
    let wild = matches!(h, "*" | "0.0.0.0" | "[::]" | "::" | "");
    let h = if wild && !host.is_empty() { host } else { h };
    Some(format!("{scheme}{h}:{port}"))
}

/// This router's holder record (module docs) as written into its lease
/// key: host, pid, frontend, admin, status page, start time.
pub fn holder_record(config: &RouterConfig, host: &str) -> String {
    let tls = config.metrics_tls_cert_file.is_some();
    let page = config
        .metrics_addr
        .and_then(|a| reachable(&a.to_string(), host))
        .map(|hp| format!("{}://{hp}/", if tls { "https" } else { "http" }));
    let record = Holder {
        host: Some(host.to_string()),
        pid: Some(u64::from(std::process::id())),
        frontend: Some(config.frontend_addr.to_string()),
        admin: reachable(&config.admin_addr, host),
        status_page: page,
        since_unix_ms: Some(crate::job::unix_ms_now()),
    };
    serde_json::to_string(&record).unwrap_or_default()
}

/// Reads a lease value as a holder record; `None` when it is none.
pub fn read_holder(value: &[u8]) -> Option<Holder> {
    if value.len() > limits::PEER_HOLDER_MAX_BYTES {
        return None;
    }
    serde_json::from_slice::<Holder>(value).ok()
}

/// The keys of `store`, at most `max` (plus whether there were more).
async fn keys(store: &kv::Store, max: usize) -> Result<(Vec<String>, usize), String> {
    let mut keys = store.keys().await.map_err(|e| e.to_string())?;
    let (mut out, mut more) = (Vec::new(), 0usize);
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| e.to_string())?;
        if out.len() < max {
            out.push(key);
        } else {
            more += 1;
        }
    }
    Ok((out, more))
}

/// Lists the other router names (module docs): every name with a lease in
/// `routers` or streams in `layouts` but `own`, by name, at most
/// [`limits::PEER_ROUTERS_MAX`]; and how many more there are.
///
/// # Errors
/// A bucket that cannot be listed or read (the message says which).
pub async fn list(
    routers: &kv::Store,
    layouts: Option<&kv::Store>,
    own: &str,
) -> Result<(Vec<PeerRouter>, usize), String> {
    let max = limits::PEER_ROUTERS_MAX + 1;
    let (live, more_live) = keys(routers, max).await.map_err(|e| format!("lease bucket: {e}"))?;
    let (laid, more_laid) = match layouts {
        Some(l) => keys(l, max).await.map_err(|e| format!("layout bucket: {e}"))?,
        None => (Vec::new(), 0),
    };
    let leased: std::collections::BTreeSet<String> = live.iter().cloned().collect();
    let mut names: Vec<(String, bool)> = live.into_iter().map(|k| (k, true)).collect();
    names.extend(laid.into_iter().filter(|k| !leased.contains(k)).map(|k| (k, false)));
    names.retain(|(n, _)| n != own);
    names.sort();
    let not_listed = names.len().saturating_sub(limits::PEER_ROUTERS_MAX) + more_live + more_laid;
    names.truncate(limits::PEER_ROUTERS_MAX);
    let mut out = Vec::with_capacity(names.len());
    for (name, live) in names {
        let mut peer = PeerRouter { name, live, holder: None, unreadable: false, lease_age: None };
        if live {
            match routers.entry(&peer.name).await {
                Ok(Some(e)) if e.operation == kv::Operation::Put => {
                    peer.holder = read_holder(&e.value);
                    peer.unreadable = peer.holder.is_none();
                    let renewed: SystemTime = e.created.into();
                    peer.lease_age = Some(SystemTime::now().duration_since(renewed).unwrap_or_default());
                }
                // Gone between the listing and the read: stopped.
                Ok(_) => peer.live = false,
                Err(e) => return Err(format!("lease of {}: {e}", peer.name)),
            }
        }
        out.push(peer);
    }
    Ok((out, not_listed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_hosts_are_named_and_port_zero_is_unknown() {
        assert_eq!(reachable("tcp://*:5", "box").as_deref(), Some("tcp://box:5"));
        assert_eq!(reachable("tcp://127.0.0.1:5", "box").as_deref(), Some("tcp://127.0.0.1:5"));
        assert_eq!(reachable("0.0.0.0:80", "box").as_deref(), Some("box:80"));
        assert_eq!(reachable("[::]:80", "box").as_deref(), Some("box:80"));
        assert_eq!(reachable("tcp://127.0.0.1:0", "box"), None);
    }

    #[test]
    fn old_records_and_strangers_stay_readable() {
        // A record of a router before `admin` and `status_page`.
        let old = br#"{"host":"h","pid":7,"frontend":"tcp://h:1","since_unix_ms":5}"#;
        let h = read_holder(old).expect("an old record reads");
        assert_eq!((h.pid, h.admin, h.status_page), (Some(7), None, None));
        assert_eq!(read_holder(b"not json"), None);
        assert_eq!(read_holder(&vec![b' '; limits::PEER_HOLDER_MAX_BYTES + 1]), None);
        let peer = PeerRouter {
            name: "b".into(),
            live: true,
            holder: Some(Holder { status_page: Some("javascript:alert(1)".into()), ..Holder::default() }),
            unreadable: false,
            lease_age: None,
        };
        assert_eq!(peer.status_page(), None, "only http(s) URLs are links");
        assert_eq!(peer.to_json()["status_page"], "javascript:alert(1)");
    }
}
