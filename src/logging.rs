//! Log set-up shared by the binaries: tracing to stderr, one line per event
//! with the name of the thread that wrote it (`emq-io-0`, `emq-shard-3`,
//! `emq-text-7`, ...), so a line tells which shard or I/O thread it
//! came from.
//!
//! Every program takes its filter from its `log` setting (`--log`,
//! `EMQ_LOG`, `log` in the config file; see [`crate::config`]).
//!
//! Losing the log never stops a program: a line that cannot be written
//! (stderr a pipe whose reader is gone, a file on a full disk) is dropped
//! and counted ([`Lossy`], [`write_failures`]); the router shows the count
//! as `log_write_failures` in STATUS's counters.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// Log lines (and other diagnostics, [`diagnostic`]) this
/// process could not write to stderr since it started.
static WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many log lines and diagnostics this process could not write to
/// stderr (an error from the write: `EPIPE`, `ENOSPC`, `EIO`, …) and
/// dropped, since it started. Process-wide: every subscriber [`init`]
/// installs and every [`diagnostic`] counts here.
pub fn write_failures() -> u64 {
    WRITE_FAILURES.load(Ordering::Relaxed)
}

/// A [`MakeWriter`] whose writers never fail: a write that returns an error
/// is dropped and counted in `failures`, and reported written.
///
/// tracing-subscriber reacts to a failed write with `eprintln!`, which
/// panics when stderr fails too, so the thread that logged would die (a
/// router's shard, a scheduler's only thread); with this writer it never
/// sees one. Each event is one `write_all` of its whole line, so one
/// failure is one line lost (possibly its tail only, after a short write).
#[derive(Debug, Clone, Copy)]
pub struct Lossy<M> {
    make: M,
    failures: &'static AtomicU64,
}

impl<M> Lossy<M> {
    /// Writers from `make`, their failures counted in `failures`.
    pub const fn new(make: M, failures: &'static AtomicU64) -> Lossy<M> {
        Lossy { make, failures }
    }
}

/// [`Lossy`] over stderr, counted in [`write_failures`]: the writer of every
/// program's log.
pub fn lossy_stderr() -> Lossy<fn() -> io::Stderr> {
    Lossy::new(io::stderr as fn() -> io::Stderr, &WRITE_FAILURES)
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Lossy<M> {
    type Writer = LossyWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        LossyWriter { inner: self.make.make_writer(), failures: self.failures }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LossyWriter { inner: self.make.make_writer_for(meta), failures: self.failures }
    }
}

/// One writer of a [`Lossy`]: every `write` and `flush` succeeds; the ones
/// whose inner call failed are counted.
#[derive(Debug)]
pub struct LossyWriter<W> {
    inner: W,
    failures: &'static AtomicU64,
}

impl<W: io::Write> io::Write for LossyWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.inner.write_all(bytes).is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.inner.flush().is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Writes one field of an event: the message as it is, any other field as
/// `name=value`; both with control characters and the invisible characters
/// that reorder text escaped ([`crate::printable::printable`]). Log lines
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
    // Not `format!`: it panics when a `Debug` implementation fails.
    let mut raw = String::new();
    if fmt::Write::write_fmt(&mut raw, format_args!("{value:?}")).is_err() {
        raw.push_str("<unprintable>");
    }
    let text = crate::printable::printable(&raw);
    match field.name() {
        "message" => w.write_str(&text),
        name => write!(w, "{name}={text}"),
    }
}

