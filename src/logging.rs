//! Log set-up shared by the binaries: tracing to stderr, one line per event
//! with the name of the thread that wrote it (`emq-io-0`, `emq-shard-3`,
//! `emq-text-7`, ...), so a line tells which shard or I/O thread it
//! came from.
//!
//! Every program takes its filter from its `log` setting (`--log`,
//! `EMQ_LOG`, `log` in the config file; see [`crate::config`]).

use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::fmt::Subscriber;
use tracing_subscriber::EnvFilter;

/// The subscriber [`init`] installs: stderr, `filter`, time, level, thread
/// name and target on each line, colours on a terminal. A bad filter falls
/// back to `info` with a warning.
pub fn subscriber(filter: &str) -> Subscriber<DefaultFields, Format, EnvFilter, fn() -> std::io::Stderr> {
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
        .with_writer(move || writer.clone())
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&lines.0.lock()).into_owned();
    (result, text)
}
