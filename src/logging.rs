//! Log set-up shared by the binaries: tracing to stderr, one line per event
//! with the name of the thread that wrote it (`emq-io-0`, `emq-shard-3`,
//! `emq-text-7`, ...), so a line tells which shard or I/O thread it
//! came from.
//!
//! Every program takes its filter from its `log` setting (`--log`,
//! `EMQ_LOG`, `log` in the config file; see [`crate::config`]).

use std::fmt;

use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::EnvFilter;

/// Writes one field of an event: the message as it is, any other field as
/// `name=value`; both with control characters and the invisible characters
/// that reorder text escaped ([`crate::program::printable`]). Log lines
/// carry bytes peers chose (identities, msgids, queue names, error texts);
/// escaped, a peer can neither break a line to forge the next nor send
/// escape sequences to the terminal that shows the log. One rule for every
/// field, so a new log line cannot forget it.
fn escaped_field(w: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    // Records from the `log` crate carry their origin as `log.*` fields,
    // which the default formatter leaves out too.
    if field.name().starts_with("log.") {
        return Ok(());
    }
    let text = crate::program::printable(&format!("{value:?}"));
    match field.name() {
        "message" => w.write_str(&text),
        name => write!(w, "{name}={text}"),
    }
}

/// The subscriber [`init`] installs: stderr, `filter`, time, level, thread
/// name and target on each line, colours on a terminal, every field escaped
/// ([`escaped_field`]). A bad filter falls back to `info` with a warning.
pub fn subscriber(filter: &str) -> impl tracing::Subscriber + Send + Sync + 'static {
    let env = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("bad log filter {filter:?} ({e}); using info");
        EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        .with_env_filter(env)
        .with_ansi(ansi)
        .with_thread_names(true)
        .fmt_fields(tracing_subscriber::fmt::format::debug_fn(escaped_field).delimited(" "))
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .finish()
}

/// Installs [`subscriber`] with `filter` (e.g. `info`, `emq=debug`) for the
/// whole process; calling twice is harmless.
pub fn init(filter: &str) {
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = subscriber(filter).try_init();
}

/// Runs `f` with log lines up to `filter` captured on this thread; returns
/// its result and the lines (no colours).
#[cfg(test)]
pub(crate) fn capture<R>(filter: &str, f: impl FnOnce() -> R) -> (R, String) {
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_ansi(false)
        .fmt_fields(tracing_subscriber::fmt::format::debug_fn(escaped_field).delimited(" "))
        .with_writer(move || writer.clone())
        .finish();
    // One capture at a time, and callsite interest rebuilt under it:
    // tracing caches per call site whether any subscriber wants its events,
    // and scoped subscribers created and dropped by tests running in
    // parallel could leave a debug call site cached as unwanted (events
    // missed now and then).
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock();
    let result = tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
    (result, text)
}

/// At most [`limits::LOG_BURST`](crate::limits::LOG_BURST) events a second
/// from one call site; the rest are counted, and the next event that gets
/// through reports how many were suppressed. Used through
/// [`crate::log_limited!`], so input that makes the broker log (malformed
/// frames, refused peers) cannot make the log grow faster than a few lines
/// a second per kind.
#[derive(Debug, Default)]
pub struct RateLimit {
    /// The current one-second window (seconds since the Unix epoch) in the
    /// high 40 bits and the events let through in it in the low 24.
    window: std::sync::atomic::AtomicU64,
    suppressed: std::sync::atomic::AtomicU64,
}

impl RateLimit {
    /// A limit with nothing seen yet.
    pub const fn new() -> RateLimit {
        RateLimit { window: std::sync::atomic::AtomicU64::new(0), suppressed: std::sync::atomic::AtomicU64::new(0) }
    }

