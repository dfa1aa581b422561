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
    // A thread hears the signals from now on: a standby waiting for its
    // name stops waiting at once (nothing taken, nothing to hand back); a
    // start past the wait finishes and is then stopped cleanly.
    let signal_handle = signals.handle();
    let (sig_tx, sig_rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("emq-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                emq::jslog::ownership::stop_waiting();
                if sig_tx.send(sig).is_err() {
                    break;
                }
            }
        })
        .context("starting the signal thread")?;
    let handle = match emq::router::start(config) {
        Ok(handle) => handle,
        Err(emq::router::StartError::Js(e @ emq::jslog::JsError::Stopped { .. })) => {
            tracing::info!("{e}: exiting");
            return Ok(());
        }
        Err(e) => return Err(e).context("cannot start"),
    };
    // A router stopped otherwise (admin DISCONNECT) ends the wait.
    handle.on_stopped(move || signal_handle.close());
    if let Ok(sig) = sig_rx.recv() {
        tracing::info!(signal = sig, "signal received: shutting down");
        handle.shutdown();
    }
    handle.wait();
    Ok(())
}
