//! Every default and limit in one place, typed, each with its reason
//! (the habit of NATS `server/const.go`). Durations are [`Duration`]; raw
//! numbers carry their unit in their name.

use std::time::Duration;

/// eMQP frontend (clients, schedulers): EventMQ's `FRONTEND_ADDR` (spec §1).
pub const FRONTEND_ADDR: &str = "tcp://127.0.0.1:47291";
/// eMQP backend (workers): EventMQ's `BACKEND_ADDR` (spec §1).
pub const BACKEND_ADDR: &str = "tcp://127.0.0.1:47290";
/// Admin socket (emq-cli): EventMQ's `ADMINISTRATIVE_ADDR` (spec §1).
pub const ADMIN_ADDR: &str = "tcp://127.0.0.1:47293";
/// Text protocol listener (spec text-protocol.md).
pub const TEXT_ADDR: &str = "127.0.0.1:47294";
/// Pub/sub device, incoming ROUTER: EventMQ's `PUBLISHER_INCOMING_ADDR`.
pub const PUBSUB_IN_ADDR: &str = "tcp://127.0.0.1:47298";
/// Pub/sub device, outgoing PUB: EventMQ's `PUBLISHER_OUTGOING_ADDR`.
pub const PUBSUB_OUT_ADDR: &str = "tcp://127.0.0.1:47299";

