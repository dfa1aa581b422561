//! Basic authentication for the HTTP server (`metrics_basic_auth_file`),
//! in the convention of the Prometheus exporters (exporter-toolkit's
//! `basic_auth_users`: bcrypt hashes of the passwords).
//!
//! The file holds one `user:<bcrypt hash>` per line, which is what
//! `htpasswd -nBC 10 user` prints; `#` starts a comment line, blank lines
//! are skipped. At most [`limits::HTTP_AUTH_FILE_MAX_LINES`] lines and
//! [`limits::HTTP_AUTH_FILE_MAX_BYTES`] bytes, hashes of cost at most
//! [`limits::HTTP_AUTH_MAX_BCRYPT_COST`]; a bad line is an error naming its
//! number. The file is read at start (an error stops the router) and again
//! when its modification time, size or inode changed, looked at on a
//! request at most every [`limits::HTTP_AUTH_RELOAD_CHECK`]; a bad new
//! file keeps the users loaded before and is logged once.
//!
//! bcrypt is slow on purpose (about 70 ms at cost 10) and runs on the
//! HTTP server's one thread, so:
//!
//! * a successful check is cached as `(user, SHA-256 of the password)` for
//!   the file's current version (at most [`limits::HTTP_AUTH_CACHE_ENTRIES`];
//!   a reload empties it), and a scraper pays for bcrypt once;
//! * failed checks may use at most [`limits::HTTP_AUTH_FAILURE_BUDGET`] of
//!   each second; past it a request whose credentials are not cached is
//!   answered `429` with no check (`http_auth_throttled`) until the second
//!   is over. An unknown user costs a bcrypt run too (against another
//!   user's hash, result ignored), so timing does not tell which users
//!   exist.
//!
//! One try per connection comes with the server's one request per
//! connection. Neither the password nor the `Authorization` field is ever
//! logged; a user name is logged only when it is in the file.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::limits;
use crate::metrics::counters::Counters;

/// What identifies one version of the file: a change of any part is a new
/// version to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp { modified: meta.modified().ok(), len: meta.len(), inode: meta.ino() }
    }
}

/// The outcome of a request's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A listed user with the right password: serve.
    Allowed,
    /// No `Authorization` field: `401`.
    Missing,
    /// Wrong credentials (unknown user, wrong password, not well-formed
    /// `Basic`): `401`, counted in `http_auth_failures`.
    Denied,
    /// Not checked: failed checks used up this second's budget: `429`.
    Throttled,
}

/// The users of `metrics_basic_auth_file` and the state of their checks.
#[derive(Debug)]
pub struct BasicAuth {
    path: PathBuf,
    stamp: Stamp,
    /// User name → bcrypt hash.
    users: HashMap<String, String>,
    /// When the file's stamp is looked at next.
    next_check: Instant,
    /// The stamp of a bad new version already logged (logged once).
    bad_logged: Option<Stamp>,
    /// `(user, SHA-256 of the password)` of successful checks.
    cache: HashSet<(String, [u8; 32])>,
    /// The start of the current second of the failure budget.
    window: Instant,
    /// bcrypt time spent on failed checks in the current second.
    failing: std::time::Duration,
}

impl BasicAuth {
    /// Reads the file at `path`.
    ///
    /// # Errors
    /// One line naming the file and what is wrong with it (unreadable, too
    /// large, a bad line with its number, no user).
    pub fn load(path: &Path, now: Instant) -> Result<BasicAuth, String> {
        let (users, stamp) = read_file(path)?;
        Ok(BasicAuth {
            path: path.to_path_buf(),
            stamp,
            users,
            next_check: now + limits::HTTP_AUTH_RELOAD_CHECK,
            bad_logged: None,
            cache: HashSet::new(),
            window: now,
            failing: std::time::Duration::ZERO,
        })
    }

    /// How many users are loaded.
    pub fn users(&self) -> usize {
        self.users.len()
    }

