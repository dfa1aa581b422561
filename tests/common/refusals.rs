//! The four CURVE refusals every CURVE endpoint must make (issue 29): an
//! unknown client key, the right key with a wrong server key, a plain
//! (NULL) peer, and a key from another socket's allow-list; each refused
//! and counted under its handshake outcome (docs/security.md "CURVE").

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::wait;

/// One refused peer: its `.key_secret` and the server `.key` it expects
/// (both `None`: a plain peer), and the handshake outcome the server counts.
pub struct Refusal {
    /// For messages: `unknown key`, `wrong server key`, `plain`, `other socket's key`.
    pub name: &'static str,
    /// The client's secret key file, `None` for a plain peer.
    pub key: Option<PathBuf>,
    /// The server's public key file the client uses, `None` for a plain peer.
    pub server: Option<PathBuf>,
    /// The outcome counted (`emq::curve::handshakes::OUTCOMES`), or
    /// several separated by `|` when either may be counted ([`check`]
    /// adds them up).
    pub outcome: &'static str,
}

/// The four refusals of an endpoint whose server key is `server` and that
/// allows `right`: `stranger` is in no allow-list, `other` in another
/// socket's.
pub fn four(right: &Path, server: &Path, stranger: &Path, other: &Path) -> [Refusal; 4] {
    let case = |name, key: &Path, server: &Path, outcome| Refusal {
        name,
        key: Some(key.to_path_buf()),
        server: Some(server.to_path_buf()),
        outcome,
    };
    [
        case("unknown key", stranger, server, "unknown_key"),
        case("wrong server key", right, &stranger.with_extension("key"), "bad_server_key_or_protocol"),
        // libzmq 4.3.4 races here: the server counts `mechanism_mismatch`
        // when it reads the plain greeting first, `no_detail` when the
        // plain peer saw the mismatch first and hung up (docs/security.md
        // "Counters").
        Refusal { name: "plain", key: None, server: None, outcome: "mechanism_mismatch|no_detail" },
        case("other socket's key", other, server, "unknown_key"),
    ]
}

/// For each refusal in turn: `attempt` (which returns once the peer gave
/// up) must return `false` (refused), and `count(outcome)` (summed over the
/// `|`-separated outcomes) must then grow by at least one within 30 s. Counts are read after a settle time, so
/// that a late event of the previous attempt is not taken for this one's.
pub fn check(cases: &[Refusal], mut attempt: impl FnMut(&Refusal) -> bool, count: impl Fn(&str) -> u64) {
    let total = |outcome: &str| -> u64 { outcome.split('|').map(&count).sum() };
    for case in cases {
        std::thread::sleep(Duration::from_millis(300));
        let before = total(case.outcome);
        assert!(!attempt(case), "{}: let in", case.name);
        let grew = wait::until(Duration::from_secs(30), || total(case.outcome) > before);
        assert!(grew, "{}: {} stayed at {before}", case.name, case.outcome);
    }
}
