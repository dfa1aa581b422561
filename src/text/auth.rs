//! Text protocol tokens (text-protocol.md "Authentication"): the file of
//! accepted tokens (`text_auth_tokens_file`), read at start and re-read when
//! it changes, and the check of a presented token.
//!
//! The file has one token a line, `NAME sha256:<64 hex digits>` (the
//! SHA-256 of the token, never the token itself), `#` comments and blank
//! lines. Several lines may be valid at once, which is how a token is
//! rotated: add the new line, move the clients, remove the old line. Tokens
//! are 32 random bytes (`emq-cli token new NAME`), so one SHA-256 suffices;
//! a slow password hash is for guessable passwords.
//!
//! A presented token is hashed and compared with every entry, each
//! comparison over all 32 bytes, so the time taken does not depend on how
//! much of which entry matched.
//!
//! Reload: when a token is checked and [`RELOAD_CHECK_INTERVAL`] has passed
//! since the last look, the file's modification time is compared with the
//! loaded one; a changed file is read again and replaces the set. A file
//! that cannot be used (unreadable, a bad line, too many lines) keeps the
//! previous set and is logged once per change.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// How often at most the tokens file's modification time is looked at.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Most lines (comments and blank lines included) in a tokens file.
pub const MAX_TOKEN_FILE_LINES: usize = 10_000;

/// Largest tokens file, in bytes.
pub const MAX_TOKEN_FILE_BYTES: u64 = 1 << 20;

/// Longest token name, in bytes.
pub const MAX_TOKEN_NAME_BYTES: usize = 64;

/// Why a tokens file cannot be used: one line naming the file (and the line).
#[derive(Debug, thiserror::Error)]
#[error("text_auth_tokens_file {}: {why}", path.display())]
pub struct TokensError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, with the line number when it is one line.
    pub why: String,
}

/// One accepted token: its name (for logs) and the SHA-256 of the token.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    hash: [u8; 32],
}

/// The accepted tokens, re-read when their file changes (module doc).
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    entries: Vec<Entry>,
    /// The file's modification time when `entries` were read.
    stamp: Option<SystemTime>,
    /// The modification time of a version that was refused (logged once).
    refused: Option<Option<SystemTime>>,
    checked: Instant,
}