    /// Checks a request's `Authorization` field value (`None`: no such
    /// field), counting in `counters`; first reloads the file if it
    /// changed (see the module doc).
    pub fn check(&mut self, authorization: Option<&[u8]>, counters: &Counters, now: Instant) -> Verdict {
        self.maybe_reload(now);
        let Some(value) = authorization else { return Verdict::Missing };
        let Some((user, password)) = basic_credentials(value) else {
            Counters::bump(&counters.http_auth_failures);
            crate::log_limited!(info, "HTTP authentication failed: Authorization is not well-formed Basic");
            return Verdict::Denied;
        };
        let key = (user, Sha256::digest(&password).into());
        if self.cache.contains(&key) {
            Counters::bump(&counters.http_auth_cache_hits);
            return Verdict::Allowed;
        }
        if now.saturating_duration_since(self.window) >= std::time::Duration::from_secs(1) {
            self.window = now;
            self.failing = std::time::Duration::ZERO;
        }
        if self.failing >= limits::HTTP_AUTH_FAILURE_BUDGET {
            Counters::bump(&counters.http_auth_throttled);
            crate::log_limited!(warn, "HTTP password checks throttled: too many failed in the last second (429)");
            return Verdict::Throttled;
        }
        let known = self.users.get(&key.0);
        // An unknown user costs a check too (result ignored): the answer's
        // timing does not tell which users exist.
        let Some(hash) = known.or_else(|| self.users.values().next()) else { return Verdict::Denied };
        let started = Instant::now();
        let right = bcrypt::verify(&password, hash).unwrap_or(false) && known.is_some();
        if right {
            if self.cache.len() >= limits::HTTP_AUTH_CACHE_ENTRIES {
                self.cache.clear();
            }
            self.cache.insert(key);
            return Verdict::Allowed;
        }
        self.failing += started.elapsed();
        Counters::bump(&counters.http_auth_failures);
        if known.is_some() {
            crate::log_limited!(info, user = %key.0, "HTTP authentication failed: wrong password");
        } else {
            crate::log_limited!(info, "HTTP authentication failed: unknown user");
        }
        Verdict::Denied
    }

    /// Reads the file again when its stamp changed, at most every
    /// [`limits::HTTP_AUTH_RELOAD_CHECK`].
    fn maybe_reload(&mut self, now: Instant) {
        if now < self.next_check {
            return;
        }
        self.next_check = now + limits::HTTP_AUTH_RELOAD_CHECK;
        let stamp = match std::fs::metadata(&self.path) {
            Ok(meta) => Stamp::of(&meta),
            Err(e) => {
                // Gone or unreadable: keep the users, say so once.
                let gone = Stamp { modified: None, len: u64::MAX, inode: u64::MAX };
                if self.bad_logged != Some(gone) {
                    self.bad_logged = Some(gone);
                    tracing::warn!(file = %self.path.display(), error = %e,
                        "metrics_basic_auth_file not readable; the users loaded before stay");
                }
                return;
            }
        };
        if stamp == self.stamp || self.bad_logged == Some(stamp) {
            return;
        }
        match read_file(&self.path) {
            Ok((users, stamp)) => {
                tracing::info!(file = %self.path.display(), users = users.len(), "metrics_basic_auth_file reloaded");
                self.users = users;
                self.stamp = stamp;
                self.bad_logged = None;
                self.cache.clear();
            }
            Err(why) => {
                self.bad_logged = Some(stamp);
                tracing::warn!("{why}; the users loaded before stay");
            }
        }
    }
}

/// The user and password of an `Authorization: Basic <base64>` value
/// (RFC 7617: the scheme case-insensitive, `user:password` split at the
/// first colon); `None` when it is not that.
fn basic_credentials(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let value = value.trim_ascii();
    let split = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(split);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim_ascii()).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = std::str::from_utf8(&decoded[..colon]).ok()?.to_string();
    Some((user, decoded[colon + 1..].to_vec()))
}

