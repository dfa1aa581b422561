//! emq-scheduler: runs SCHEDULE'd jobs by sending REQUESTs to the router,
//! wire-compatible with EventMQ 0.3.13's scheduler (spec §7) and fixing its
//! defects S1–S14 (spec §12).
//!
//! * [`key`]: the schedule key, byte-exact with Python's
//!   `json.dumps(..., sort_keys=True)` + SHA-1 (spec §7.3), written by
//!   [`crate::protocol::pyjson`].
//! * [`schedule`]: one SCHEDULE validated (interval, cron, `run_count`,
//!   `nohaste`); [`cron`]: cron expressions as Vixie cron reads them and
//!   their fire times in a time zone; [`timetable`]: all schedules with a
//!   deadline heap, interval jobs on the monotonic clock and cron jobs on
//!   the wall clock. Pure logic over an explicit `now`.
//! * [`store`]: persistence (embedded crash-safe log by default);
//!   [`redis_store`]: EventMQ's Redis layout (spec §7.7).
//! * [`service`]: timetable + store, driven by messages and the clock.
//! * [`peer`]: the DEALER to the router and the admin socket (zmq lives here
//!   only); [`config`]: flags and `EMQ_SCHEDULER_*` variables.

pub mod config;
pub mod cron;
pub mod key;
pub mod peer;
pub mod redis_store;
pub mod schedule;
pub mod service;
pub mod store;
pub mod timetable;