/// The subscriber [`init`] installs: stderr ([`lossy_stderr`]: a line that
/// cannot be written is dropped and counted), `filter`, time, level, thread
/// name and target on each line, colours on a terminal, every field escaped
/// (`escaped_field`). A bad filter falls back to `info` with a warning.
pub fn subscriber(filter: &str) -> impl tracing::Subscriber + Send + Sync + 'static {
    let env = EnvFilter::try_new(filter).unwrap_or_else(|e| {
        diagnostic(format_args!("bad log filter {filter:?} ({e}); using info"));
        EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    subscriber_to(cap_secrets(env), io::stderr().is_terminal(), true, lossy_stderr())
}

/// `filter` with async-nats's connection module capped at `debug`, whatever
/// the filter says: at `trace` it logs its `CONNECT` line with the
/// password, token or signature in it (emq never logs a secret:
/// [`crate::jslog::connect`]).
fn cap_secrets(filter: EnvFilter) -> EnvFilter {
    match "async_nats::connection=debug".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// [`subscriber`]'s format with `filter`, colours when `ansi`, the thread's
/// name on each line when `thread_names`, lines to
/// `writer` (for [`subscriber`] a [`Lossy`] one: this format's own reaction
/// to a failed write is an `eprintln!` that panics when stderr fails).
fn subscriber_to<W>(
    filter: EnvFilter,
    ansi: bool,
    thread_names: bool,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_thread_names(thread_names)
        .fmt_fields(tracing_subscriber::fmt::format::debug_fn(escaped_field).delimited(" "))
        .with_writer(writer)
        .finish()
}

/// Installs [`subscriber`] with `filter` (e.g. `info`, `emq=debug`) for the
/// whole process, and starts the thread (`emq-log-flush`) that reports
/// what [`crate::log_limited!`] suppressed when no later line of the same
/// kind does ([`flush_suppressed`], every [`limits::LOG_FLUSH_EVERY`](crate::limits::LOG_FLUSH_EVERY)); calling twice is harmless.
pub fn init(filter: &str) {
    use tracing_subscriber::util::SubscriberInitExt;
    if subscriber(filter).try_init().is_ok() {
        let flusher = std::thread::Builder::new().name("emq-log-flush".into()).spawn(|| loop {
            std::thread::sleep(crate::limits::LOG_FLUSH_EVERY);
            flush_suppressed(unix_secs());
        });
        if let Err(e) = flusher {
            tracing::warn!(error = %e, "no log flush thread: suppressed lines are counted on the next line of their kind only");
        }
    }
}

/// Seconds since the Unix epoch (0 before it).
fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Runs `f` with log lines up to `filter` captured on this thread; returns
/// its result and the lines (no colours).
/// Writes `line` and a line break to stderr in one write, like `eprintln!`
/// but never panics: a failed write (a closed pipe, a full disk) is
/// dropped and counted in [`write_failures`]. For what a
/// program says outside its log (a summary at exit, an error at the end);
/// losing it must not stop the program.
pub fn diagnostic(line: std::fmt::Arguments<'_>) {
    // Not `format!`: it panics when a `Display` implementation fails.
    let mut text = String::new();
    let _ = std::fmt::Write::write_fmt(&mut text, line);
    text.push('\n');
    use std::io::Write;
    use tracing_subscriber::fmt::MakeWriter;
    // Never fails: a failed write is counted.
    let _ = lossy_stderr().make_writer().write_all(text.as_bytes());
}

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
    let result = scoped(subscriber_to(cap_secrets(EnvFilter::new(filter)), false, false, move || writer.clone()), f);
    let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
    (result, text)
}

/// Runs `f` with `subscriber` as this thread's, one such test at a time.
#[cfg(test)]
fn scoped<R>(subscriber: impl tracing::Subscriber + Send + Sync + 'static, f: impl FnOnce() -> R) -> R {
    // One at a time, and callsite interest rebuilt under it: tracing caches
    // per call site whether any subscriber wants its events, and scoped
    // subscribers created and dropped by tests running in parallel could
    // leave a debug call site cached as unwanted (events missed now and
    // then).
    static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock();
    tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        f()
    })
}

/// Where a [`crate::log_limited!`] line is written: its level and text, for
/// the line that reports what it suppressed ([`flush_suppressed`]).
#[derive(Debug)]
pub struct Site {
    /// The level of its lines (and of the report).
    pub level: tracing::Level,
    /// The macro's arguments as written (`stringify!`): fields, then the
    /// message.
    pub args: &'static str,
    /// Source file.
    pub file: &'static str,
    /// Source line.
    pub line: u32,
}

impl Site {
    /// The message of its lines: the string literal that ends
    /// [`Site::args`] (without its quotes), else all of them.
    pub fn message(&self) -> &'static str {
        let args = self.args.trim_end();
        let Some(body) = args.strip_suffix('"') else { return args };
        let bytes = body.as_bytes();
        let mut i = bytes.len();
        while i > 0 {
            i -= 1;
            if bytes[i] == b'"' && (i == 0 || bytes[i - 1] != b'\\') {
                return &body[i + 1..];
            }
        }
        args
    }
}

/// The limits that have suppressed a line, for [`flush_suppressed`].
static SUPPRESSING: parking_lot::Mutex<Vec<&'static RateLimit>> = parking_lot::Mutex::new(Vec::new());

/// Reports, for every [`crate::log_limited!`] site whose lines were
/// suppressed and that has let no line through since (its last
/// one-second window ended before the last full second before `now`,
/// seconds since the Unix epoch), how many: one line at the site's level,
/// `suppressed=N at=<file:line> of=<its message>`. So a burst that ends is
/// counted within about two seconds even if no later line of its kind
/// comes to carry the count. Each suppressed line is counted once, here
/// or on the next line let through at its site. The thread [`init`]
/// starts calls it every [`limits::LOG_FLUSH_EVERY`](crate::limits::LOG_FLUSH_EVERY).
pub fn flush_suppressed(now: u64) {
    let limits: Vec<&'static RateLimit> = SUPPRESSING.lock().clone();
    for limit in limits {
        limit.report_pending(now);
    }
}

