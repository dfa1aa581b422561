//! `emq-router`: the broker. Runs on EventMQ's default addresses with no
//! configuration; see `emq-router --help` and `--print-config`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use emq::config::{self, RawRouterConfig, DEFAULT_TOML};
use emq::router::Recovery;
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
    /// Start even when the write-ahead log is damaged in the middle: skip
    /// the damaged bytes (logged with counts), move the damaged segments to
    /// the data directory's `damaged/` folder and start with the rest.
    #[arg(long)]
    recover_skip_damaged: bool,
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
    let recovery = if args.recover_skip_damaged { Recovery::SkipDamaged } else { Recovery::Strict };
    let handle = emq::router::start_full(config, Arc::new(Vec::new), recovery).context("emq-router could not start")?;
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let signal_handle = signals.handle();
    let stopper = handle.stop_handle();
    std::thread::Builder::new().name("emq-signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "signal received: shutting down");
            stopper.shutdown();
        }
    })?;
    handle.wait();
    signal_handle.close();
    Ok(())
}
