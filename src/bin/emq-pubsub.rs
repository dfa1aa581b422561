//! `emq-pubsub`: EventMQ's PUBLISH device. ROUTER in (default
//! `tcp://127.0.0.1:47298`), PUB out (`tcp://127.0.0.1:47299`); emits
//! `[topic, message]` per PUBLISH. SIGTERM, SIGINT and SIGHUP stop it cleanly
//! ([`emq::program::stop_signals`]). On start it prints one line
//! `emq-pubsub in=<endpoint> out=<endpoint>` on stdout (a stdout that cannot
//! be written is logged, and the device runs on). At exit it prints
//! `emq-pubsub: published …` and, with CURVE endpoints, `emq-pubsub: CURVE
//! handshakes: …` (docs/security.md "Where the CURVE counters are").

use std::os::fd::AsRawFd;

use anyhow::Context;
use clap::Parser;
use emq::config::{self, ConfigArgs, RawPubSubConfig};
use emq::pubsub::PubSub;

/// Publish/subscribe device, EventMQ compatible: publishers send PUBLISH
/// (`emq-cli publish`), subscribers receive `[topic, message]` on a ZeroMQ
/// SUB socket, filtered by topic prefix. SIGTERM, SIGINT and SIGHUP stop it.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawPubSubConfig,
}

fn main() {
    emq::program::exit_on_error("emq-pubsub", run());
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(settings) = config::start(&args.config, args.raw)? else { return Ok(()) };
    let (stop_rx, stop_tx) = std::os::unix::net::UnixStream::pair().context("signal pipe")?;
    for sig in emq::program::stop_signals() {
        signal_hook::low_level::pipe::register(sig, stop_tx.try_clone()?).context("signal handler")?;
    }
    let curve = config::pubsub_curve_settings(&settings)?;
    let mut device = PubSub::bind_with(
        &settings.pubsub_in,
        &settings.pubsub_out,
        settings.hwm,
        settings.max_message_bytes,
        curve.as_ref(),
    )?;
    let (i, o) = device.endpoints();
    let (ci, co) = device.curve_endpoints();
    if ci.is_some() || co.is_some() {
        tracing::info!(publishers = ?ci, subscribers = ?co, "CURVE endpoints bound");
    }
    if let Err(e) = emq::program::output(format_args!("emq-pubsub in={i} out={o}\n")) {
        tracing::warn!(error = format!("{e:#}"), "the endpoints line was not printed");
    }
    let stats = device.run(Some(stop_rx.as_raw_fd()))?;
    emq::program::diagnostic(format_args!(
        "emq-pubsub: published {} messages, dropped {} malformed and {} too big",
        stats.published, stats.malformed, stats.too_big
    ));
    if let Some(line) = device.curve_counts() {
        emq::program::diagnostic(format_args!("emq-pubsub: {line}"));
    }
    Ok(())
}
