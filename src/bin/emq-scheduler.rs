//! emq-scheduler: connects to the router frontend as an eMQP scheduler and
//! runs SCHEDULE'd jobs (see `emq::scheduler`). Stops on SIGTERM, SIGINT or
//! SIGHUP after sending KBYE ([`emq::program::stop_signals`]).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use anyhow::Context;
use clap::Parser;
use emq::config::{self, ConfigArgs};
use emq::scheduler::config::RawSchedulerConfig;
use emq::scheduler::nats_store::NatsStore;
use emq::scheduler::peer;
use emq::scheduler::redis_store::RedisStore;
use emq::scheduler::service::Service;
use emq::scheduler::store::{DataDir, FileStore, Store};

/// Runs scheduled jobs for an emq (or EventMQ) router: interval and cron
/// schedules sent with SCHEDULE (`emq-cli schedule`), kept across restarts,
/// each firing sent as a REQUEST to its queue. EventMQ 0.3.13 compatible.
/// SIGTERM, SIGINT and SIGHUP stop it (KBYE, store synced).
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawSchedulerConfig,
}

fn main() {
    emq::program::exit_on_error("emq-scheduler", run());
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(cfg) = config::start(&args.config, args.raw)? else { return Ok(()) };
    let (signal_read, signal_write) = UnixStream::pair().context("signal pipe")?;
    signal_read.set_nonblocking(true).context("signal pipe")?;
    for sig in emq::program::stop_signals() {
        let w = signal_write.try_clone().context("signal pipe")?;
        signal_hook::low_level::pipe::register(sig, w).context("register signal handler")?;
    }
    let mut cfg = cfg;
    // A Redis scheduler keeps only its name in its data directory (locked,
    // so two schedulers on one host need two directories or two names).
    let mut data_dir = None;
    let store: Box<dyn Store> = match (&cfg.redis, &cfg.nats) {
        // A NATS scheduler needs no data directory: its name is given, its
        // schedules and lease are in the cluster. A standby waits here.
        (_, Some(nats)) => {
            let stopping = || {
                let mut buf = [0u8; 16];
                matches!((&signal_read).read(&mut buf), Ok(n) if n > 0)
            };
            match NatsStore::open(nats, stopping).with_context(|| format!("nats store {}", nats.urls.join(",")))? {
                Some(store) => Box::new(store),
                None => {
                    tracing::info!("signal received while standing by: stopped");
                    return Ok(());
                }
            }
        }
        (Some(url), None) => {
            if cfg.peer.name.is_none() {
                let dir =
                    DataDir::open(&cfg.data_dir).with_context(|| format!("data dir {}", cfg.data_dir.display()))?;
                cfg.peer.name = Some(dir.stable_name().context("scheduler name")?);
                data_dir = Some(dir);
            }
            let name = cfg.peer.name.clone().unwrap_or_default();
            Box::new(RedisStore::open(url, &name).with_context(|| format!("redis store {url}"))?)
        }
        (None, None) => {
            let store =
                FileStore::open(&cfg.data_dir).with_context(|| format!("data dir {}", cfg.data_dir.display()))?;
            if cfg.peer.name.is_none() {
                cfg.peer.name = Some(store.stable_name().context("scheduler name")?);
            }
            Box::new(store)
        }
    };
    let now = emq::scheduler::timetable::Now::read();
    let mut service = Service::restore(cfg.tz, store, now);
    peer::run(&cfg.peer, &mut service, signal_read.as_raw_fd()).context("scheduler stopped")?;
    let lost = service.lease_lost();
    drop(service);
    drop(data_dir);
    match lost {
        Some(why) => anyhow::bail!("stopped: {why}"),
        None => Ok(()),
    }
}
