//! Every default and limit in one place, typed, each with its reason
//! (the habit of NATS `server/const.go`). Durations are [`Duration`]; raw
//! numbers carry their unit in their name.

use std::time::Duration;

/// eMQP frontend (clients, schedulers): EventMQ's `FRONTEND_ADDR` (docs/emqp.md "Sockets").
pub const FRONTEND_ADDR: &str = "tcp://127.0.0.1:47291";
/// eMQP backend (workers): EventMQ's `BACKEND_ADDR` (docs/emqp.md "Sockets").
pub const BACKEND_ADDR: &str = "tcp://127.0.0.1:47290";
/// Admin socket (emq-cli): EventMQ's `ADMINISTRATIVE_ADDR` (docs/emqp.md "Sockets").
pub const ADMIN_ADDR: &str = "tcp://127.0.0.1:47293";
/// Text protocol listener (docs/text-protocol.md).
pub const TEXT_ADDR: &str = "127.0.0.1:47294";
/// HTTP listener of the Prometheus metrics and the status page (README
/// "Metrics and the status page"); `metrics = ""` turns it off.
pub const METRICS_ADDR: &str = "127.0.0.1:47296";
/// Most queues labelled in `/metrics` and listed on the status page: the
/// rest are summed under `queue="_other"` (and counted in
/// `emq_metrics_queues_folded`), so a scrape stays bounded however many
/// queues there are.
pub const METRICS_MAX_QUEUES: usize = 1_000;
/// Most HTTP connections the metrics server holds at once (README "Limits",
/// `metrics_max_connections`). A connection past it is not refused: it
/// takes the slot of an open one, which is closed (counted in
/// `http_connections_evicted`), so slow or idle clients holding every slot
/// cannot keep a scraper out. The server is for one Prometheus scraper and
/// a few browsers; 64 leaves room for those and keeps its descriptors and
/// memory (each connection at most [`HTTP_MAX_HEAD_BYTES`] of request plus
/// one answer) small beside the text front end's `text_reserved_fds`.
pub const METRICS_MAX_CONNECTIONS: usize = 64;
/// A metrics HTTP connection's request head must be complete this long
/// after the accept, else it is answered `408` and closed
/// (`metrics_head_timeout`; counted in `http_timed_out`). A scraper or a
/// browser sends its head at once (a few hundred bytes); 5 s leaves room
/// for a slow network while a slowloris holds a slot at most that long.
pub const METRICS_HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A metrics HTTP connection is closed this long after it was accepted,
/// whether its request head has not arrived (slowloris; answered `408` when
/// nothing was sent yet) or its answer has not been read
/// (`metrics_request_timeout`; counted in `http_timed_out`). A scrape on
/// loopback takes milliseconds; Prometheus' own scrape timeout is 10 s.
pub const METRICS_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest HTTP request head (request line and headers, with their line
/// ends) the metrics server reads, in bytes; a longer one is answered
/// `431` and the connection closed. 8 KiB is what Apache (8,190 bytes)
/// and nginx (8 KiB) allow one request line or header by default; a
/// scrape's whole head is under 300 bytes.
pub const HTTP_MAX_HEAD_BYTES: usize = 8 * 1024;
/// After answering, the metrics server half-closes the connection and
/// reads and discards what the client still sends (a body it refused, say)
/// for at most this long and [`HTTP_LINGER_BYTES`], so the kernel does not
/// reset the connection before the client read the answer (nginx's
/// "lingering close"). Discarded bytes are never kept.
pub const HTTP_LINGER: Duration = Duration::from_secs(2);
/// Most bytes discarded while lingering (see [`HTTP_LINGER`]).
pub const HTTP_LINGER_BYTES: usize = 1024 * 1024;
/// Bytes read from an HTTP connection per `read` call (a stack buffer).
pub const HTTP_READ_CHUNK_BYTES: usize = 4 * 1024;
/// Most lines in `metrics_basic_auth_file` (comments and blank lines
/// too); a longer file is refused (at start: the router does not start;
/// on a reload: the users already loaded stay). A few scrapers and
/// operators need a handful.
pub const HTTP_AUTH_FILE_MAX_LINES: usize = 1_000;
/// Most bytes read of `metrics_basic_auth_file`; a larger file is refused
/// as one with too many lines is. 1,000 lines of a 60-byte bcrypt hash
/// and a user name fit.
pub const HTTP_AUTH_FILE_MAX_BYTES: u64 = 128 * 1024;
/// Highest bcrypt cost accepted in `metrics_basic_auth_file`; a hash of a
/// higher cost is a bad line. Each check of a password not yet cached
/// runs bcrypt on the HTTP server's one thread: cost 10 (what the
/// Prometheus exporter-toolkit documents, `htpasswd -nBC 10`) takes about
/// 70 ms, each step up doubles it, so 12 (about 0.3 s) is the most a
/// scrape should wait for.
pub const HTTP_AUTH_MAX_BCRYPT_COST: u32 = 12;
/// Successful password checks remembered, as `(user, SHA-256 of the
/// password)`, for the auth file's current version; when full it is
/// emptied and refilled. A scraper and a few browsers need a handful.
pub const HTTP_AUTH_CACHE_ENTRIES: usize = 64;
/// Time the HTTP thread may spend per second running bcrypt for checks
/// that fail (wrong password or unknown user); past it, a request whose
/// credentials are not cached is answered `429 Too Many Requests` without
/// a check until the second is over (`http_auth_throttled`). So a
/// password-guessing client costs the server at most a quarter of its one
/// thread and about 4 guesses a second at cost 10, while a scraper whose
/// password is cached is served throughout.
pub const HTTP_AUTH_FAILURE_BUDGET: Duration = Duration::from_millis(250);
/// `metrics_basic_auth_file`'s modification time is looked at at most this
/// often (on a request), and the file read again when it changed.
pub const HTTP_AUTH_RELOAD_CHECK: Duration = Duration::from_secs(1);
/// The status page reloads itself this often.
pub const STATUS_PAGE_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);
/// Most queues drawn in the status page's latency plot (the busiest).
pub const STATUS_PAGE_MAX_SERIES: usize = 12;
/// Most workers listed on the status page (the rest are counted).
pub const STATUS_PAGE_MAX_ROWS: usize = 200;
/// Prometheus histogram bucket bounds of the latency figures, in seconds
/// (1 ms to 5 min; `+Inf` is added).
pub const METRICS_LATENCY_BUCKETS_SECS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Pub/sub device, incoming ROUTER: EventMQ's `PUBLISHER_INCOMING_ADDR`.
pub const PUBSUB_IN_ADDR: &str = "tcp://127.0.0.1:47298";
/// Pub/sub device, outgoing PUB: EventMQ's `PUBLISHER_OUTGOING_ADDR`.
pub const PUBSUB_OUT_ADDR: &str = "tcp://127.0.0.1:47299";

/// Log filter of the long-running programs (router, scheduler, worker,
/// pub/sub device): start, stop, peers coming and going, problems; nothing
/// per job (`emq=debug` adds each job's steps).
pub const LOG: &str = "info";
/// Log filter of the one-shot tools (`emq-cli`, `emq-bench`): their output
/// is their answer, so only warnings and errors are logged.
pub const TOOL_LOG: &str = "warn";

