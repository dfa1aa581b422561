//! emq-scheduler: connects to the router frontend as an eMQP scheduler and
//! runs SCHEDULE'd jobs (see `emq::scheduler`). Stops on SIGTERM/SIGINT after
//! sending KBYE.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use anyhow::Context;
use clap::Parser;
use emq::scheduler::config::{SchedulerArgs, SchedulerConfig};
use emq::scheduler::peer;
use emq::scheduler::redis_store::RedisStore;
use emq::scheduler::service::Service;
use emq::scheduler::store::{FileStore, Store};

fn main() -> anyhow::Result<()> {
    emq::logging::init_from_env();
    let args = SchedulerArgs::parse();
    let cfg = SchedulerConfig::from_args(&args).context("invalid configuration")?;
    if args.print_config {
        print!("{}", cfg.render());
        return Ok(());
    }
    let (signal_read, signal_write) = UnixStream::pair().context("signal pipe")?;
    signal_read.set_nonblocking(true).context("signal pipe")?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let w = signal_write.try_clone().context("signal pipe")?;
        signal_hook::low_level::pipe::register(sig, w).context("register signal handler")?;
    }
    let mut cfg = cfg;
    let store: Box<dyn Store> = match &cfg.redis {
        Some(url) => Box::new(RedisStore::connect(url).with_context(|| format!("redis store {url}"))?),
        None => {
            let store =
                FileStore::open(&cfg.data_dir).with_context(|| format!("data dir {}", cfg.data_dir.display()))?;
            if cfg.peer.name.is_none() {
                cfg.peer.name = Some(store.stable_name().context("scheduler name")?);
            }
            Box::new(store)
        }
    };
    if cfg.peer.name.is_none() {
        cfg.peer.name = Some(uuid::Uuid::new_v4().hyphenated().to_string());
    }
    let now = emq::scheduler::timetable::Now::read();
    let mut service = Service::restore(cfg.tz, store, now).context("restoring schedules")?;
    peer::run(&cfg.peer, &mut service, signal_read.as_raw_fd()).context("scheduler stopped")?;
    Ok(())
}