    /// `Some(suppressed since the last event let through)` when this event
    /// may be logged, `None` when it is suppressed (and counted).
    pub fn allow(&self) -> Option<u64> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        self.allow_at(now)
    }

    /// [`RateLimit::allow`] at `now`, in seconds since the Unix epoch.
    pub fn allow_at(&self, now: u64) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let next = self.window.fetch_update(Relaxed, Relaxed, |w| {
            let (secs, n) = (w >> 24, w & 0xff_ffff);
            if secs != now {
                Some(now << 24 | 1)
            } else if n < crate::limits::LOG_BURST {
                Some(w + 1)
            } else {
                None
            }
        });
        match next {
            Ok(_) => Some(self.suppressed.swap(0, Relaxed)),
            Err(_) => {
                self.suppressed.fetch_add(1, Relaxed);
                None
            }
        }
    }
}

/// Text shown in a log line, cut at [`limits::LOG_TEXT_BYTES`](crate::limits::LOG_TEXT_BYTES)
/// (at a character boundary; the bytes left out counted: `…(+N)`): for
/// messages that may quote a peer's input (a refusal's reason naming the
/// cron expression it could not read), so one line stays short whatever the
/// peer sent.
pub struct ShowText<'a>(pub &'a str);

impl std::fmt::Display for ShowText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0;
        let mut end = text.len().min(crate::limits::LOG_TEXT_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        f.write_str(&text[..end])?;
        if end < text.len() {
            write!(f, "…(+{})", text.len() - end)?;
        }
        Ok(())
    }
}

/// A `tracing` event at `level` (`warn`, `info`, …) limited per call site by
/// a [`RateLimit`]; the event carries `suppressed = N`, the events dropped
/// since the last one logged here.
///
/// ```
/// emq::log_limited!(warn, peer = "w1", "malformed message dropped");
/// ```
#[macro_export]
macro_rules! log_limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::logging::RateLimit = $crate::logging::RateLimit::new();
        if let Some(suppressed) = LIMIT.allow() {
            tracing::$level!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::{RateLimit, ShowText};

    #[test]
    fn shown_text_is_cut_at_a_character_boundary() {
        assert_eq!(ShowText("short").to_string(), "short");
        let long = format!("{}é{}", "a".repeat(255), "b".repeat(10_000));
        assert_eq!(ShowText(&long).to_string(), format!("{}…(+10002)", "a".repeat(255)));
        let exact = "c".repeat(256);
        assert_eq!(ShowText(&exact).to_string(), exact);
    }

    #[test]
    fn peer_bytes_in_fields_and_messages_cannot_forge_lines_or_reach_the_terminal() {
        let peer =
            crate::ids::PeerId::from("X\n2026-12-02T11:00:00Z  INFO emq: FORGED\x1b]0;PWNED\x07\r\u{202e}".as_bytes());
        let msgid = "m\nFORGED";
        let ((), text) = super::capture("info", || {
            tracing::warn!(worker = %peer, %msgid, quoted = ?msgid, "worker removed");
            tracing::info!("message from {peer}");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\u{7}') && !text.contains('\u{202e}')
        );
        assert!(lines[0].ends_with(
            r#"worker removed worker=X\n2026-12-02T11:00:00Z  INFO emq: FORGED\u{1b}]0;PWNED\u{7}\r\u{202e} msgid=m\nFORGED quoted="m\nFORGED""#
        ), "{}", lines[0]);
        assert!(
            lines[1]
                .ends_with(r#"message from X\n2026-12-02T11:00:00Z  INFO emq: FORGED\u{1b}]0;PWNED\u{7}\r\u{202e}"#),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn a_burst_gets_through_then_the_rest_is_counted() {
        let limit = RateLimit::new();
        let burst = crate::limits::LOG_BURST;
        let through: Vec<Option<u64>> = (0..100).map(|_| limit.allow_at(1_000)).collect();
        assert!(through[..burst as usize].iter().all(|r| *r == Some(0)));
        assert!(through[burst as usize..].iter().all(Option::is_none));
        assert_eq!(limit.allow_at(1_001), Some(100 - burst), "the next second reports what was dropped");
        assert_eq!(limit.allow_at(1_001), Some(0));
    }
}
