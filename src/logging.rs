//! Log set-up shared by the binaries: tracing to stderr, one line per event
//! with the name of the thread that wrote it (`emq-io-0`, `emq-shard-3`,
//! `emq-text-7`, ...), so a line tells which shard or I/O thread it
//! came from.

/// Installs a stderr subscriber with `filter` (e.g. `info`, `emq=debug`).
/// Each line carries the time, the level, the thread name and the target.
/// A bad filter falls back to `info` with a warning; calling twice is harmless.
pub fn init(filter: &str) {
    let env = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("bad log filter {filter:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(env)
        .with_ansi(ansi)
        .with_thread_names(true)
        .with_writer(std::io::stderr)
        .try_init();
}

/// [`init`] with the filter from `EMQ_LOG`, else `RUST_LOG`, else `info`.
pub fn init_from_env() {
    let filter = std::env::var("EMQ_LOG").or_else(|_| std::env::var("RUST_LOG")).unwrap_or_else(|_| "info".into());
    init(&filter);
}
