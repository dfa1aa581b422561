//! Shared scaffolding of the interop tests (`tests/interop.rs`,
//! `tests/interop_scheduler.rs`): the one-at-a-time lock with the per-test
//! watchdog ([`begin`]), a router with Python jobmanagers attached
//! ([`Setup`]), and waiting for registered schedulers ([`wait_schedulers`]).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::admin::{self, Worker};
use super::proc::{Child, TestDir};
use super::router::Router;
use super::{python, wait, watchdog};

/// Python jobmanager registration takes an INFORM/ACK round trip; its READYs
/// come only after the first router HEARTBEAT (EventMQ 0.3.13 forks its pool then).
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);
/// Creating the venv on a fresh machine (pip, a psutil build) may take a while.
pub const VENV_TIMEOUT: Duration = Duration::from_secs(900);

/// Starts an interop test: waits for the other interop tests to finish (each
/// runs a router and several Python processes; run together on a loaded
/// 2-core machine, late heartbeats could make a router expire a live
/// jobmanager), makes sure the venv exists (under its own time limit), then
/// arms the test's watchdog for `limit`. Hold both until the test ends.
pub fn begin(test: &str, limit: Duration) -> (MutexGuard<'static, ()>, watchdog::Watchdog) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    {
        let _venv_dog = watchdog::start(&format!("{test} (venv setup)"), VENV_TIMEOUT);
        python::venv();
    }
    (turn, watchdog::start(test, limit))
}

/// A router with Python jobmanagers attached, in one temp dir.
pub struct Setup {
    /// The test's scratch directory (logs, jobs files).
    pub dir: TestDir,
    /// The router under test.
    pub router: Router,
    /// The jobmanagers (and any other peers the test adds).
    pub jobmanagers: Vec<Child>,
}

impl Setup {
    /// Starts a router and one `emq-jobmanager -J concurrency` per
    /// `(label, queues)`, and waits until the router lists each of them with
    /// all `concurrency` READY slots.
    pub fn start(test: &str, jms: &[(&str, &str)], concurrency: u32) -> Setup {
        let dir = TestDir::new(test);
        let router = Router::start(&dir);
        let jobmanagers = jms
            .iter()
            .map(|(label, q)| python::start_jobmanager(&dir, &router.backend, label, q, concurrency))
            .collect();
        let mut setup = Setup { dir, router, jobmanagers };
        let queues: Vec<&str> = jms.iter().map(|(_, q)| *q).collect();
        setup.wait_workers(&queues, concurrency);
        setup
    }

    /// Waits until ROUTER_SHOW_WORKERS lists one worker per queue list, each
    /// with `slots` available slots; returns them in `queues` order.
    pub fn wait_workers(&mut self, queues: &[&str], slots: u32) -> Vec<Worker> {
        let admin = self.router.admin.clone();
        let got = wait::until_ok(REGISTER_TIMEOUT, || {
            let listed = admin::workers(&admin)?;
            let found: Vec<Worker> = queues.iter().filter_map(|q| admin::worker_serving(&listed, q)).collect();
            if found.len() == queues.len() && found.iter().all(|w| w.available_slots == i64::from(slots)) {
                Ok(found)
            } else {
                Err(format!("workers listed: {listed:?}"))
            }
        });
        got.unwrap_or_else(|why| panic!("jobmanagers did not register with {slots} slots each: {why}\n{}", self.logs()))
    }

    /// Log tails of the router and every jobmanager (for failure messages).
    pub fn logs(&self) -> String {
        let mut all = vec![self.router.child.log_tail(30)];
        all.extend(self.jobmanagers.iter().map(|jm| jm.log_tail(15)));
        all.join("\n")
    }
}

/// Waits until ROUTER_SHOW_SCHEDULERS on `admin_addr` lists exactly `n`
/// schedulers; returns its `connected_schedulers` object
/// (`{id: {"hb", "scheduled"}}`; `scheduled` only from `emq-router`).
pub fn wait_schedulers(admin_addr: &str, n: usize) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    wait::until_ok(REGISTER_TIMEOUT, || {
        let reply = admin::request(admin_addr, "ROUTER_SHOW_SCHEDULERS")?;
        match reply["connected_schedulers"].as_object() {
            Some(map) if map.len() == n => Ok(map.clone()),
            _ => Err(format!("ROUTER_SHOW_SCHEDULERS: {reply}")),
        }
    })
}
