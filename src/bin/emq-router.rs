//! `emq-router`: the broker. Runs on EventMQ's default addresses with no
//! configuration; see `emq-router --help` and `--print-config`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use emq::config::{self, RawRouterConfig, DEFAULT_TOML};
use signal_hook::consts::{SIGINT, SIGTERM};

/// emq-router: eMQP (EventMQ 0.3.13 wire) and text-protocol job broker.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML configuration file (keys as printed by --print-config).
    #[arg(long, short = 'C', env = "EMQ_CONFIG")]
    config: Option<PathBuf>,
    /// Print the configuration (commented; flags, EMQ_* variables and
    /// --config applied) and exit.
    #[arg(long)]
    print_config: bool,
    /// Log filter (tracing-subscriber syntax: `info`, `emq=debug`…).
    #[arg(long, env = "EMQ_LOG", default_value = "info")]
    log: String,
    #[command(flatten)]
    raw: RawRouterConfig,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    emq::logging::init(&args.log);
    let raw = config::layered(args.raw, args.config.as_deref())?;
    let config = raw.clone().validate()?;
    if args.print_config {
        print!("{}", config::template::resolved(&raw, DEFAULT_TOML)?);
        return Ok(());
    }
    let handle = emq::router::start(config).context("emq-router could not start")?;
    // The main thread waits for the signals itself (no thread of its own);
    // a router stopped otherwise (admin DISCONNECT) ends the wait.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let signal_handle = signals.handle();
    handle.on_stopped(move || signal_handle.close());
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "signal received: shutting down");
        handle.shutdown();
    }
    handle.wait();
    Ok(())
}
