//! The CURVE counters of a process in one shape for every program: the
//! handshake counts of each socket with a CURVE endpoint
//! ([`super::handshakes`]) and the ZAP handler's requests by domain and
//! status ([`super::zap::ZapState::counts`]). emq-router puts
//! [`counts_json`] in STATUS (`emq.curve`), emq-scheduler answers it to
//! its admin `STATUS`, emq-pubsub logs [`counts_line`] at exit
//! (docs/security.md "Where the CURVE counters are").

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::handshakes::SocketHandshakes;
use super::zap::ZapState;

/// `{"sockets": {<socket>: {"endpoint": <address>, "handshakes":
/// {<outcome>: n}}}, "zap_requests": {<domain>: {<status>: n}}}`: every
/// outcome of [`super::handshakes::OUTCOMES`] per socket (0 included);
/// ZAP statuses as text (`"200"`, `"400"`, `"500"`), only those seen;
/// `zap_requests` is `{}` without a ZAP handler.
pub fn counts_json(handshakes: &[Arc<SocketHandshakes>], zap: Option<&ZapState>) -> Value {
    let sockets: Map<String, Value> = handshakes
        .iter()
        .map(|h| {
            let counts: Map<String, Value> = h.to_pairs().into_iter().map(|(o, n)| (o.to_string(), json!(n))).collect();
            (h.socket.to_string(), json!({"endpoint": h.endpoint, "handshakes": counts}))
        })
        .collect();
    let mut requests = Map::new();
    for (domain, status, n) in zap.map(ZapState::counts).unwrap_or_default() {
        let entry = requests.entry(domain).or_insert_with(|| json!({}));
        entry[status.to_string()] = json!(n);
    }
    json!({"sockets": sockets, "zap_requests": requests})
}

/// The same counts as one log line:
/// `CURVE handshakes: <socket> ok=N unknown_key=N
/// bad_server_key_or_protocol=N mechanism_mismatch=N no_detail=N; <socket>
/// …; ZAP requests: <domain> 200=N 400=N; <domain> …` (`ZAP requests:
/// none` when none was answered).
pub fn counts_line(handshakes: &[Arc<SocketHandshakes>], zap: Option<&ZapState>) -> String {
    let sockets: Vec<String> = handshakes
        .iter()
        .map(|h| {
            let counts: Vec<String> = h.to_pairs().iter().map(|(o, n)| format!("{o}={n}")).collect();
            format!("{} {}", h.socket, counts.join(" "))
        })
        .collect();
    let mut domains: Vec<(String, Vec<String>)> = Vec::new();
    for (domain, status, n) in zap.map(ZapState::counts).unwrap_or_default() {
        match domains.last_mut() {
            Some((d, list)) if *d == domain => list.push(format!("{status}={n}")),
            _ => domains.push((domain, vec![format!("{status}={n}")])),
        }
    }
    let zap: Vec<String> = domains.into_iter().map(|(d, list)| format!("{d} {}", list.join(" "))).collect();
    let zap = if zap.is_empty() { "none".to_string() } else { zap.join("; ") };
    format!("CURVE handshakes: {}; ZAP requests: {zap}", sockets.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn json_and_line_show_every_outcome_and_the_zap_statuses_seen() {
        let h = Arc::new(SocketHandshakes::new("in", "tcp://127.0.0.1:5".into()));
        h.counts[0].store(2, std::sync::atomic::Ordering::Relaxed);
        h.counts[3].store(1, std::sync::atomic::Ordering::Relaxed);
        let zap = ZapState::default();
        zap.set_domain("publishers", HashMap::new());
        let v = counts_json(std::slice::from_ref(&h), Some(&zap));
        assert_eq!(v["sockets"]["in"]["endpoint"], "tcp://127.0.0.1:5");
        assert_eq!(v["sockets"]["in"]["handshakes"]["ok"], 2);
        assert_eq!(v["sockets"]["in"]["handshakes"]["no_detail"], 0);
        assert_eq!(v["zap_requests"], json!({}));
        assert_eq!(
            counts_line(&[h], None),
            "CURVE handshakes: in ok=2 unknown_key=0 bad_server_key_or_protocol=0 mechanism_mismatch=1 no_detail=0; \
             ZAP requests: none"
        );
    }
}
