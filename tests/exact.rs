//! Exact tracking (project issue 11): every job, peer and schedule is known
//! by a unique key, and every refusal reaches its sender. Each module takes
//! one point of the issue and checks it over real sockets on fresh ports,
//! every test under a watchdog.

mod handover;
mod ids;
mod inform;