/// Heartbeat send period to every worker and scheduler. EventMQ's
/// `HEARTBEAT_INTERVAL` (3 s); Python peers reconnect after ~15 s of silence.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// A worker or scheduler silent this long is dead. EventMQ's
/// `HEARTBEAT_TIMEOUT` (5 s); Python peers heartbeat every 3 s.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// Python EventMQ peers send a HEARTBEAT this often (docs/emqp.md "HEARTBEAT"), whatever
/// the router's settings: a shorter `heartbeat_timeout` expires them.
pub const PYTHON_PEER_HEARTBEAT: Duration = Duration::from_secs(3);
/// How late a Python peer's heartbeat may arrive (its loop and the network):
/// `heartbeat_timeout` should be at least [`PYTHON_PEER_HEARTBEAT`] plus this.
pub const PYTHON_PEER_HEARTBEAT_SLACK: Duration = Duration::from_millis(500);
/// Python EventMQ peers reconnect after this much router silence (docs/emqp.md "Liveness"),
/// so the router must heartbeat them at least three times as often.
pub const PYTHON_PEER_SILENCE: Duration = Duration::from_secs(15);
/// How long a worker that said KBYE keeps its in-flight jobs before they
/// are requeued: EventMQ's jobmanager finishes running jobs for up to
/// `KILL_GRACE_PERIOD` (300 s) after its KBYE, without heartbeating.
pub const KBYE_GRACE: Duration = Duration::from_secs(300);
/// Default time limit of a job on an eMQP worker (`job_timeout`), from
/// dispatch to its REPLY, when its headers carry no `timeout:N`. Long, like
/// Faktory's 30-minute reservation: it is for workers that hang, not a
/// budget for slow jobs.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(1800);
/// Added to every job's time limit before the router takes the job back, so
/// that a worker enforcing the same limit itself (`emq-worker` kills the
/// command at `timeout:N` and reports the job failed) is heard first.
pub const JOB_DEADLINE_GRACE: Duration = Duration::from_secs(5);
/// Largest `timeout:N` the router honours, in seconds (a week); a larger N
/// counts as this.
pub const JOB_TIMEOUT_MAX_SECS: u64 = 7 * 24 * 3600;
/// Most queues with their own time limit (`job_timeouts`).
pub const MAX_QUEUE_JOB_TIMEOUTS: usize = 1000;
/// Most queues with settings of their own (`queues`).
pub const MAX_QUEUE_POLICIES: usize = 1000;
/// Jobs taken back by their deadline that one worker may owe an answer for;
/// past it the worker is removed (it is not answering at all), which also
/// forgets what it owed.
pub const MAX_UNANSWERED_DEADLINES: usize = 1024;
/// Default `max_retries`: setbacks a job may have (a failed result, its
/// deadline, its worker or text consumer gone) and still be tried again;
/// one more and it goes to the dead set. A job that kills every worker that
/// takes it must not cycle through the pool forever. Sidekiq and Faktory
/// default to 25 over days; emq's back-off is for transient faults.
pub const MAX_RETRIES: u32 = 5;

