//! emq-scheduler: runs SCHEDULE'd jobs by sending REQUESTs to the router,
//! wire-compatible with EventMQ 0.3.13's scheduler (docs/emqp.md "The scheduler") and fixing its
//! defects (docs/emqp.md "Differences from EventMQ").
//!
//! * [`key`]: the schedule key, byte-exact with Python's
//!   `json.dumps(..., sort_keys=True)` + SHA-1 (docs/emqp.md "The scheduler"), written by
//!   [`crate::protocol::pyjson`].
//! * [`schedule`]: one SCHEDULE validated (interval, cron, `run_count`,
//!   `nohaste`); [`cron`]: cron expressions as Vixie cron reads them and
//!   their fire times in a time zone; [`timetable`]: all schedules with a
//!   deadline heap, interval jobs on the monotonic clock and cron jobs on
//!   the wall clock. Pure logic over an explicit `now`.
//! * [`store`]: persistence (embedded crash-safe log by default);
//!   [`redis_store`]: EventMQ's Redis layout (docs/emqp.md "The scheduler");
//!   [`nats_store`]: a NATS JetStream key-value bucket, with [`lease`]: one
//!   active scheduler per name and standbys that take over.
//! * [`service`]: timetable + store, driven by messages and the clock.
//! * [`peer`]: the DEALER to the router and the admin socket (zmq lives here
//!   only); [`config`]: flags and `EMQ_SCHEDULER_*` variables.

pub mod config;
pub mod cron;
pub mod key;
pub mod lease;
pub mod nats_store;
pub mod peer;
pub mod redis_store;
pub mod schedule;
pub mod service;
pub mod store;
pub mod timetable;