/// At most [`limits::LOG_BURST`](crate::limits::LOG_BURST) events a second
/// from one call site; the rest are counted, and the next event that gets
/// through reports how many were suppressed, or, when none comes,
/// [`flush_suppressed`] does. Used through [`crate::log_limited!`], so
/// input that makes the broker log (malformed frames, refused peers, jobs
/// dead-lettered in a burst) cannot make the log grow faster than a few
/// lines a second per kind, and no line is lost uncounted.
#[derive(Debug, Default)]
pub struct RateLimit {
    /// The current one-second window (seconds since the Unix epoch) in the
    /// high 40 bits and the events let through in it in the low 24.
    window: std::sync::atomic::AtomicU64,
    suppressed: std::sync::atomic::AtomicU64,
    /// Where its lines are written; `None`: never reported by
    /// [`flush_suppressed`].
    site: Option<&'static Site>,
    /// Listed for [`flush_suppressed`] already.
    listed: std::sync::atomic::AtomicBool,
}

impl RateLimit {
    /// A limit with nothing seen yet, of no [`Site`] (what it suppresses is
    /// reported only by the next event let through).
    pub const fn new() -> RateLimit {
        RateLimit {
            window: std::sync::atomic::AtomicU64::new(0),
            suppressed: std::sync::atomic::AtomicU64::new(0),
            site: None,
            listed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A limit with nothing seen yet for the lines of `site`.
    pub const fn at(site: &'static Site) -> RateLimit {
        RateLimit { site: Some(site), ..RateLimit::new() }
    }

    /// `Some(suppressed since the last event let through)` when this event
    /// may be logged, `None` when it is suppressed (and counted, and the
    /// limit listed for [`flush_suppressed`]).
    pub fn allow(&'static self) -> Option<u64> {
        let allowed = self.allow_at(unix_secs());
        if allowed.is_none() && !self.listed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            SUPPRESSING.lock().push(self);
        }
        allowed
    }

    /// Logs what [`RateLimit::take_pending`] takes at `now`, if anything,
    /// at its site's level: `suppressed=N at=<file:line> of=<its
    /// message>` (a limit of no site reports nothing).
    pub fn report_pending(&self, now: u64) {
        let Some(site) = self.site else { return };
        let Some(n) = self.take_pending(now) else { return };
        let at = format_args!("{}:{}", site.file, site.line);
        let (what, of) =
            ("log lines suppressed by the rate limit (at most limits::LOG_BURST a second per kind)", site.message());
        match site.level {
            tracing::Level::ERROR => tracing::error!(suppressed = n, %at, of, "{what}"),
            tracing::Level::WARN => tracing::warn!(suppressed = n, %at, of, "{what}"),
            tracing::Level::INFO => tracing::info!(suppressed = n, %at, of, "{what}"),
            tracing::Level::DEBUG => tracing::debug!(suppressed = n, %at, of, "{what}"),
            _ => tracing::trace!(suppressed = n, %at, of, "{what}"),
        }
    }

    /// The count of events suppressed, taken (so that no later event
    /// reports them again), when no event has been let through in the
    /// second before `now` or in `now` (seconds since the Unix epoch): the
    /// burst is over. `None` when there is nothing to report yet.
    pub fn take_pending(&self, now: u64) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let window = self.window.load(Relaxed) >> 24;
        if window.saturating_add(1) >= now {
            return None;
        }
        Some(self.suppressed.swap(0, Relaxed)).filter(|n| *n > 0)
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

/// A `tracing` event at `level` (`error`, `warn`, `info`, `debug`,
/// `trace`) limited per call site by a [`RateLimit`]; the event carries
/// `suppressed = N`, the events dropped since the last one logged here,
/// and when no later event comes, [`flush_suppressed`] reports them. The
/// arguments end with the message, a string literal.
///
/// ```
/// emq::log_limited!(warn, peer = "w1", "malformed message dropped");
/// ```
#[macro_export]
macro_rules! log_limited {
    ($level:ident, $($arg:tt)+) => {{
        static SITE: $crate::logging::Site = $crate::logging::Site {
            level: $crate::__log_level!($level),
            args: stringify!($($arg)+),
            file: file!(),
            line: line!(),
        };
        static LIMIT: $crate::logging::RateLimit = $crate::logging::RateLimit::at(&SITE);
        if let Some(suppressed) = LIMIT.allow() {
            tracing::$level!(suppressed, $($arg)+);
        }
    }};
}

/// The [`tracing::Level`] of a `tracing` macro's name (for
/// [`crate::log_limited!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __log_level {
    (error) => {
        tracing::Level::ERROR
    };
    (warn) => {
        tracing::Level::WARN
    };
    (info) => {
        tracing::Level::INFO
    };
    (debug) => {
        tracing::Level::DEBUG
    };
    (trace) => {
        tracing::Level::TRACE
    };
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};

