//! `emq-pubsub`: EventMQ's PUBLISH device. ROUTER in (default
//! `tcp://127.0.0.1:47298`), PUB out (`tcp://127.0.0.1:47299`); emits
//! `[topic, message]` per PUBLISH. SIGTERM/SIGINT stop it cleanly. On start it
//! prints one line `emq-pubsub in=<endpoint> out=<endpoint>` on stdout.

use std::io::Write;
use std::os::fd::AsRawFd;

use anyhow::Context;
use clap::Parser;
use emq::limits;
use emq::pubsub::PubSub;

/// EventMQ-compatible PUBLISH device.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Incoming ROUTER address (publishers connect here).
    #[arg(long = "in", env = "EMQ_PUBSUB_IN", default_value = limits::PUBSUB_IN_ADDR)]
    in_addr: String,
    /// Outgoing PUB address (subscribers connect here).
    #[arg(long = "out", env = "EMQ_PUBSUB_OUT", default_value = limits::PUBSUB_OUT_ADDR)]
    out_addr: String,
}

fn main() -> anyhow::Result<()> {
    emq::logging::init_from_env();
    let args = Args::parse();
    let (stop_rx, stop_tx) = std::os::unix::net::UnixStream::pair().context("signal pipe")?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::low_level::pipe::register(sig, stop_tx.try_clone()?).context("signal handler")?;
    }
    let mut device = PubSub::bind(&args.in_addr, &args.out_addr)?;
    let (i, o) = device.endpoints();
    println!("emq-pubsub in={i} out={o}");
    std::io::stdout().flush()?;
    let stats = device.run(Some(stop_rx.as_raw_fd()))?;
    eprintln!("emq-pubsub: published {} messages, dropped {} malformed", stats.published, stats.malformed);
    Ok(())
}