/// Reads and parses the file at `path`, bounded by
/// [`limits::HTTP_AUTH_FILE_MAX_BYTES`].
fn read_file(path: &Path) -> Result<(HashMap<String, String>, Stamp), String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("metrics_basic_auth_file {shown}: {e}"))?;
    let stamp = Stamp::of(&file.metadata().map_err(|e| format!("metrics_basic_auth_file {shown}: {e}"))?);
    let mut text = String::new();
    file.take(limits::HTTP_AUTH_FILE_MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("metrics_basic_auth_file {shown}: {e}"))?;
    if text.len() as u64 > limits::HTTP_AUTH_FILE_MAX_BYTES {
        return Err(format!(
            "metrics_basic_auth_file {shown}: over {} bytes (limits::HTTP_AUTH_FILE_MAX_BYTES)",
            limits::HTTP_AUTH_FILE_MAX_BYTES
        ));
    }
    let users = parse(&text).map_err(|why| format!("metrics_basic_auth_file {shown}: {why}"))?;
    Ok((users, stamp))
}

/// Parses the file's text: `user:<bcrypt hash>` lines, `#` comments, blank
/// lines.
///
/// # Errors
/// What is wrong, with the line's number: too many lines, no colon, an
/// empty or repeated user, a user with a space or control character, a
/// value that is not a bcrypt hash (`$2a$`, `$2b$`, `$2x$` or `$2y$`, two
/// cost digits, 53 more characters) or of a cost over
/// [`limits::HTTP_AUTH_MAX_BCRYPT_COST`]; or no user at all.
pub fn parse(text: &str) -> Result<HashMap<String, String>, String> {
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if n > limits::HTTP_AUTH_FILE_MAX_LINES {
            return Err(format!("over {} lines (limits::HTTP_AUTH_FILE_MAX_LINES)", limits::HTTP_AUTH_FILE_MAX_LINES));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!("line {n}: not user:<bcrypt hash> (htpasswd -nBC 10 user)"));
        };
        if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("line {n}: the user name is empty or has a space or control character"));
        }
        let cost = bcrypt_cost(hash).ok_or_else(|| {
            format!("line {n}: user {user}: not a bcrypt hash ($2y$10$ and 53 characters; htpasswd -nBC 10 {user})")
        })?;
        if cost > limits::HTTP_AUTH_MAX_BCRYPT_COST {
            return Err(format!(
                "line {n}: user {user}: bcrypt cost {cost} over {} (limits::HTTP_AUTH_MAX_BCRYPT_COST: each check \
                 blocks the HTTP server)",
                limits::HTTP_AUTH_MAX_BCRYPT_COST
            ));
        }
        if users.insert(user.to_string(), hash.to_string()).is_some() {
            return Err(format!("line {n}: user {user} listed twice"));
        }
    }
    if users.is_empty() {
        return Err("no user: add user:<bcrypt hash> lines (htpasswd -nBC 10 user)".into());
    }
    Ok(users)
}

