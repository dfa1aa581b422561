//! # emq: a job broker
//!
//! One broker, two front ends, one set of named queues:
//!
//! * **eMQP** over ZeroMQ, wire-compatible with EventMQ 0.3.13: the Python
//!   EventMQ client, jobmanager, scheduler and emq-cli work against
//!   `emq-router` unchanged.
//! * **The text protocol** over TCP: `SCHED`, `ASK` → `WANT?`/`NOPE`, `ACK`,
//!   `DCL`, `DEL`, `END`.
//!
//! ```text
//!  clients, schedulers ─► ┌──────────────┐
//!  workers ─────────────► │ zmq I/O      │ owns the ROUTER sockets, decodes
//!  emq-cli ─────────────► │ thread       │ frames, never holds queue state
//!                         └──────┬───────┘
//!          ShardMsg over channels │      ▲ typed Outgoing + eventfd wake-up
//!                                 ▼      │
//!                         ┌──────────────┐ per-queue FIFOs, weighted worker
//!                         │ dispatcher   │ selection, in-flight table,
//!                         │ shard 0..N-1 │ heartbeat/expiry timers, text offers
//!                         └──────┬───────┘
//!          TextCmd batches ▲     │ TextReply batches per I/O thread
//!  text clients ─► text I/O threads, one per 2 cores (mio readiness loops,
//!                  many non-blocking connections each, commands batched per shard)
//! ```
//!
//! What users read: `docs/emqp.md` (eMQP as emq speaks it and how it
//! differs from EventMQ), `docs/text-protocol.md`, `docs/configuration.md`
//! (every setting and limit of every program). Comments in the code point
//! there by section name, e.g. docs/emqp.md "Unknown queues".
//!
//! Modules, lowest layer first:
//! * [`ids`] and [`limits`]: identifier newtypes and every limit, shared by all layers.
//! * [`protocol`]: pure codecs (eMQP frames, headers, queue lists, text lines, Python JSON).
//! * [`job`]: the job data model (frames, job record, setbacks, dead jobs),
//!   shared by the broker and its job log.
//! * [`metrics`]: counters and latency histograms over plain keys.
//! * [`broker`]: dispatcher shards as deterministic state machines: queues,
//!   workers, selection, in-flight, timers, text offers.
//! * [`joblog`]: the contract between a shard and the log that keeps its
//!   jobs across a restart (hooks, tickets, faults, recovered facts), with
//!   no log at all ([`joblog::NoLog`]) as one implementation.
//! * [`wal`]: each shard's write-ahead log, the local implementation of
//!   [`joblog`] (group commit, recovery, compaction, repair).
//! * [`zmq_io`]: the only code that calls the zmq crate on the router side
//!   (I/O thread, egress, socket set-up).
//! * [`text`]: the text protocol server: a fixed pool of I/O threads, each a
//!   readiness loop over many connections, batching commands per shard.
//! * [`router`]: builds, starts, drains and stops the router; admin thread;
//!   latency reporter.
//! * [`client`]: Rust client libraries (eMQP client, admin client, worker, text client).
//! * [`scheduler`]: emq-scheduler (SCHEDULE/UNSCHEDULE, timers, persistence).
//! * [`config`]: settings, declared once and validated once; [`logging`]
//!   and [`program`]: what every binary does at its start and end;
//!   [`printable`]: peer text made safe for a terminal; [`fds`]: the
//!   process's descriptor limit; [`wake`]: waking a thread blocked in a
//!   poll; [`tls`]: server TLS from PEM files, reloaded when they change.
//! * [`zmq_error`]: [`zmq_error::ZmqError`], the error of a failed zmq call, for every layer;
//!   [`heap`]: giving freed C-heap pages back to the OS after connection churn.

#![warn(missing_docs)]

pub mod bench;
pub mod broker;
pub mod client;
pub mod config;
pub mod curve;
pub mod fds;
pub mod heap;
pub mod ids;
pub mod job;
pub mod joblog;
pub mod jslog;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod printable;
pub mod program;
pub mod protocol;
pub mod pubsub;
pub mod router;
pub mod scheduler;
pub mod text;
pub mod tls;
pub mod wake;
pub mod wal;
pub mod zmq_error;
pub mod zmq_io;
