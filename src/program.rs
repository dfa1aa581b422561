//! What every binary does at its end: an error becomes one line on stderr,
//! with each cause once, and exit status 1. And how the binaries write
//! outside their log: [`diagnostic`] (stderr, may be lost), [`output`]
//! (stdout, a command's product: its failure is an error), and the signals
//! that stop them ([`stop_signals`]).

use std::error::Error;
use std::io::Write;

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

/// `text` with its control characters escaped (`\u{1b}`, `\r`, `\n`), and
/// the invisible characters that reorder text (`\u{202e}`), for a terminal:
/// text from peers (queue names, msgids, task data, error texts) can then
/// neither move the cursor, colour the screen, break a line nor show in
/// another order than it is.
pub fn printable(text: &str) -> String {
    if !text.chars().any(hidden) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Control characters, and the invisible format characters that reorder
/// or hide text on a terminal: bidirectional embeddings, overrides and
/// isolates (U+202A–U+202E, U+2066–U+2069, the "Trojan Source" kind),
/// marks (U+200E, U+200F, U+061C), zero-width and invisible format
/// characters (U+200B–U+200D, U+2060–U+2064, U+206A–U+206F, U+00AD,
/// U+180E, U+FEFF, U+FFF9–U+FFFB), line and paragraph separators (U+2028,
/// U+2029) and tag characters (U+E0001, U+E0020–U+E007F, "ASCII
/// smuggling").
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200B}'..='\u{200F}')
        || matches!(c, '\u{2060}'..='\u{2064}' | '\u{206A}'..='\u{206F}' | '\u{2028}' | '\u{2029}')
        || matches!(c, '\u{061C}' | '\u{00AD}' | '\u{180E}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
        || matches!(c, '\u{E0001}' | '\u{E0020}'..='\u{E007F}')
}

/// Like [`printable`], but line breaks and tabs are kept (multi-line
/// messages, such as a config file's error with its caret line).
pub fn printable_lines(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
            body.split('\t').map(printable).collect::<Vec<_>>().join("\t") + end
        })
        .collect()
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

/// Writes `line` and a line break to stderr in one write, like `eprintln!`
/// but never panics: a failed write (a closed pipe, a full disk) is
/// dropped and counted in [`crate::logging::write_failures`]. For what a
/// program says outside its log (a summary at exit, an error at the end);
/// losing it must not stop the program.
pub fn diagnostic(line: std::fmt::Arguments<'_>) {
    // Not `format!`: it panics when a `Display` implementation fails.
    let mut text = String::new();
    let _ = std::fmt::Write::write_fmt(&mut text, line);
    text.push('\n');
    use tracing_subscriber::fmt::MakeWriter;
    // Never fails: a failed write is counted.
    let _ = crate::logging::lossy_stderr().make_writer().write_all(text.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_lines_kept_where_asked() {
        assert_eq!(printable("a\u{1b}[31mb\r\nc"), "a\\u{1b}[31mb\\r\\nc");
        assert_eq!(printable_lines("bad key\n  | x\t= \u{7}\r\n"), "bad key\n  | x\t= \\u{7}\\r\n");
    }

    #[test]
    fn invisible_reordering_characters_are_escaped_and_other_text_kept() {
        assert_eq!(printable("admin\u{202e}txt.exe"), "admin\\u{202e}txt.exe");
        assert_eq!(printable("a\u{2066}b\u{200b}c\u{feff}"), "a\\u{2066}b\\u{200b}c\\u{feff}");
        assert_eq!(printable("a\u{e0041}\u{2028}b\u{ad}"), "a\\u{e0041}\\u{2028}b\\u{ad}");
        assert_eq!(printable("café 東京 ✓"), "café 東京 ✓");
    }
}
