//! What every binary does at its end: an error becomes one line on stderr,
//! with each cause once, and exit status 1. And how the binaries write
//! outside their log: [`diagnostic`] (stderr, may be lost), [`output`]
//! (stdout, a command's product: its failure is an error), and the signals
//! that stop them ([`stop_signals`]).

use std::error::Error;
use std::io::Write;

pub use crate::logging::diagnostic;
pub use crate::printable::{printable, printable_lines};

/// `program: error: cause: …`. A cause whose text the line already holds is
/// left out, so an error that prints its source (`config file x: <TOML
/// error>`, `zmq bind … failed: Address already in use`) is not printed
/// twice.
///
/// ```
/// use emq::program::error_line;
/// let io = std::io::Error::other("disk full");
/// let outer = anyhow::Error::new(io).context("cannot write x");
/// assert_eq!(error_line("emq-x", outer.as_ref()), "emq-x: cannot write x: disk full");
/// ```
pub fn error_line(program: &str, error: &(dyn Error + 'static)) -> String {
    let mut line = format!("{program}: {error}");
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = e.source();
    }
    line
}

/// Runs a binary's `main`: on error, prints [`error_line`] to stderr (control
/// characters escaped but line breaks, [`printable_lines`]; a [`diagnostic`],
/// so a stderr that cannot be written changes nothing) and exits with
/// status 1.
pub fn exit_on_error<E: AsRef<dyn Error + Send + Sync + 'static>>(program: &str, result: Result<(), E>) {
    if let Err(e) = result {
        diagnostic(format_args!("{}", printable_lines(&error_line(program, e.as_ref()))));
        std::process::exit(1);
    }
}

/// Writes `text` to stdout and flushes it, like `print!` but returning the
/// error instead of panicking: for a command's product (emq-cli's answer,
/// emq-bench's report), whose loss is the command's failure. A reader gone
/// away ends the process by SIGPIPE where [`exit_on_broken_pipe`] was
/// called; otherwise (`EPIPE` with SIGPIPE ignored, `ENOSPC`, `EIO`) the
/// error names stdout.
///
/// # Errors
/// The write's or the flush's error, in the context "cannot write to
/// stdout".
pub fn output(text: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut out = std::io::stdout().lock();
    out.write_fmt(text).and_then(|()| out.flush()).context("cannot write to stdout")
}

/// The signals that stop a long-running program gracefully (the router,
/// the scheduler, the worker, the pub/sub device, emq-bench's forwarder),
/// each as it stops at SIGTERM (the router and the worker drain):
/// SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal or ssh session that
/// started it closed). None of the programs reloads its configuration, so
/// SIGHUP has no other use; unhandled, it would kill the program at once
/// (no drain, a worker's running jobs left orphaned while the router gives
/// them to another worker). SIGHUP is left out when the program was
/// started with it ignored (`nohup`): it then survives the session's end,
/// as the user asked.
pub fn stop_signals() -> Vec<std::ffi::c_int> {
    let mut signals = vec![libc::SIGTERM, libc::SIGINT];
    if !ignored(libc::SIGHUP) {
        signals.push(libc::SIGHUP);
    }
    signals
}

/// Whether `signal`'s disposition is "ignore" (inherited from the parent,
/// as `nohup` sets SIGHUP's).
fn ignored(signal: std::ffi::c_int) -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current
    // disposition into `old`, a zeroed sigaction owned here.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Lets SIGPIPE end the process, as it does other Unix tools: output piped
/// into `head` then stops quietly instead of failing with "Broken pipe"
/// (Rust ignores SIGPIPE by default).
pub fn exit_on_broken_pipe() {
    // SAFETY: signal(2) with SIG_DFL only resets the disposition; no handler runs our code.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
