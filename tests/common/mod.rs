//! Shared support for the integration tests (one test binary, `tests/tests.rs`).
//!
//! * [`watchdog`]: a per-test time limit that kills every child process and
//!   aborts the test binary when a test hangs (like rust-zmq's `tests/common`).
//! * [`ports`]: fresh loopback ports and "is it listening yet" checks.
//! * [`proc`]: child processes in their own process group, killed by PID on
//!   drop; per-test temp dirs; bounded waiting for a command to finish.
//! * [`wait`]: poll-until-condition helpers (no fixed sleeps in tests).
//! * [`python`]: the real Python EventMQ 0.3.13 venv (created on demand by
//!   `tests/interop/setup-venv.sh`), jobmanagers and client driver scripts.
//! * [`data`]: a fresh data directory per router (never the user's state dir).
//! * [`mounts`]: a tmpfs to fill and an ext4 that goes read-only, mounted
//!   for a test and unmounted by it (root only; one line says why not).
//! * [`nats`]: a 3-node nats-server cluster with JetStream
//!   (`sync_interval: always`) on fresh ports, nodes killed, stopped and
//!   restarted by index; skips in one line without nats-server, fails
//!   under CI.
//! * [`router`]: starting `emq-router` (or, with `EMQ_INTEROP_ROUTER=python`,
//!   the Python EventMQ router) on fresh ports.
//! * [`admin`]: a raw eMQP admin client (STATUS, ROUTER_SHOW_WORKERS, …).
//! * [`curvezmq`]: a raw CurveZMQ client (RFC 26 handshake, MESSAGE
//!   commands with the MORE flag inside the box), libsodium's crypto_box.
//! * [`refusals`]: the four CURVE refusals of an endpoint, each counted.
//! * [`jobs`]: reading the lines the interop job functions append.
//! * [`interop`]: the interop tests' one-at-a-time lock + watchdog
//!   (`begin`), a router with Python jobmanagers (`Setup`), and waiting for
//!   registered schedulers.

// Not every test module uses every helper.
#![allow(dead_code)]

pub mod admin;
pub mod curvezmq;
pub mod data;
pub mod interop;
pub mod jobs;
pub mod mounts;
pub mod nats;
pub mod ports;
pub mod proc;
pub mod python;
pub mod refusals;
pub mod relay;
pub mod router;
pub mod wait;
pub mod watchdog;