impl Tokens {
    /// Reads the tokens file at `path`.
    ///
    /// # Errors
    /// The file cannot be read, is too large, or has a bad line.
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let stamp = modified(path);
        let entries = read(path)?;
        Ok(Tokens {
            path: path.to_path_buf(),
            state: Mutex::new(State { entries, stamp, refused: None, checked: Instant::now() }),
        })
    }

    /// The name of the entry `token` matches, if any. Looks at the file
    /// first when [`RELOAD_CHECK_INTERVAL`] has passed since the last look.
    pub fn check(&self, token: &[u8]) -> Option<String> {
        self.reload_if_changed(false);
        let hash: [u8; 32] = Sha256::digest(token).into();
        let st = self.state.lock();
        let mut found = None;
        for entry in &st.entries {
            // All 32 bytes of every entry, no early exit.
            let diff = entry.hash.iter().zip(&hash).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(diff) == 0 && found.is_none() {
                found = Some(entry.name.clone());
            }
        }
        found
    }

    /// How many tokens are accepted now.
    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// Whether no token is accepted (every AUTH fails).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Re-reads the file if its modification time changed (unless `now`,
    /// at most once per [`RELOAD_CHECK_INTERVAL`]). Whether a new set was
    /// taken.
    pub fn reload_if_changed(&self, now: bool) -> bool {
        let mut st = self.state.lock();
        if !now && st.checked.elapsed() < RELOAD_CHECK_INTERVAL {
            return false;
        }
        st.checked = Instant::now();
        let stamp = modified(&self.path);
        if stamp == st.stamp || Some(stamp) == st.refused {
            return false;
        }
        match read(&self.path) {
            Ok(entries) => {
                tracing::info!(file = %self.path.display(), tokens = entries.len(), "text tokens file reloaded");
                st.entries = entries;
                st.stamp = stamp;
                st.refused = None;
                true
            }
            Err(e) => {
                st.refused = Some(stamp);
                tracing::warn!(error = %e, "text tokens file changed but cannot be used; the previous tokens stay valid");
                false
            }
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read(path: &Path) -> Result<Vec<Entry>, TokensError> {
    let err = |why: String| TokensError { path: path.to_path_buf(), why };
    let len = std::fs::metadata(path).map_err(|e| err(format!("cannot read it: {e}")))?.len();
    if len > MAX_TOKEN_FILE_BYTES {
        return Err(err(format!("{len} bytes, more than the {MAX_TOKEN_FILE_BYTES} allowed")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    parse(&text).map_err(err)
}

/// Parses a tokens file's text (module doc).
///
/// # Errors
/// The first bad line, with its number: not `NAME sha256:<64 hex>`, a name
/// that is not 1 to 64 bytes of `A-Z a-z 0-9 _ - . @`, a name used twice;
/// or more than [`MAX_TOKEN_FILE_LINES`] lines.
fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if n > MAX_TOKEN_FILE_LINES {
            return Err(format!("more than {MAX_TOKEN_FILE_LINES} lines"));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let (Some(name), Some(hash), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("line {n}: expected NAME sha256:<64 hex digits>"));
        };
        let name_ok = name.len() <= MAX_TOKEN_NAME_BYTES
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'));
        if !name_ok {
            return Err(format!(
                "line {n}: a token name is 1 to {MAX_TOKEN_NAME_BYTES} characters of A-Z a-z 0-9 _ - . @"
            ));
        }
        let hash = hash
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64)
            .and_then(|h| hex::decode(h).ok())
            .and_then(|h| <[u8; 32]>::try_from(h).ok())
            .ok_or_else(|| format!("line {n}: the hash is sha256: and 64 hex digits (emq-cli token new {name})"))?;
        if entries.iter().any(|e| e.name == name) {
            return Err(format!("line {n}: the name {name} is used twice"));
        }
        entries.push(Entry { name: name.to_string(), hash });
    }
    Ok(entries)
}

/// The line of the tokens file for `token` named `name`:
/// `NAME sha256:<hex>`.
pub fn token_line(name: &str, token: &[u8]) -> String {
    format!("{name} sha256:{}", hex::encode(Sha256::digest(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_and_reloads() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        let text = format!("# comment\n\n{}\n  {}  \n", token_line("a", b"one"), token_line("b.x@y", b"two"));
        std::fs::write(&path, text).expect("write");
        let tokens = Tokens::load(&path).expect("load");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.check(b"one").as_deref(), Some("a"));
        assert_eq!(tokens.check(b"two").as_deref(), Some("b.x@y"));
        assert_eq!(tokens.check(b"three"), None);
        assert_eq!(tokens.check(b""), None);

        // A bad new version keeps the old set; a good one replaces it.
        std::fs::write(&path, "a sha256:00\n").expect("write");
        bump(&path);
        assert!(!tokens.reload_if_changed(true));
        assert_eq!(tokens.check(b"one").as_deref(), Some("a"));
        std::fs::write(&path, token_line("c", b"three")).expect("write");
        bump(&path);
        assert!(tokens.reload_if_changed(true));
        assert_eq!(tokens.check(b"one"), None);
        assert_eq!(tokens.check(b"three").as_deref(), Some("c"));
    }

    fn bump(path: &Path) {
        let f = std::fs::File::options().write(true).open(path).expect("open");
        let t = modified(path).expect("mtime") + Duration::from_secs(1);
        f.set_modified(t).expect("set mtime");
    }

    #[test]
    fn bad_files_say_which_line() {
        let good = token_line("a", b"x");
        assert_eq!(parse("a\n").unwrap_err(), "line 1: expected NAME sha256:<64 hex digits>");
        assert_eq!(parse(&format!("{good} extra")).unwrap_err(), "line 1: expected NAME sha256:<64 hex digits>");
        assert!(parse("a sha256:zz\n").unwrap_err().starts_with("line 1: the hash is sha256: and 64 hex digits"));
        assert!(parse("a md5:00\n").unwrap_err().starts_with("line 1: the hash is"));
        assert!(parse(&format!("#\n{}", good.replace('a', "a/b"))).unwrap_err().starts_with("line 2: a token name"));
        assert_eq!(parse(&format!("{good}\n{good}")).unwrap_err(), "line 2: the name a is used twice");
        let many = "#\n".repeat(MAX_TOKEN_FILE_LINES + 1);
        assert_eq!(parse(&many).unwrap_err(), format!("more than {MAX_TOKEN_FILE_LINES} lines"));
        let e = Tokens::load(Path::new("/nonexistent/tokens")).unwrap_err().to_string();
        assert!(e.starts_with("text_auth_tokens_file /nonexistent/tokens: cannot read it: "), "{e}");
    }
}
