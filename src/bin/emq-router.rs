//! `emq-router`: the broker. Runs on EventMQ's default addresses with no
//! configuration; see `emq-router --help` and `--print-config`. SIGTERM,
//! SIGINT and SIGHUP drain it, then it exits
//! ([`emq::program::stop_signals`]; docs/emqp.md "Shutdown").

use anyhow::Context;
use clap::Parser;
use emq::config::{self, ConfigArgs, RawRouterConfig};

/// The emq broker: named job queues served over eMQP (EventMQ 0.3.13's wire,
/// for clients, workers and schedulers) and the line-based text protocol.
/// Runs on EventMQ's default ports with no configuration. SIGTERM, SIGINT
/// and SIGHUP drain it (up to `drain_timeout`), then it exits.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawRouterConfig,
}

fn main() {
    emq::program::exit_on_error("emq-router", run());
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(config) = config::start(&args.config, args.raw)? else { return Ok(()) };
    // The handlers are in place before the router serves anything, so a
    // stop signal is never the default instant death (a peer may have been
    // answered before `start` returns).
    let mut signals =
        signal_hook::iterator::Signals::new(emq::program::stop_signals()).context("installing signal handlers")?;
    let handle = emq::router::start(config).context("cannot start")?;
    // The main thread waits for the signals itself (no thread of its own);
    // a router stopped otherwise (admin DISCONNECT) ends the wait.
    let signal_handle = signals.handle();
    handle.on_stopped(move || signal_handle.close());
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "signal received: shutting down");
        handle.shutdown();
    }
    handle.wait();
    Ok(())
}