/// Most retries a `retry:N` header (or `max_retries`) may ask for; a
/// larger N counts as this. A job counts at most 63 setbacks
/// (`crate::job::MAX_REDELIVERIES_COUNTED`, checked at compile time in
/// `crate::broker::retry`).
pub const MAX_RETRIES_HEADER: u32 = 50;
/// Default `retry_backoff`: the wait before the first retry of a failed job.
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// Default `retry_backoff_max`: the longest wait between two tries.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(600);
/// Default `dead_max_jobs` (Faktory keeps 10,000 dead jobs).
pub const DEAD_MAX_JOBS: usize = 10_000;
/// Default `dead_max_bytes`: 64 MiB of dead jobs' frames.
pub const DEAD_MAX_BYTES: usize = 64 << 20;
/// Most dead jobs one `DEAD_LIST` answer lists (`emq-cli dead list`); the
/// answer says how many there are in all.
pub const DEAD_LIST_MAX: usize = 1000;
/// Most dead jobs a shard retries or deletes in one step of `DEAD_RETRY *`
/// or `DEAD_DELETE *` (`emq-cli dead retry|delete --all`); the rest waits
/// behind what arrived meanwhile ([`crate::broker::admin::DeadStep`]), so a
/// large dead set does not stop the shard's other traffic. 10,000
/// deletions took 8 to 14 ms in all with `durability = "sync"` (a log
/// record each) on the 2-core development machine, so a step is well under
/// a millisecond.
pub const ADMIN_STEP_JOBS: usize = 256;
/// The queue a REQUEST for an unknown queue falls back to, and the queue of
/// an empty INFORM: EventMQ's `DEFAULT_QUEUE_NAME`.
pub const DEFAULT_QUEUE: &str = "default";
/// Weight of the default queue for an INFORM with an empty queue list:
/// EventMQ's `QUEUES = [(10, "default")]`.
pub const DEFAULT_QUEUE_WEIGHT: i64 = 10;
/// Most frames in one eMQP message (identity included): a REQUEST has 8
/// and may carry a few extra; a message with more is read, dropped and
/// counted as malformed, and answered about its msgid when a client or
/// worker waits for an answer (docs/emqp.md "ERROR").
pub const MAX_FRAMES: usize = 64;
/// Longest msgid (REQUEST frame 3) the broker accepts, in bytes: Python peers
/// send 36-byte uuids; the job record keeps the length in one byte.
pub const MAX_MSGID_BYTES: usize = 255;
/// Longest queue name in bytes, for both protocols (the text protocol's
/// rule; an eMQP REQUEST naming a longer queue gets `ERROR BAD_REQUEST`).
pub const MAX_QUEUE_NAME_BYTES: usize = 255;
/// Longest REQUEST headers frame (frame 5) in bytes: headers are a short CSV.
pub const MAX_HEADERS_BYTES: usize = 65_535;
/// How long the router remembers a REQUEST's duplicate key, (client
/// routing identity, msgid), after accepting it (docs/failover.md
/// "Duplicates"): a REQUEST with the same key within this time gets the
/// first job's acceptance again and makes no job (counted `dedup_hits`).
/// Ten minutes covers a client re-sending across a router move (the emq
/// client re-sends within seconds, [`CLIENT_RESEND_INTERVAL`]) with a wide
/// margin; a client reusing a msgid on purpose after it gets a new job.
/// Measured on the wall clock from the acceptance, also across a restart
/// (the key's time is in its log record).
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Most duplicate keys one shard remembers (the window of
/// [`DEDUP_WINDOW`] is also bounded by count): past it the oldest key is
/// forgotten first, early, and counted (`dedup_evicted`). A key holds an
/// identity (at most 255 bytes, ZeroMQ's bound on routing ids) and a msgid
/// (at most [`MAX_MSGID_BYTES`]); with 36-byte uuid text for both a key
/// costs about 200 bytes in the shard's tables, so a full window about
/// 200 MB per shard. At 1,000,000 keys the 10-minute window holds at
/// 1,666 new REQUESTs a second per shard; above that rate keys leave
/// before their ten minutes (and `dedup_evicted` counts them).
pub const DEDUP_MAX_KEYS: usize = 1_000_000;
/// Most `[weight, name]` pairs one INFORM may list: a worker serving more
/// queues than this is almost surely misconfigured, and each pair costs a
/// candidate entry on its queue's shard.
pub const MAX_INFORM_QUEUES: usize = 1024;
/// Highest queue weight an INFORM may give (weights start at 1). Weights are
/// priority tiers compared with each other; a million tiers is more than
/// any deployment uses, and the bound keeps every weight a small integer in
/// every peer's language.
pub const MAX_QUEUE_WEIGHT: i64 = 1_000_000;
/// Most schedulers registered at once. Schedulers are a handful per
/// deployment; each SCHEDULE costs one hash per live scheduler (rendezvous
/// routing), and the table is keyed by peer identities from the network.
pub const MAX_SCHEDULERS: usize = 256;
/// Most SCHEDULE/UNSCHEDULE messages the router remembers at once while
/// their scheduler's answer is due (to send it back to the client that sent
/// them); past it a SCHEDULE gets `ERROR BUSY`. Each entry is two identities
/// and a msgid (~150 bytes): 10,000 is 1.5 MB, and more than 300
/// SCHEDULEs a second for [`SCHEDULE_ANSWER_TIMEOUT`].
pub const MAX_PENDING_SCHEDULE_ANSWERS: usize = 10_000;
/// How long the router waits for a scheduler's answer to a SCHEDULE or
/// UNSCHEDULE before it forgets who sent it. An EventMQ scheduler never
/// answers; emq-scheduler answers at once, or after a store timeout.
pub const SCHEDULE_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Most schedule keys whose owner the router remembers (to route every
/// SCHEDULE of a schedule to the scheduler holding it). An entry is ~150
/// bytes: 100,000 keys are 15 MB, more schedules than any deployment the
/// scheduler's single timer heap is built for. Past it the key routed
/// least recently is forgotten.
pub const MAX_ROUTED_SCHEDULE_KEYS: usize = 100_000;
/// Most UNSCHEDULE (and moved-schedule) tombstones the router keeps for
/// schedulers that were not connected (`src/broker/shard/tombstones.rs`,
/// docs/emqp.md "Schedulers"); past it the oldest is forgotten and counted
/// (`schedule_tombstones_evicted`). A registering emq-scheduler gets at
/// most this many messages.
pub const MAX_SCHEDULE_TOMBSTONES: usize = 10_000;
/// Most bytes of frames the tombstones hold (their messages as received);
/// past it the oldest is forgotten, as for [`MAX_SCHEDULE_TOMBSTONES`].
pub const MAX_SCHEDULE_TOMBSTONE_BYTES: usize = 16 * 1024 * 1024;
/// Longest scheduler name (INFORM frame 6, emq extension) the router accepts.
pub const MAX_SCHEDULER_NAME_BYTES: usize = 128;
/// Waiting jobs per queue before REQUEST/SCHED is rejected. EventMQ uses
/// 10,000 (`HWM`) and a RAM-sized limit for `default`; we use one
/// explicit bound large enough for bursts (100,000-line pipelines).
pub const MAX_QUEUE_LEN: usize = 1_000_000;
/// Most queues the broker holds at once (every shard together). A new name
/// past it is refused with `QUEUE_LIMIT` (text SCHED/ASK, eMQP INFORM). An
/// empty queue with no worker takes ~300 bytes and goes after
/// [`QUEUE_IDLE_GRACE`], so 100,000 names cost ~30 MB at most.
pub const MAX_QUEUES: usize = 100_000;
/// A queue with no waiting job, no worker declaring it and no text offer is
/// forgotten after this long idle (with everything keyed by its name). Until
/// then it counts as known, so a restarting worker's jobs wait for it.
pub const QUEUE_IDLE_GRACE: Duration = Duration::from_secs(300);
/// For this long after a router starts serving (a start, a restart, a
/// take-over), a REQUEST for a queue no worker has declared yet keeps its
/// queue instead of going to `default`: the workers declare their queues
/// again within a heartbeat or two (Python jobmanagers within ~15 s) and
/// find the jobs there (issue 30: a take-over moved hundreds of jobs into
/// `default`, where workers of their queue never looked).
pub const QUEUE_LEARN_GRACE: Duration = Duration::from_secs(30);
/// Most queues one worker may declare in its INFORM: a READY walks the
/// worker's queues, so this bounds its cost (~20 ns per queue).
pub const MAX_QUEUES_PER_WORKER: usize = 1_000;
/// Most registered workers (every shard together); an INFORM past it gets
/// `ERROR BAD_INFORM`.
pub const MAX_WORKERS: usize = 100_000;
/// Largest eMQP message the broker takes, all frames together, in bytes:
/// past it `ERROR TOO_BIG`. ZeroMQ itself drops the connection of a peer
/// whose message passes [`zmq_max_msg_size`] of it (about twice this), so
/// that such a message is never buffered whole.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// What emq's libzmq counts for each frame of a multipart message that has
/// another after it, on top of the frames' bytes, against `ZMQ_MAXMSGSIZE`
/// (`sizeof (zmq_msg_t)`, what its pipe holds per frame: empty frames
/// count too; vendor/zeromq-src/EMQ-PATCH.md).
pub const ZMQ_FRAME_OVERHEAD: usize = 64;
/// `ZMQ_MAXMSGSIZE` of a socket bound for peers whose messages are bounded
/// by `max_message_bytes`: twice it, plus the overhead of [`MAX_FRAMES`]
/// frames (4 KiB). ZeroMQ drops the connection of a peer whose message
/// counts more, before buffering it, and counts every frame's bytes plus
/// [`ZMQ_FRAME_OVERHEAD`] for every frame but the last: so a message of at
/// most [`MAX_FRAMES`] frames and at most twice `max_message_bytes` bytes
/// always reaches the socket (a job result's result frame may exceed
/// `max_message_bytes`: `zmq_io::io_thread`), and a peer streaming endless
/// empty frames is cut off after about `2 × max_message_bytes / 64` of them
/// instead of growing the pipe without bound.
pub fn zmq_max_msg_size(max_message_bytes: usize) -> i64 {
    let bytes = max_message_bytes.saturating_mul(2).saturating_add(ZMQ_FRAME_OVERHEAD * MAX_FRAMES);
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
/// Most bytes of waiting jobs per queue (job buffers as held: frames plus a
/// 12-byte header); past it `QUEUE_FULL`.
pub const MAX_QUEUE_BYTES: usize = 1 << 30;
/// Messages the I/O thread and the text front end may have handed to one
/// shard that it has not taken yet (text commands count one each). Past it
/// the eMQP I/O thread stops reading its sockets until the shard catches
/// up, so ZeroMQ's HWM pushes back on senders instead of the broker's
/// memory growing. The text front end needs no pause of its own: each
/// connection has at most [`TEXT_MAX_PENDING_COMMANDS`] commands
/// unanswered, then TCP pushes back.
pub const SHARD_INBOX_MESSAGES: usize = 65_536;
/// Once sweeps have forgotten this many queues and asked names (in one
/// sweep or several; also at the first quiet sweep after a burst) the
/// freed heap goes back to the operating system (`malloc_trim`), so that
/// RSS falls again after a burst of one-off queue names.
pub const QUEUE_SWEEP_TRIM_MIN: usize = 1_000;
/// While a shard is behind (see [`SHARD_INBOX_MESSAGES`]) the I/O thread
/// looks at it again this often; it reads no socket meanwhile.
pub const BACKPRESSURE_POLL: Duration = Duration::from_millis(1);
/// Peers whose undelivered answers the I/O thread counts separately (a
/// larger set starts afresh).
pub const UNDELIVERED_PEERS: usize = 10_000;
/// Undelivered answers to one peer are logged at most this often.
pub const UNDELIVERED_LOG_EVERY: Duration = Duration::from_secs(60);
/// Most queues a shard keeps latency histograms for between two reporter
/// takes (each queue's three histograms take ~75 KiB, so at most ~10 MiB
/// per shard); jobs of further queues are recorded under the queue name `*`.
pub const LATENCY_MAX_QUEUES_PER_SHARD: usize = 128;
/// Most histograms (queue × figure) the reporter keeps cumulative, and the
/// `LATENCY` answer lists (the busiest, by jobs recorded): ~26 KiB each,
/// so at most ~20 MiB for the cumulative and the interval sets together.
pub const LATENCY_MAX_QUEUES: usize = 384;
/// How long shutdown waits for queued and in-flight jobs to finish before it
/// logs what remains and exits.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// ZeroMQ high-water mark (messages per peer pipe) on the router's sockets.
/// libzmq's default of 1,000 drops or blocks bursts; workers and clients
/// that pipeline need more.
pub const ZMQ_HWM: i32 = 100_000;
/// emq-pubsub's send high-water mark, messages per subscriber: libzmq's
/// own default, so a subscriber that stops reading costs at most this
/// many messages of memory, not [`ZMQ_HWM`] (10 KB messages: 10 MB).
pub const PUBSUB_HWM: usize = 1_000;
/// How often emq-pubsub gives freed heap pages back to the OS
/// ([`crate::heap::release_free_memory`]): subscriber churn otherwise
/// raises its RSS for good. One wake-up a minute when idle.
pub const HEAP_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// Most messages ZeroMQ reads ahead from one peer before the I/O thread
/// takes them (the router sockets' `ZMQ_RCVHWM`, when `zmq_hwm` is
/// higher). Past it libzmq stops reading that connection and TCP pushes
/// back on the sender; nothing is dropped. It bounds what a producer
/// pushing large jobs can park in the router beyond the memory limit: with
/// 100,000 (the send side's HWM) a burst of 64 KiB jobs took peak RSS to
/// 1.7 × the admitted bytes, with 1,000 to 1.4 × (loadtest/memory_bounds.py).
pub const ZMQ_RCVHWM: i32 = 1_000;
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
/// (docs/text-protocol.md: 1 MiB).
pub const TEXT_MAX_LINE_BYTES: usize = 1 << 20;
/// An offer not answered within this time goes back to the front of its
/// queue (docs/text-protocol.md: 300 s).
pub const TEXT_OFFER_TIMEOUT: Duration = Duration::from_secs(300);
/// A line must be complete this long after its first byte arrived, else the
/// connection is closed (docs/text-protocol.md "Limits on connections": slow
/// senders must not pin memory). 60 s lets a 1 MiB line arrive at 17 KB/s.
pub const TEXT_LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// A TLS handshake on the `text_tls` listener must finish this long after
/// the accept, else the connection is closed and counted
/// (`text_tls_handshake_failures`): a peer that opens connections and sends
/// nothing must not hold TLS state.
pub const TEXT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS connections of the text protocol: plaintext decrypted ahead of the
/// line decoder, at most this many bytes (one TLS read of 4 KiB may add a
/// record of up to 16 KiB); like a socket read, it counts in the input
/// budget (`text_max_buffered_bytes`).
pub const TEXT_TLS_PLAIN_BYTES: usize = 16 * 1024;
/// TLS reads (of at most 4 KiB each) one serving of a TLS text connection
/// makes before it lets the others go on.
pub const TEXT_TLS_READS_PER_TURN: usize = 16;
/// Replies handed to rustls at once: it encrypts them into records, and is
/// given more only once those are written, so what it holds stays this
/// small (the rest waits in the connection's own buffer, counted against
/// `text_max_unsent_bytes`).
pub const TEXT_TLS_WRITE_CHUNK_BYTES: usize = 64 * 1024;
/// Most open text connections; past it `ERR BUSY` (docs/text-protocol.md: 10,000).
pub const TEXT_MAX_CONNECTIONS: usize = 10_000;
/// Descriptors kept free for everything but text connections: while fewer
/// than this many remain below `RLIMIT_NOFILE`, a new text connection gets
/// `ERR BUSY`, so eMQP peers and the admin socket (one descriptor per ZeroMQ
/// connection) always find one. 256 covers the router's own ~30 and a burst
/// of eMQP connections.
pub const TEXT_RESERVED_FDS: usize = 256;
/// A connection holding more unsent reply bytes than this (it does not read
/// its replies) is closed and its offer goes back to the front
/// (text-protocol.md "Limits on connections"). At least one full `WANT?`
/// line ([`TEXT_MAX_LINE_BYTES`] + 7) must fit.
pub const TEXT_MAX_UNSENT_BYTES: usize = 4 << 20;
/// Most bytes of input the text front end holds for all its connections
/// together that are not commands yet: partial lines and bytes read but not
/// decoded (text-protocol.md "Limits"). One longest line of it is kept for
/// the oldest waiting line to finish; past the rest a connection is read
/// only up to the end of its next line (which then holds nothing), or,
/// one at a time, through its whole line, or not at all until the total
/// falls: TCP makes its client wait, nothing is lost. 64 MiB is 63 lines of
/// the longest kind in progress at once; without it 10,000 connections each
/// 1 byte short of a full line held ~10 GiB.
pub const TEXT_MAX_BUFFERED_BYTES: usize = 64 << 20;
/// While the input budget ([`TEXT_MAX_BUFFERED_BYTES`]) is spent, the I/O
/// thread peeks this much of a connection's socket for the end of its next
/// line before it peeks a whole read ([`TEXT_READ_BUF_BYTES`]): a short
/// command costs a copy of at most this, a longer one at most 16 times its
/// length.
pub const TEXT_PEEK_BYTES: usize = 4 * 1024;
/// Longest wait a long-poll `ASK <queue> <ms>` may ask for; a longer one
/// is `ERR BAD_FORMAT`. Equal to the offer timeout: both bound how long
/// the broker keeps something for one connection.
pub const TEXT_MAX_ASK_WAIT: Duration = Duration::from_secs(300);
/// An ASK keeps its queue known (an eMQP REQUEST for it waits there instead
/// of falling back to `default`) this long after the last ASK for it: long
/// enough for a consumer that polls with back-off, short enough that a name
/// asked once does not stay known for ever.
pub const TEXT_ASK_GRACE: Duration = Duration::from_secs(60);
/// Most queue names the shards keep as known only because a text client
/// ASKed for them within [`TEXT_ASK_GRACE`] (split evenly over the shards).
/// An ASK naming a new queue past it gets `ERR QUEUE_LIMIT`. Each name costs
/// about 100 bytes plus its length: 100,000 names are ~10 MB at most.
pub const TEXT_MAX_ASKED_QUEUES: usize = 100_000;
/// How long the text server's shutdown waits for its I/O threads to hand
/// back held offers and for the shards' last answers.
pub const TEXT_SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// How often the router's drain looks at the shards.
pub const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Most text I/O threads: each one is a readiness loop serving thousands of
/// connections, so more than one per core only adds switching.
pub const MAX_TEXT_THREADS: usize = 256;
/// I/O threads (of `text_threads`) that also accept connections from the
/// listener and hand them round-robin to every I/O thread. One keeps up
/// with thousands of connections a second.
pub const TEXT_ACCEPTORS: usize = 1;
/// Connections one acceptor takes from the listener per loop turn before it
/// serves its connections again.
pub const TEXT_ACCEPT_BATCH: usize = 64;
/// After an `accept` failure that a spare descriptor could not get past
/// (the whole system is out of descriptors), the acceptor tries again this
/// much later instead of spinning.
pub const TEXT_ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Failed `accept` calls are logged at most this often, with the count of
/// those not logged.
pub const TEXT_ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Pending-connection queue of the text listener: absorbs connection bursts
/// (load generators open hundreds at once) while the acceptors catch up.
pub const TEXT_LISTEN_BACKLOG: i32 = 1024;
/// Bytes an I/O thread reads from one connection at a time, into a buffer
/// it shares between its connections: one read takes a pipelined burst of
/// about 800 64-byte SCHED lines.
pub const TEXT_READ_BUF_BYTES: usize = 64 * 1024;
/// A connection with this many unsent reply bytes stops being read (and its
/// read commands wait) until the socket takes them: TCP backpressure for a
/// client that pipelines faster than it reads.
pub const TEXT_OUT_PAUSE_BYTES: usize = 64 * 1024;
/// Most commands of one connection sent to the shards and not answered yet;
/// past it the connection's next commands wait. Bounds the per-connection
/// reply bookkeeping (~32 bytes per command).
pub const TEXT_MAX_PENDING_COMMANDS: usize = 1024;
/// A connection's buffers larger than this are freed once empty, so an idle
/// connection that once sent or received a big line holds no big buffer.
pub const TEXT_KEEP_BUFFER_BYTES: usize = 4 * 1024;
/// Readiness events one text I/O thread takes from the OS per loop turn.
pub const TEXT_EVENTS_PER_POLL: usize = 1024;

/// `durability = "async"`: how often a shard syncs its log. A power cut
/// (not a crash of the process: records are written at the end of every
/// batch) loses at most this much of acknowledged work; beanstalkd's `-f`
/// default is the same 50 ms.
pub const WAL_SYNC_INTERVAL: Duration = Duration::from_millis(50);
/// A log segment is closed, and the next begun, at this size: large enough
/// that creating files is rare (one per ~400,000 small jobs), small enough
/// that a segment holding a few old jobs is cheap to copy forward.
pub const WAL_SEGMENT_BYTES: u64 = 64 << 20;
/// `durability = "replicated"` (crate::jslog): the default router name.
pub const ROUTER_NAME: &str = "emq";
/// How often a replicated router lists the other router names of its
/// stream prefix (the lease and layout buckets) for STATUS, the status
/// page and `/metrics` readers (`jslog::peers`).
pub const PEER_ROUTERS_POLL: Duration = Duration::from_secs(5);
/// Most other router names a router lists (the buckets are shared by every
/// router of a stream prefix, so anyone with cluster access can add keys);
/// the rest are counted as `not_listed`.
pub const PEER_ROUTERS_MAX: usize = 64;
/// Largest lease value read as another router's holder record; a longer
/// one is shown as unreadable.
pub const PEER_HOLDER_MAX_BYTES: usize = 4096;
/// The default prefix of the router's JetStream streams and buckets.
pub const NATS_STREAM_PREFIX: &str = "EMQ";
/// Copies JetStream keeps of each log stream by default: 3 survives the
/// loss of one server (Raft needs 2 of 3).
pub const NATS_REPLICAS: u32 = 3;
/// JetStream's duplicate window on the log streams (the default the
/// research measured retries against: shared/research/jetstream-eval.md).
pub const NATS_DEDUP_WINDOW: Duration = Duration::from_secs(120);
/// One PubAck's wait before the publish is retried: a client whose own
/// server died stalls this long (measured 2.0 s gap at 2 s).
pub const NATS_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// A batch is retried this long (back-off [`NATS_RETRY_MIN`] doubling to
/// [`NATS_RETRY_MAX`]) before its jobs are refused: several leader
/// elections (5-6 s each, measured), well inside [`NATS_DEDUP_WINDOW`].
pub const NATS_GIVE_UP: Duration = Duration::from_secs(30);
/// First wait before a failed publish is retried.
pub const NATS_RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest wait between retries of a failed publish.
pub const NATS_RETRY_MAX: Duration = Duration::from_secs(1);
/// The stall bound of a replicated log (in place of
/// [`LOG_STALL_TIMEOUT`]): acknowledgements that wait this long without
/// the durable mark moving make the shard refuse new jobs. Longer than a
/// stream leader's election (raft's election timeout is 4-9 s upstream;
/// acknowledgements resumed 4.5-9 s after a leader's `kill -9` in
/// tests/replicated_faults.rs), so that a routine failover holds new jobs
/// rather than refusing them; with two of three servers down, a producer
/// is refused after about this long.
pub const NATS_STALL_TIMEOUT: Duration = Duration::from_secs(12);
/// The router's hold on its name lasts this long past its last renewal.
pub const NATS_LEASE: Duration = Duration::from_secs(10);
/// Largest NATS secret file read (`nats_password_file`, `nats_token_file`,
/// `nats_nkey_file`): a seed is 58 bytes, a password or token a few dozen;
/// a larger file is the wrong file and is refused rather than read whole.
pub const NATS_SECRET_MAX_BYTES: u64 = 64 << 10;
/// Publishes in flight at once, all shards together (the research
/// measured 11-15k publishes/s at 256 in flight; each publish carries a
/// batch of jobs).
pub const NATS_MAX_IN_FLIGHT: usize = 1024;
/// Batches of one shard awaiting their PubAcks past which the shard's next
/// batches' records are held back and gathered into one message (up to a
/// part's size), published once one of them is confirmed: a few larger
/// publishes queue less at the servers than many small ones (each a Raft
/// round with a sync on three servers). Without it a shard published each
/// batch at once, up to [`NATS_MAX_IN_FLIGHT`] small messages queued, and
/// at 10,000 jobs/s the acceptances waited 149 ms at the median, 409 ms at
/// p99; with 8, 9.4 and 32 ms (4 and 32 did worse at saturation; one run
/// each, load average 8-10, 2-core VM).
pub const NATS_SHARD_BATCHES_IN_FLIGHT: usize = 8;
/// While records are held back, the shard looks this often whether one of
/// its batches was confirmed (PubAcks do not wake it).
pub const NATS_HELD_RECHECK: Duration = Duration::from_millis(1);
/// A shard's log stream is counted in chunks of this many bytes of
/// records: a job's `Accepted` record is found by its chunk, and the
/// stream is purged up to the oldest chunk with a live job.
pub const NATS_CHUNK_BYTES: u64 = 4 << 20;
/// Most bytes of records a shard has handed to the NATS thread and not
/// yet seen confirmed: past it new jobs are refused (`STORE_FAILED`) until
/// the store catches up.
pub const NATS_MAX_UNCONFIRMED_BYTES: u64 = 256 << 20;
/// A purge of the replicated log's stream asked for and not done after
/// this long (it failed: a leader being elected, the connection lost) is
/// asked again, and again every this long until one is done: a purge is
/// otherwise asked only when more records die, so a failed one would
/// leave the stream holding superseded records for good.
pub const NATS_PURGE_RETRY: Duration = Duration::from_secs(2);
/// A replicated log that has written nothing for this long runs a
/// compaction pass if its stream is over its bound, without waiting for
/// half a chunk of records more since the last pass: a stream at rest
/// then falls within the bound instead of keeping up to half a chunk more
/// until traffic comes back. Long enough that a steady trickle of jobs
/// keeps the usual spacing of passes.
pub const NATS_COMPACT_REST: Duration = Duration::from_secs(1);
/// Smallest segment size accepted: a segment must hold its header and a
/// few records (tests use small segments to exercise rotation).
pub const WAL_MIN_SEGMENT_BYTES: u64 = 4096;
/// Default of `disk_free_limit`: 256 MiB. RabbitMQ's 50 MB default is
/// known to be too low to stop publishers before the disk fills; 256 MiB
/// leaves room for consumers' records, compaction and a rebuild of a
/// typical log while producers are refused (docs/durability.md).
pub const DISK_FREE_LIMIT: u64 = 256 << 20;

/// How often a shard's log reads the free space of the data directory's
/// file system and checks that its directory and files are still there
/// when nothing else wakes it (under load every batch's sync checks the
/// files; free space is read at most this often).
pub const WAL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// First wait before a faulty log tries to repair itself; it doubles after
/// every failed attempt up to [`WAL_RETRY_MAX`].
pub const WAL_RETRY_MIN: Duration = Duration::from_millis(100);

/// Longest wait between a faulty log's attempts to repair itself.
pub const WAL_RETRY_MAX: Duration = Duration::from_secs(5);

/// Records a log out of space keeps buffered to write again (64 MiB);
/// past it the buffer goes and the log is rebuilt from memory once it can
/// be written.
pub const WAL_FAULT_BUFFER_BYTES: usize = 64 << 20;

/// A log whose durable point has not moved for this long while
/// acknowledgements wait for it is stalled (a hung disk or file system):
/// new jobs are refused (`STORE_FAILED`) until it moves again. A log may
/// say another bound ([`crate::joblog::Durable::stall_timeout`]; the
/// replicated one: [`NATS_STALL_TIMEOUT`]).
pub const LOG_STALL_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Log lines one call site may write per second when input can trigger it
/// (malformed frames, refusals, jobs dead-lettered); past it lines are
/// counted and reported as `suppressed = N` on the next line let through,
/// or, when none comes, by a line of their own
/// ([`crate::logging::flush_suppressed`]) about two seconds after the burst.
pub const LOG_BURST: u64 = 10;
/// How often the log flush thread reports the lines a finished burst
/// suppressed ([`crate::logging::flush_suppressed`]).
pub const LOG_FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Frames of one message shown in a log line
/// ([`ShowFrames`](crate::protocol::emqp::ShowFrames)); the rest are
/// counted (`…(+N frames)`). An eMQP command has at most 8 frames, so every
/// well-formed message shows whole; a peer sending 100,000 frames cannot
/// make one log line list them all.
pub const LOG_FRAMES_SHOWN: usize = 16;
/// Bytes of one frame shown in a log line (and of a command word or peer
/// type quoted in a decoding error); the rest are counted (`…(+N)`).
/// With [`LOG_FRAMES_SHOWN`] a line lists at most 1 KiB of a peer's bytes
/// (4 KiB escaped).
pub const LOG_FRAME_BYTES: usize = 64;
/// Bytes of a reason text shown in a log line when it may quote a peer's
/// input ([`ShowText`](crate::logging::ShowText)); the rest are counted.
pub const LOG_TEXT_BYTES: usize = 256;
/// Period of the latency reporter's log line.
pub const LATENCY_REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// The shortest period of a report (`latency_interval`, emq-worker's
/// `stats_interval`); `0s` turns one off.
pub const MIN_REPORT_PERIOD: Duration = Duration::from_secs(1);
/// Largest latency an HdrHistogram records (1 hour, in microseconds).
pub const LATENCY_MAX_US: u64 = 3_600_000_000;

/// How long a worker (`emq-worker`, `client::worker`) waits for running jobs
/// after KBYE before it closes. EventMQ waits up to 300 s
/// (`KILL_GRACE_PERIOD`); 30 s fits an orchestrator's stop grace period.
pub const WORKER_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `emq-worker`'s time limit for a job without a `timeout:N` header:
/// EventMQ's `GLOBAL_TIMEOUT`.
pub const WORKER_JOB_TIMEOUT: Duration = Duration::from_secs(300);
/// Jobs an `emq-worker` runs at once unless told: EventMQ's `CONCURRENT_JOBS`.
pub const WORKER_CONCURRENCY: usize = 4;
/// Most jobs a worker (`emq-worker -J`, `client::worker`) runs at once:
/// each is a pool thread (and, for `emq-worker`, a running command), so a
/// larger count is refused at start (`must be at most 1024`) instead of
/// running the process out of threads (`-J 100000` aborted). Run more
/// workers to go further.
pub const WORKER_MAX_CONCURRENCY: usize = 1024;
/// At `drain_timeout` with jobs still running, `emq-worker` sends their
/// commands' process groups SIGTERM, then SIGKILL after this grace.
pub const WORKER_KILL_GRACE: Duration = Duration::from_secs(2);
/// After asking running jobs to stop at `drain_timeout` (`emq-worker`:
/// [`WORKER_KILL_GRACE`] then SIGKILL), the worker waits this long for them
/// to end and sends their failed REPLYs; a job still running then is
/// reported failed anyway, and the worker closes.
pub const WORKER_ABANDON_WAIT: Duration = Duration::from_secs(3);
/// `emq-worker` reconnects under a new identity after this much router
/// silence: EventMQ's jobmanager allows 3 × `HEARTBEAT_TIMEOUT`.
pub const WORKER_SILENCE_TIMEOUT: Duration = Duration::from_secs(15);
/// Period of `emq-worker`'s `jobs ok=… failed=…` log line.
pub const WORKER_STATS_INTERVAL: Duration = Duration::from_secs(60);
/// Most bytes of a command's stdout `emq-worker` takes as the job result:
/// past it the command's process group is killed and the job fails
/// (`output over 15728640 bytes: job killed`). Below
/// [`WORKER_MAX_REPLY_BYTES`], so that plain text output up to it fits in
/// the REPLY.
pub const WORKER_MAX_OUTPUT_BYTES: usize = 15 << 20;
/// Default largest job-result REPLY a worker sends, all frames together,
/// in bytes (`emq-worker --max-reply-bytes`, `WorkerConfig::max_reply_bytes`):
/// the router's default `max_message_bytes` ([`MAX_MESSAGE_BYTES`]) less
/// 64 KiB. A result that would be larger once JSON-encoded (a control byte
/// becomes `\u0001`, 6 bytes) is not sent: the worker sends a failed REPLY
/// with a short error text instead, so a router on its default limits
/// always gets the answer.
///
/// What a router really refuses: it takes a job result over its
/// `max_message_bytes` (only the REPLY's other frames must fit it), but
/// ZeroMQ (`ZMQ_MAXMSGSIZE`, [`zmq_max_msg_size`]: twice
/// `max_message_bytes` and 4 KiB on the router's sockets) drops a larger
/// message with the connection, and the job is then
/// taken back only at its deadline. A worker of a router run with a lower
/// `max_message_bytes` is matched to it with `max_reply_bytes` (that limit
/// less 64 KiB keeps the same margin).
pub const WORKER_MAX_REPLY_BYTES: usize = MAX_MESSAGE_BYTES - (64 << 10);
/// Smallest `max_reply_bytes` a worker takes: room for the failed REPLY
/// (about 150 bytes and the msgid) that replaces a larger result.
pub const WORKER_MIN_REPLY_BYTES: usize = 1024;
// Plain output up to the cap, with the REPLY's other frames, fits the limit.
const _: () = assert!(WORKER_MAX_OUTPUT_BYTES + 1024 < WORKER_MAX_REPLY_BYTES);
/// emq-scheduler's own admin socket (`SCHEDULES` query). The next free port
/// after the router's ports (47290-47294); EventMQ's scheduler had none.
pub const SCHEDULER_ADMIN_ADDR: &str = "tcp://127.0.0.1:47295";
/// Largest request emq-scheduler's admin socket takes (`ZMQ_MAXMSGSIZE`
/// there is [`zmq_max_msg_size`] of it): its requests are four short
/// frames; a peer sending more is dropped by ZeroMQ with its connection.
pub const SCHEDULER_ADMIN_MAX_MESSAGE_BYTES: usize = 64 << 10;
/// The time zone cron expressions are evaluated in unless configured: a
/// fixed zone, so that schedules do not move with a host's local zone or
/// its daylight saving time.
pub const SCHEDULER_TIMEZONE: &str = "UTC";
/// Longest accepted schedule interval: 10 years. Bounds the time arithmetic;
/// longer periods are better written as cron expressions.
pub const SCHEDULER_MAX_INTERVAL_SECS: u64 = 10 * 366 * 24 * 3600;
/// The scheduler re-registers under a new identity after this much router
/// silence: EventMQ's peers use 3 × `HEARTBEAT_TIMEOUT` (~15 s, docs/emqp.md "Liveness").
pub const SCHEDULER_ROUTER_TIMEOUT: Duration = Duration::from_secs(15);
/// While waiting for the ACK of its INFORM, the scheduler re-sends INFORM
/// this often (EventMQ never re-sent it and hung).
pub const SCHEDULER_INFORM_RETRY: Duration = Duration::from_secs(5);
/// Attempts to take the scheduler data directory's lock before giving up: a
/// copy of a just-closed lock descriptor can live on in a child between its
/// fork and exec, and a restarted scheduler's predecessor may still be
/// exiting. With [`SCHEDULER_LOCK_RETRY`], about one second in all.
pub const SCHEDULER_LOCK_TRIES: u32 = 20;
/// Pause between two attempts to take the data directory's lock.
pub const SCHEDULER_LOCK_RETRY: Duration = Duration::from_millis(50);
/// Most schedules one emq-scheduler holds; past it a SCHEDULE for a new
/// key gets `ERROR BUSY`. The same bound as the router's table of schedule
/// owners ([`MAX_ROUTED_SCHEDULE_KEYS`]); one timer heap serves them all.
pub const SCHEDULER_MAX_SCHEDULES: usize = 100_000;
/// Stale timer-heap entries the scheduler tolerates beyond 2 × live jobs
/// before it rebuilds the heap: small heaps are never rebuilt.
pub const SCHEDULER_STALE_HEAP_ENTRIES: usize = 1024;
/// The wall clock may move against the monotonic clock by this much (a
/// step, or slow drift adding up) before the scheduler re-plans its cron
/// jobs: under it, NTP's slewing; over it, a step.
pub const SCHEDULER_CLOCK_STEP: Duration = Duration::from_secs(1);
/// How long the scheduler waits for a Redis connection (EventMQ's store).
/// The scheduler's loop waits meanwhile, so it is short; a refused
/// connection fails at once anyway.
pub const SCHEDULER_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one Redis command may take to be written or answered. Redis
/// answers in well under a millisecond; a paused or overloaded one must not
/// hold the scheduler's loop (EventMQ's had no timeout, S14).
pub const SCHEDULER_REDIS_IO_TIMEOUT: Duration = Duration::from_millis(500);
/// An emq-scheduler's lease on a shared Redis store: its schedules are
/// taken over by another scheduler this long after it stops renewing it
/// (every [`SCHEDULER_STORE_RETRY`]).
pub const SCHEDULER_REDIS_LEASE: Duration = Duration::from_secs(15);
/// The JetStream key-value bucket of emq-scheduler's NATS store
/// (`nats_bucket`); its lease bucket is `<bucket>_leases`.
pub const SCHEDULER_NATS_BUCKET: &str = "emq_schedules";
/// An emq-scheduler's lease on its name in the NATS store (`nats_lease`):
/// renewed every third of it; a standby takes over at most this long (plus
/// [`SCHEDULER_NATS_LEASE_POLL`]) after the active scheduler's last renewal.
pub const SCHEDULER_NATS_LEASE: Duration = Duration::from_secs(10);
/// The shortest `nats_lease` emq-scheduler takes: a third of it must leave
/// room for a renewal's round trip to the cluster.
pub const SCHEDULER_NATS_MIN_LEASE: Duration = Duration::from_secs(1);
/// How long one request to the NATS store may take (`nats_timeout`): the
/// scheduler's loop waits meanwhile.
pub const SCHEDULER_NATS_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a standby scheduler tries to take the lease.
pub const SCHEDULER_NATS_LEASE_POLL: Duration = Duration::from_millis(250);
/// The part of the lease an active scheduler keeps as a margin: it stops
/// firing once (lease − lease / this) has passed since it sent its last
/// renewal that was confirmed, so before its key can expire.
pub const SCHEDULER_NATS_LEASE_MARGIN_DIV: u32 = 10;
/// Largest stored value of one schedule in the NATS store (its five frames
/// and state as JSON): under NATS's default 1 MiB `max_payload`. A
/// SCHEDULE whose record is larger is refused (`TOO_BIG`).
pub const SCHEDULER_NATS_MAX_VALUE_BYTES: usize = 1_000_000;
/// How often the scheduler retries a store it cannot reach (it schedules
/// from memory meanwhile), and runs the upkeep of a shared store.
pub const SCHEDULER_STORE_RETRY: Duration = Duration::from_secs(5);
/// Most one store-failure log line per this long: a store down for an hour
/// must not flood the log.
pub const SCHEDULER_STORE_LOG_EVERY: Duration = Duration::from_secs(60);
/// Deepest JSON nesting the scheduler's Python-compatible JSON parser
/// accepts: bounds its recursion (CPython's own limit is about 1,000).
pub const PYJSON_MAX_DEPTH: usize = 256;
/// Most unreadable lines of a damaged schedule log named in the log line
/// that reports it (all are counted; the damaged file is kept).
pub const SCHEDULER_DAMAGED_LINES_LOGGED: usize = 20;
/// The scheduler's log store is compacted once it holds more than
/// max(this, 2 × live schedules) lines: small logs are never rewritten.
pub const SCHEDULER_COMPACT_MIN_LINES: usize = 1_000;

/// How long a client call (`client::emqp`, `client::admin`, `emq-cli`)
/// waits for a connection and an answer unless told otherwise: long enough
/// for a loaded broker nearby, short enough for an interactive command.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long `emq-cli request` and `sched` wait for the STATUS that tells
/// them whether the job's queue is served (their note about a misspelled
/// queue): short, so an admin socket out of reach delays nothing much.
pub const CLIENT_NOTE_TIMEOUT: Duration = Duration::from_secs(1);
/// ZMTP heartbeats (`ZMQ_HEARTBEAT_IVL`) on every eMQP connection a client,
/// worker or scheduler makes to a router: a PING this often on a quiet
/// connection (docs/failover.md).
pub const ZMTP_HEARTBEAT_IVL: Duration = Duration::from_secs(1);
/// `ZMQ_HEARTBEAT_TIMEOUT` and `ZMQ_HEARTBEAT_TTL`: a connection that
/// brings nothing (not even a PONG) for this long is closed and dialled
/// again, so a router that died without closing its connections (machine
/// lost, partition) stops taking messages within this time; with
/// `ZMQ_IMMEDIATE` sends then go to the routers still connected.
pub const ZMTP_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an eMQP [`Client`](crate::client::emqp::Client) waits for the
/// answer to a REQUEST before sending it again with the same msgid
/// (docs/failover.md "Re-sent REQUESTs"), until its timeout.
pub const CLIENT_RESEND_INTERVAL: Duration = Duration::from_secs(1);
/// How long an eMQP [`Client`](crate::client::emqp::Client) spreading
/// over several owners sleeps between rounds of trying each owner's
/// connection when none took a REQUEST at once.
pub const CLIENT_SPREAD_RETRY: Duration = Duration::from_millis(5);

/// Most REQUESTs a [`Client`](crate::client::emqp::Client) keeps to
/// re-send (sent, not yet answered); past it the oldest is dropped from the
/// re-send set (counted) and its outcome is only what the router says.
pub const CLIENT_MAX_PENDING_REQUESTS: usize = 65_536;
/// How often a worker whose INFORM found no router connected (every
/// address of its list down, or still dialling) tries it again.
pub const WORKER_INFORM_WAIT_POLL: Duration = Duration::from_millis(100);

/// A worker serving several owners (docs/scaleout.md "Slots"): a free slot
/// idle this long at one owner, while another owner used every slot it was
/// given within the same time, is taken back (UNREADY) and given to that
/// owner. The worst idle time of a slot while another owner has a backlog
/// is this plus two round trips.
pub const WORKER_SLOT_MOVE_AFTER: Duration = Duration::from_secs(1);

/// How long a worker waits for the answer to an UNREADY before it takes
/// the router for one that does not know the word (an EventMQ router) and
/// stops asking it.
pub const WORKER_UNREADY_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// A worker whose owner's address list has several addresses and that is
/// told DISCONNECT this many times within [`WORKER_DISCONNECT_HINT_WINDOW`]
/// logs a hint: the addresses are probably different routers (owners)
/// joined with `,` (one owner and its standby) where `;` was meant, so its
/// one DEALER sends its INFORM to one router and its READYs in turn to the
/// other, which does not know it (docs/scaleout.md, "`,` against `;`"). A
/// take-over gives one DISCONNECT, not this many.
pub const WORKER_DISCONNECT_HINT_COUNT: usize = 3;
/// See [`WORKER_DISCONNECT_HINT_COUNT`].
pub const WORKER_DISCONNECT_HINT_WINDOW: Duration = Duration::from_secs(10);
/// Most early answers an eMQP `Client` keeps for later `wait` calls before it
/// drops them all: bounds memory when a caller never waits.
pub const CLIENT_MAX_STASHED_ANSWERS: usize = 65_536;
/// Longest line the text client reads from a server: the server's default
/// line limit plus `WANT? ` and the LF.
pub const TEXT_CLIENT_MAX_LINE_BYTES: u64 = TEXT_MAX_LINE_BYTES as u64 + 64;
/// Lines the text client reads, once a write found the connection closed
/// by the server, looking for the `ERR` that says why (`ERR BUSY`): the
/// server's last words are at most its answers to the commands it had read.
pub const TEXT_CLIENT_LINES_AFTER_CLOSE: usize = 1_024;
/// How long the several-owner text client ([`crate::client::text_spread`])
/// leaves an owner it could not connect to out of its rotation: SCHED and
/// ASK go to the owners that are up, so one owner down costs one connect
/// timeout per this interval, not one per command. Still tried when every
/// owner is down.
pub const TEXT_OWNER_RETRY: Duration = Duration::from_secs(1);
/// Most owners (router names) one several-owner text client or emq-bench
/// text run spreads over: each is a connection (per consumer in
/// emq-bench), and an owner list is user input.
pub const TEXT_MAX_OWNERS: usize = MAX_OWNERS;

/// Most owners (router names, `;`-separated) in any address list
/// ([`crate::config::addr::emqp_owners`], `text_owners`): each is a socket
/// (a DEALER per owner in a worker or client), and the list is user input.
pub const MAX_OWNERS: usize = 64;

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
/// The largest message an eMQP `Client` or `Publisher` takes from the
/// broker (`ZMQ_MAXMSGSIZE` on its DEALER; emq's libzmq counts the whole
/// message, vendor/zeromq-src/EMQ-PATCH.md): answers to clients are a msgid
/// and a short text. A larger one is dropped with the connection by
/// ZeroMQ, so the call ends in its timeout.
pub const CLIENT_MAX_ANSWER_BYTES: i64 = 16 << 20;
/// The largest answer an `AdminClient` (emq-cli) takes: STATUS and
/// SHOW_WORKERS list up to [`MAX_QUEUES`] queues and [`MAX_WORKERS`]
/// workers with their queues, and DEAD_SHOW a dead job's body escaped (up
/// to six bytes of text a byte; dead jobs hold up to 64 MiB by default),
/// so the bound is wide: it stops a wrong or hostile address from making
/// emq-cli hold any size (a 300 MB answer took it to 864 MB of RSS), not
/// large answers. Over it, ZeroMQ drops the answer and the call ends in
/// its timeout.
pub const ADMIN_MAX_ANSWER_BYTES: i64 = 1 << 30;
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