/// Heartbeat send period to every worker and scheduler. EventMQ's
/// `HEARTBEAT_INTERVAL` (3 s); Python peers reconnect after ~15 s of silence.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// A worker or scheduler silent this long is dead. EventMQ's
/// `HEARTBEAT_TIMEOUT` (5 s); Python peers heartbeat every 3 s.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// Python EventMQ peers send a HEARTBEAT this often (spec §3.5), whatever
/// the router's settings: a shorter `heartbeat_timeout` expires them.
pub const PYTHON_PEER_HEARTBEAT: Duration = Duration::from_secs(3);
/// How late a Python peer's heartbeat may arrive (its loop and the network):
/// `heartbeat_timeout` should be at least [`PYTHON_PEER_HEARTBEAT`] plus this.
pub const PYTHON_PEER_HEARTBEAT_SLACK: Duration = Duration::from_millis(500);
/// Python EventMQ peers reconnect after this much router silence (spec §6.6),
/// so the router must heartbeat them at least three times as often.
pub const PYTHON_PEER_SILENCE: Duration = Duration::from_secs(15);
/// How long a worker that said KBYE keeps its in-flight jobs before they
/// are requeued: EventMQ's jobmanager finishes running jobs for up to
/// `KILL_GRACE_PERIOD` (300 s) after its KBYE, without heartbeating.
pub const KBYE_GRACE: Duration = Duration::from_secs(300);
/// A job requeued this many times because the workers holding it died is
/// dropped (logged with its body, counted as `dead_lettered`): a job that
/// kills every worker that takes it must not cycle through the pool forever.
pub const MAX_DELIVERIES: u32 = 5;
/// The queue a REQUEST for an unknown queue falls back to, and the queue of
/// an empty INFORM: EventMQ's `DEFAULT_QUEUE_NAME`.
pub const DEFAULT_QUEUE: &str = "default";
/// Weight of the default queue for an INFORM with an empty queue list:
/// EventMQ's `QUEUES = [(10, "default")]`.
pub const DEFAULT_QUEUE_WEIGHT: i64 = 10;
/// Most frames in one eMQP message (identity included): a REQUEST has 8
/// and may carry a few extra; a message with more is read, dropped and
/// counted as malformed.
pub const MAX_FRAMES: usize = 64;
/// Longest msgid (REQUEST D3) the broker accepts, in bytes: Python peers
/// send 36-byte uuids; the job record keeps the length in one byte.
pub const MAX_MSGID_BYTES: usize = 255;
/// Longest queue name in bytes, for both protocols (the text protocol's
/// rule; an eMQP REQUEST naming a longer queue gets `ERROR BAD_REQUEST`).
pub const MAX_QUEUE_NAME_BYTES: usize = 255;
/// Longest REQUEST headers frame (D5) in bytes: headers are a short CSV.
pub const MAX_HEADERS_BYTES: usize = 65_535;
/// Waiting jobs per queue before REQUEST/SCHED is rejected. EventMQ uses
/// 10,000 (`HWM`) and a RAM-sized limit for `default` (D9); we use one
/// explicit bound large enough for bursts (100,000-line pipelines).
pub const MAX_QUEUE_LEN: usize = 1_000_000;
/// How long shutdown waits for queued and in-flight jobs to finish before it
/// logs what remains and exits.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// ZeroMQ high-water mark (messages per peer pipe) on the router's sockets.
/// libzmq's default of 1,000 drops or blocks bursts; workers and clients
/// that pipeline need more.
pub const ZMQ_HWM: i32 = 100_000;
/// How long a closing router socket may still flush queued frames (at
/// shutdown, after the KBYEs were handed over).
pub const ROUTER_LINGER: Duration = Duration::from_millis(200);
/// Most dispatcher shards: the text front end packs the shard index in 16
/// bits.
pub const MAX_SHARDS: usize = 65_535;
/// Most messages one loop turn takes from one source before it looks at the
/// others: bounded batches keep latency predictable (rumqttd's 500).
pub const BATCH: usize = 512;
/// How long the admin thread and the latency reporter wait for every
/// shard's answer (shards answer within one batch unless stopped).
pub const SHARD_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest text-protocol line, not counting LF or a CR before it
/// (text-protocol.md: 1 MiB).
pub const TEXT_MAX_LINE_BYTES: usize = 1 << 20;
/// An offer not answered within this time goes back to the front of its
/// queue (text-protocol.md: 300 s).
pub const TEXT_OFFER_TIMEOUT: Duration = Duration::from_secs(300);
/// A connection holding a partial line this long is closed
/// (text-protocol.md: 60 s).
pub const TEXT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most open text connections; past it `ERR BUSY` (text-protocol.md: 10,000).
pub const TEXT_MAX_CONNECTIONS: usize = 10_000;
/// How long a text connection waits for its shard's answer before it
/// reports the broker as shutting down (shards answer in microseconds
/// unless stopped).
pub const TEXT_SHARD_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the text server's shutdown waits for connection threads to end.
pub const TEXT_SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// How long an acceptor waits to write `ERR BUSY` to a refused client.
pub const TEXT_BUSY_WRITE_TIMEOUT: Duration = Duration::from_millis(200);
/// Pause after a failed `accept` (for example out of file descriptors), so
/// an acceptor does not spin.
pub const TEXT_ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(20);
/// How often the router's drain looks at the shards.
pub const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Threads calling `accept` on the text listener.
pub const TEXT_ACCEPTORS: usize = 2;
/// Pending-connection queue of the text listener: absorbs connection bursts
/// (load generators open hundreds at once) while the acceptors catch up.
pub const TEXT_LISTEN_BACKLOG: i32 = 1024;
/// Bytes a text connection reads at a time: one read takes a whole pipelined
/// burst of small commands (about 4,000 SCHED lines).
pub const TEXT_READ_BUF_BYTES: usize = 64 * 1024;
/// A text connection's pending answers are written once they reach this
/// size, even in the middle of a pipelined batch, so a client that
/// pipelines many ASKs does not pin memory.
pub const TEXT_OUT_FLUSH_BYTES: usize = 64 * 1024;
/// Stack of a text connection thread. Its buffers live on the heap and
/// nothing recurses, so 256 KiB is plenty; 10,000 connections then reserve
/// 2.5 GiB of address space instead of 20 GiB with the 2 MiB default.
pub const TEXT_CONN_STACK_BYTES: usize = 256 * 1024;