    use tracing_subscriber::fmt::MakeWriter;

    use super::{Lossy, RateLimit, ShowText};

    /// A writer that fails every write and flush as stderr on a full disk.
    struct Full;

    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }
    }

    #[test]
    fn the_lossy_writer_never_fails_and_counts_what_it_lost() {
        // A pipe whose reader is gone (EPIPE: Rust ignores SIGPIPE), a full
        // device (ENOSPC), a writer failing every call; and one that works.
        static PIPE: AtomicU64 = AtomicU64::new(0);
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let pipe = Lossy::new(move || writer.try_clone().expect("clone the pipe"), &PIPE);
        assert_eq!(pipe.make_writer().write(b"line\n").ok(), Some(5));
        pipe.make_writer().write_all(b"line\n").expect("reported written");
        assert_eq!(PIPE.load(Ordering::Relaxed), 2);

        static DEV_FULL: AtomicU64 = AtomicU64::new(0);
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let dev_full = Lossy::new(move || full.try_clone().expect("clone /dev/full"), &DEV_FULL);
        dev_full.make_writer().write_all(b"line\n").expect("reported written");
        assert_eq!(DEV_FULL.load(Ordering::Relaxed), 1);

        static FULL: AtomicU64 = AtomicU64::new(0);
        let failing = Lossy::new(|| Full, &FULL);
        let mut w = failing.make_writer();
        w.write_all(b"line\n").expect("reported written");
        w.flush().expect("reported flushed");
        assert_eq!(FULL.load(Ordering::Relaxed), 2);

        static SINK: AtomicU64 = AtomicU64::new(0);
        let sink = Lossy::new(std::io::sink, &SINK);
        sink.make_writer().write_all(b"line\n").expect("written");
        assert_eq!(SINK.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn events_to_a_failing_writer_neither_panic_nor_print_and_each_is_counted() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let subscriber = super::subscriber_to(super::EnvFilter::new("info"), false, true, Lossy::new(|| Full, &LOST));
        super::scoped(subscriber, || {
            tracing::info!(queue = "q", "one");
            tracing::warn!("two");
            tracing::debug!("filtered out: not written, not counted");
            tracing::error!(error = %"disk full", "three");
        });
        assert_eq!(LOST.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_field_whose_debug_fails_is_shown_as_unprintable() {
        struct Broken;
        impl std::fmt::Debug for Broken {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                Err(std::fmt::Error)
            }
        }
        let ((), text) = super::capture("info", || tracing::info!(field = ?Broken, "still logged"));
        assert!(text.contains("still logged field=<unprintable>"), "{text}");
    }

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

    #[test]
    fn a_burst_with_no_later_line_is_reported_once_it_is_over() {
        static SITE: super::Site = super::Site {
            level: tracing::Level::ERROR,
            args: stringify!(job = 7, "job out of retries: moved to the dead set"),
            file: "here.rs",
            line: 1,
        };
        assert_eq!(SITE.message(), "job out of retries: moved to the dead set");
        let limit = RateLimit::at(&SITE);
        let burst = crate::limits::LOG_BURST;
        let through = (0..659).filter(|_| limit.allow_at(1_000).is_some()).count() as u64;
        assert_eq!(through, burst);
        assert_eq!(limit.take_pending(1_000), None, "the burst's second is not over");
        assert_eq!(limit.take_pending(1_001), None, "nor the next: a line of it may still carry the count");
        assert_eq!(limit.take_pending(1_002), Some(659 - burst));
        assert_eq!(limit.take_pending(1_003), None, "reported once");
        assert_eq!(limit.allow_at(1_003), Some(0), "and not again by the next line");
        // A flood going on: each second's first line carries the count.
        for _ in 0..20 {
            limit.allow_at(1_004);
        }
        assert_eq!(limit.take_pending(1_005), None);
        assert_eq!(limit.allow_at(1_005), Some(20 - burst));
        // The report, at the site's level, with its place and message.
        let ((), text) = super::capture("error", || {
            static FLOOD: super::Site =
                super::Site { level: tracing::Level::ERROR, args: "\"flooded\"", file: "f.rs", line: 9 };
            static LIMIT: RateLimit = RateLimit::at(&FLOOD);
            while LIMIT.allow().is_some() {}
            LIMIT.allow();
            // This site only: a flush of all would take other tests' counts.
            LIMIT.report_pending(super::unix_secs() + 2);
        });
        assert!(
            text.contains(
                "log lines suppressed by the rate limit (at most limits::LOG_BURST a second per kind) suppressed=2 \
                 at=f.rs:9 of=\"flooded\""
            ),
            "{text}"
        );
        assert_eq!(super::Site { level: tracing::Level::WARN, args: "x = 1", file: "", line: 0 }.message(), "x = 1");
    }
}