/// The cost of a bcrypt hash in modular crypt form, `None` when `hash` is
/// not one: `$2?$NN$` and 53 characters of bcrypt's base64 alphabet.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let b = hash.as_bytes();
    let (head, rest) = (b.get(..7)?, b.get(7..)?);
    let ok_head = matches!(head, [b'$', b'2', b'a' | b'b' | b'x' | b'y', b'$', d1, d2, b'$'] if d1.is_ascii_digit() && d2.is_ascii_digit());
    if !ok_head || rest.len() != 53 || !rest.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'.' || c == b'/') {
        return None;
    }
    let cost = u32::from(head[4] - b'0') * 10 + u32::from(head[5] - b'0');
    (4..=31).contains(&cost).then_some(cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `htpasswd -nbBC 4 user pass`-shaped (cost 4 keeps the test fast).
    fn hash(password: &str) -> String {
        bcrypt::hash(password, 4).expect("bcrypt hash")
    }

    fn header(user: &str, password: &str) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {b64}").into_bytes()
    }

    #[test]
    fn files_parse_with_comments_and_bad_lines_are_named() {
        let h = hash("secret");
        let users = parse(&format!("# scrapers\n\nprometheus:{h}\n  ops:{h}  \n")).expect("parses");
        assert_eq!(users.len(), 2);
        assert_eq!(users["prometheus"], h);
        assert_eq!(parse("# nothing\n").unwrap_err(), "no user: add user:<bcrypt hash> lines (htpasswd -nBC 10 user)");
        assert!(parse(&format!("a:{h}\nb\n")).unwrap_err().starts_with("line 2: not user:<bcrypt hash>"));
        assert!(parse("a:secret\n").unwrap_err().starts_with("line 1: user a: not a bcrypt hash"));
        assert!(parse(&format!("a:{h}\na:{h}\n")).unwrap_err().starts_with("line 2: user a listed twice"));
        assert!(parse(&format!(":{h}\n")).unwrap_err().starts_with("line 1: the user name is empty"));
        let costly = format!("$2y$13${}", &h[7..]);
        assert!(parse(&format!("a:{costly}\n")).unwrap_err().starts_with("line 1: user a: bcrypt cost 13 over 12"));
        let long = "#\n".repeat(limits::HTTP_AUTH_FILE_MAX_LINES) + &format!("a:{h}\n");
        assert_eq!(parse(&long).unwrap_err(), "over 1000 lines (limits::HTTP_AUTH_FILE_MAX_LINES)");
    }

    #[test]
    fn basic_credentials_decode_and_split_at_the_first_colon() {
        assert_eq!(basic_credentials(&header("u", "p:q")), Some(("u".into(), b"p:q".to_vec())));
        assert_eq!(basic_credentials(b"bAsIc dTpw"), Some(("u".into(), b"p".to_vec())));
        assert_eq!(basic_credentials(b"Bearer dTpw"), None);
        assert_eq!(basic_credentials(b"Basic !!"), None);
        assert_eq!(basic_credentials(b"Basic dXNlcg=="), None, "no colon");
        assert_eq!(basic_credentials(b"Basic"), None);
    }

    #[test]
    fn checks_cache_successes_and_throttle_failures() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("users");
        std::fs::write(&path, format!("prometheus:{}\n", hash("right"))).expect("written");
        let now = Instant::now();
        let counters = Counters::default();
        let mut auth = BasicAuth::load(&path, now).expect("loads");
        assert_eq!(auth.check(None, &counters, now), Verdict::Missing);
        assert_eq!(auth.check(Some(&header("prometheus", "right")), &counters, now), Verdict::Allowed);
        assert_eq!(auth.check(Some(&header("prometheus", "right")), &counters, now), Verdict::Allowed);
        assert_eq!(counters.http_auth_cache_hits.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(auth.check(Some(&header("prometheus", "wrong")), &counters, now), Verdict::Denied);
        assert_eq!(auth.check(Some(&header("nobody", "right")), &counters, now), Verdict::Denied);
        assert_eq!(auth.check(Some(b"Basic !!"), &counters, now), Verdict::Denied);
        assert_eq!(counters.http_auth_failures.load(std::sync::atomic::Ordering::Relaxed), 3);
        // Used-up budget: no check, but a cached password still passes.
        auth.failing = limits::HTTP_AUTH_FAILURE_BUDGET;
        assert_eq!(auth.check(Some(&header("prometheus", "wrong")), &counters, now), Verdict::Throttled);
        assert_eq!(auth.check(Some(&header("prometheus", "right")), &counters, now), Verdict::Allowed);
        let later = now + std::time::Duration::from_secs(1);
        assert_eq!(auth.check(Some(&header("prometheus", "wrong")), &counters, later), Verdict::Denied);
    }
}