/// SCHEDs and answers (ACK, DCL, DEL) one text connection hands to the
/// shards before it waits for their outcomes (it also waits before any
/// other command and before reading more): bounds what a pipelining client
/// has in the shards' channels.
pub const TEXT_PENDING_SCHEDS: usize = 256;
/// `durability = "async"`: how often a shard syncs its log. A power cut
/// (not a crash of the process: records are written at the end of every
/// batch) loses at most this much of acknowledged work; beanstalkd's `-f`
/// default is the same 50 ms.
pub const WAL_SYNC_INTERVAL: Duration = Duration::from_millis(50);
/// A log segment is closed, and the next begun, at this size: large enough
/// that creating files is rare (one per ~400,000 small jobs), small enough
/// that a segment holding a few old jobs is cheap to copy forward.
pub const WAL_SEGMENT_BYTES: u64 = 64 << 20;
/// Smallest segment size accepted: a segment must hold its header and a
/// few records (tests use small segments to exercise rotation).
pub const WAL_MIN_SEGMENT_BYTES: u64 = 4096;
/// Default of `wal_sync_thread` (measured: README "Durability").
pub const WAL_SYNC_THREAD: bool = true;
/// The log keeps its disk use within this factor of the bytes of its live
/// jobs' records (plus the segment being written): a segment less than
/// 1/factor full is compacted by copying its waiting jobs forward.
pub const WAL_DISK_FACTOR: u64 = 2;
/// Waiting jobs compaction looks at per shard batch: bounds the pause a
/// compaction step adds to one batch (about 20 µs per 4,096 jobs looked at).
pub const WAL_COMPACT_STEP_JOBS: usize = 4096;
/// Record bytes compaction copies forward per shard batch: bounds the write
/// a compaction step adds to one batch.
pub const WAL_COMPACT_STEP_BYTES: usize = 1 << 20;
/// Attempts to take the data directory's lock before giving up (see
/// [`SCHEDULER_LOCK_TRIES`] for why it is retried at all).
pub const DATA_DIR_LOCK_TRIES: u32 = 20;
/// Pause between two attempts to take the data directory's lock.
pub const DATA_DIR_LOCK_RETRY: Duration = Duration::from_millis(50);

/// Period of the latency reporter's log line.
pub const LATENCY_REPORT_INTERVAL: Duration = Duration::from_secs(60);
/// Largest latency an HdrHistogram records (1 hour, in microseconds).
pub const LATENCY_MAX_US: u64 = 3_600_000_000;

/// How long a worker (`emq-worker`, `client::worker`) waits for running jobs
/// after KBYE before it closes. EventMQ waits up to 300 s
/// (`KILL_GRACE_PERIOD`); 30 s fits an orchestrator's stop grace period.
pub const WORKER_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a child's stdout `emq-worker` keeps as the job result.
pub const WORKER_MAX_RESULT_BYTES: usize = 16 << 20;
/// emq-scheduler's own admin socket (`SCHEDULES` query). The next free port
/// after the router's ports (47290-47294); EventMQ's scheduler had none.
pub const SCHEDULER_ADMIN_ADDR: &str = "tcp://127.0.0.1:47295";
/// The time zone cron expressions are evaluated in unless configured: a
/// fixed zone, so that schedules do not move with a host's local zone or
/// its daylight saving time.
pub const SCHEDULER_TIMEZONE: &str = "UTC";
/// Longest accepted schedule interval: 10 years. Bounds the time arithmetic;
/// longer periods are better written as cron expressions.
pub const SCHEDULER_MAX_INTERVAL_SECS: u64 = 10 * 366 * 24 * 3600;
/// The scheduler re-registers under a new identity after this much router
/// silence: EventMQ's peers use 3 × `HEARTBEAT_TIMEOUT` (~15 s, spec §6.6).
pub const SCHEDULER_ROUTER_TIMEOUT: Duration = Duration::from_secs(15);
/// While waiting for the ACK of its INFORM, the scheduler re-sends INFORM
/// this often (EventMQ never re-sent it and hung: J18).
pub const SCHEDULER_INFORM_RETRY: Duration = Duration::from_secs(5);
/// Attempts to take the scheduler data directory's lock before giving up: a
/// copy of a just-closed lock descriptor can live on in a child between its
/// fork and exec, and a restarted scheduler's predecessor may still be
/// exiting. With [`SCHEDULER_LOCK_RETRY`], about one second in all.
pub const SCHEDULER_LOCK_TRIES: u32 = 20;
/// Pause between two attempts to take the data directory's lock.
pub const SCHEDULER_LOCK_RETRY: Duration = Duration::from_millis(50);
/// Stale timer-heap entries the scheduler tolerates beyond 2 × live jobs
/// before it rebuilds the heap: small heaps are never rebuilt.
pub const SCHEDULER_STALE_HEAP_ENTRIES: usize = 1024;
/// How long the scheduler waits for a Redis connection (EventMQ's store).
pub const SCHEDULER_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deepest JSON nesting the scheduler's Python-compatible JSON parser
/// accepts: bounds its recursion (CPython's own limit is about 1,000).
pub const PYJSON_MAX_DEPTH: usize = 256;
/// The scheduler's log store is compacted once it holds more than
/// max(this, 2 × live schedules) lines: small logs are never rewritten.
pub const SCHEDULER_COMPACT_MIN_LINES: usize = 1_000;

/// How long a client call (`client::emqp`, `client::admin`, `emq-cli`)
/// waits for a connection and an answer unless told otherwise: long enough
/// for a loaded broker nearby, short enough for an interactive command.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// Most early answers an eMQP `Client` keeps for later `wait` calls before it
/// drops them all: bounds memory when a caller never waits.
pub const CLIENT_MAX_STASHED_ANSWERS: usize = 65_536;
/// Longest line the text client reads from a server: the server's default
/// line limit plus `WANT? ` and the LF.
pub const TEXT_CLIENT_MAX_LINE_BYTES: u64 = TEXT_MAX_LINE_BYTES as u64 + 64;

// ZeroMQ LINGER (ms, as `set_linger` takes it): how long a closed socket
// keeps trying to deliver what it still queues. The router's own sockets
// keep theirs in `zmq_io`.

/// eMQP `Client` and `Publisher`: a REQUEST or PUBLISH sent just before the
/// client is dropped still gets half a second to leave (a send only
/// succeeds once connected), yet a vanished broker cannot hang the exit.
pub const CLIENT_LINGER_MS: i32 = 500;
/// Admin sockets (`AdminClient`, the scheduler's admin ROUTER): queries and
/// their answers are worthless once either side has closed.
pub const ADMIN_LINGER_MS: i32 = 0;
/// A worker's or scheduler's DEALER while it runs: on reconnect it is
/// replaced, and what it still queues belongs to the old identity (the new
/// one registers afresh). Raised to a close linger for the final KBYE.
pub const RECONNECT_LINGER_MS: i32 = 0;
/// The worker library's DEALER at close: its last replies and KBYE get this
/// long to reach the router.
pub const WORKER_CLOSE_LINGER_MS: i32 = 2_000;
/// The scheduler's DEALER at close: its KBYE and last REQUESTs get this long.
pub const SCHEDULER_CLOSE_LINGER_MS: i32 = 1_000;
/// In-process wakeup sockets: a wakeup nobody will read is worthless.
pub const WAKEUP_LINGER_MS: i32 = 0;
/// The pub/sub device: at shutdown, messages still queued are dropped, as a
/// PUB socket drops them for slow subscribers anyway (EventMQ does the same).
pub const PUBSUB_LINGER_MS: i32 = 0;
/// Benchmark load generators and baselines: closing after a run must not
/// wait for load that nobody will read.
pub const BENCH_LINGER_MS: i32 = 0;
