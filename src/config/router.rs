//! The router's settings: one table ([`RawRouterConfig`]), its typed result
//! ([`RouterConfig`]) and its commented defaults ([`DEFAULT_TOML`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::exposure::PlainListener;
use super::kinds::{
    AtLeastOne, EmqpAddr, EmqpAddrOrOff, Humantime, HumantimeOrOff, Kind, LogFilter, Many, Optional, Period, Plain,
    ReportPeriodOrOff, Switch, TextListen,
};
use super::queues::QueuesKind;
use super::table::{settings, Settings};
use super::ConfigError;
use crate::limits;

settings! {
    /// The router's settings as flags, `EMQ_*` environment variables and the
    /// TOML file give them: every field optional. Keys match
    /// [`DEFAULT_TOML`]; [`RawRouterConfig::validate`] makes a
    /// [`RouterConfig`] of them.
    pub struct RawRouterConfig => RouterConfig {
        /// eMQP frontend address to bind (clients, schedulers).
        frontend => frontend_addr: EmqpAddr = limits::FRONTEND_ADDR, env "EMQ_FRONTEND_ADDR", was frontend_addr;
        /// eMQP backend address to bind (workers).
        backend => backend_addr: EmqpAddr = limits::BACKEND_ADDR, env "EMQ_BACKEND_ADDR", was backend_addr;
        /// Admin address to bind (emq-cli).
        admin => admin_addr: EmqpAddr = limits::ADMIN_ADDR, env "EMQ_ADMIN_ADDR", was admin_addr;
        /// Text protocol listen address (`ip:port`), or `off`.
        text => text_addr: TextListen = limits::TEXT_ADDR, env "EMQ_TEXT_ADDR", was text_addr;
        /// HTTP listener for `/metrics` (Prometheus) and the status page
        /// (`ip:port`), or `""` (or `off`) for none.
        metrics => metrics_addr: HttpListen = limits::METRICS_ADDR, env "EMQ_METRICS_ADDR";
        /// Allow plain listeners (eMQP without CURVE, the plaintext text
        /// protocol, plain HTTP) on a non-loopback address; each is named
        /// in a warning at start. Off: such a listener stops the start
        /// (docs/security.md, "Safe default").
        allow_insecure_remote: Switch = false, env "EMQ_ALLOW_INSECURE_REMOTE";
        /// Most queues labelled in `/metrics` and shown on the status page;
        /// the rest are summed as `queue="_other"`.
        metrics_max_queues: AtLeastOne = limits::METRICS_MAX_QUEUES, env "EMQ_METRICS_MAX_QUEUES";
        /// Most HTTP connections to the metrics server at once; a connection
        /// past it takes the slot of an open one, which is closed
        /// (`http_connections_evicted`): of the address holding the most,
        /// one already answered, else the one waiting longest for its
        /// request head, else the one longest not reading its answer.
        metrics_max_connections: AtLeastOne = limits::METRICS_MAX_CONNECTIONS, env "EMQ_METRICS_MAX_CONNECTIONS";
        /// A metrics HTTP connection's request head must be complete this
        /// long after it was accepted, else it is answered `408` and closed
        /// (e.g. `5s`).
        metrics_head_timeout: Period = limits::METRICS_HEAD_TIMEOUT, env "EMQ_METRICS_HEAD_TIMEOUT";
        /// A metrics HTTP connection is closed this long after it was
        /// accepted, request read and answer sent or not (e.g. `10s`).
        metrics_request_timeout: Period = limits::METRICS_REQUEST_TIMEOUT, env "EMQ_METRICS_REQUEST_TIMEOUT";
        /// File of `user:<bcrypt hash>` lines (`htpasswd -nBC 10 user`):
        /// when set, every HTTP request needs `Authorization: Basic` with a
        /// listed user and its password, else `401`; reread when it changes
        /// (docs/security.md "HTTP: TLS and passwords").
        metrics_basic_auth_file: Optional<Plain<PathBuf>>, env "EMQ_METRICS_BASIC_AUTH_FILE";
        /// PEM certificate chain (the server's first): when set, with
        /// `metrics_tls_key_file`, the HTTP listener speaks HTTPS only;
        /// reread for new connections when it changes.
        metrics_tls_cert_file: Optional<Plain<PathBuf>>, env "EMQ_METRICS_TLS_CERT_FILE";
        /// PEM private key of `metrics_tls_cert_file`.
        metrics_tls_key_file: Optional<Plain<PathBuf>>, env "EMQ_METRICS_TLS_KEY_FILE";
        /// PEM CA certificates: when set, every HTTPS client must present a
        /// certificate issued by one of them (mutual TLS).
        metrics_tls_client_ca_file: Optional<Plain<PathBuf>>, env "EMQ_METRICS_TLS_CLIENT_CA_FILE";
        /// Dispatcher shards (queue-owning threads). 0 = pick from the core count.
        shards: Shards = 0usize, env "EMQ_SHARDS";
        /// Pin the I/O and shard threads to cores when there are enough cores.
        pin_threads: Plain<bool> = true, env "EMQ_PIN_THREADS";
        /// Heartbeat send period to workers and schedulers (e.g. `3s`).
        heartbeat_interval: Humantime = limits::HEARTBEAT_INTERVAL, env "EMQ_HEARTBEAT_INTERVAL";
        /// A peer silent this long is dead (e.g. `5s`).
        heartbeat_timeout: Humantime = limits::HEARTBEAT_TIMEOUT, env "EMQ_HEARTBEAT_TIMEOUT";
        /// Most waiting jobs per queue; past it REQUEST gets ERROR and SCHED
        /// gets `ERR QUEUE_FULL`.
        max_queue_len: AtLeastOne = limits::MAX_QUEUE_LEN, env "EMQ_MAX_QUEUE_LEN";
        /// Most waiting bytes per queue (job frames as held); past it
        /// `QUEUE_FULL`.
        max_queue_bytes: AtLeastOne = limits::MAX_QUEUE_BYTES, env "EMQ_MAX_QUEUE_BYTES";
        /// Most bytes of waiting and in-flight jobs in the whole broker;
        /// past it `QUEUE_FULL`. Unset: a quarter of the machine's memory,
        /// or of its control group's limit when lower (containers).
        max_memory_bytes: Optional<AtLeastOne>, env "EMQ_MAX_MEMORY_BYTES";
        /// Largest eMQP message in bytes, all frames together; past it
        /// `ERROR TOO_BIG` (a message over twice this and 4 KiB, 64 bytes
        /// a frame counted on top, makes ZeroMQ drop the peer).
        max_message_bytes: AtLeastOne = limits::MAX_MESSAGE_BYTES, env "EMQ_MAX_MESSAGE_BYTES";
        /// Most queues held at once; a new name past it gets `QUEUE_LIMIT`.
        max_queues: AtLeastOne = limits::MAX_QUEUES, env "EMQ_MAX_QUEUES";
        /// An idle queue (empty, no worker, no offer) is forgotten after this.
        queue_idle_grace: Humantime = limits::QUEUE_IDLE_GRACE, env "EMQ_QUEUE_IDLE_GRACE";
        /// After a start or take-over, a REQUEST for an undeclared queue keeps its queue this long.
        queue_learn_grace: Humantime = limits::QUEUE_LEARN_GRACE, env "EMQ_QUEUE_LEARN_GRACE";
        /// Most queues in one worker's INFORM; past it `ERROR BAD_INFORM`.
        max_queues_per_worker: AtLeastOne = limits::MAX_QUEUES_PER_WORKER, env "EMQ_MAX_QUEUES_PER_WORKER";
        /// Most registered workers; past it `ERROR BAD_INFORM`.
        max_workers: AtLeastOne = limits::MAX_WORKERS, env "EMQ_MAX_WORKERS";
        /// Most registered schedulers; past it `ERROR BUSY`.
        max_schedulers: AtLeastOne = limits::MAX_SCHEDULERS, env "EMQ_MAX_SCHEDULERS";
        /// Messages handed to a shard and not taken yet before the I/O thread
        /// stops reading its sockets (backpressure).
        shard_inbox_messages: AtLeastOne = limits::SHARD_INBOX_MESSAGES, env "EMQ_SHARD_INBOX_MESSAGES";
        /// Queues of a worker whose INFORM has an empty queue list, as JSON
        /// (`[[10, "default"]]`).
        default_queues: QueueList = default_queues_json(), env "EMQ_DEFAULT_QUEUES";
        /// How long a worker that said KBYE may still finish its jobs (e.g. `300s`).
        kbye_grace: Humantime = limits::KBYE_GRACE, env "EMQ_KBYE_GRACE";
        /// Time limit of a job on an eMQP worker without a `timeout:N`
        /// header; past it (plus 5 s) the job is taken back (`0s` = none).
        job_timeout: HumantimeOrOff = limits::JOB_TIMEOUT, env "EMQ_JOB_TIMEOUT";
        /// Per-queue time limits overriding `job_timeout`, as a JSON object
        /// of queue → duration (`{"reports": "2h", "email": "30s"}`; `"0s"`:
        /// none); a job's `timeout:N` header still wins.
        job_timeouts: QueueTimeouts = String::from("{}"), env "EMQ_JOB_TIMEOUTS";
        /// Settings of named queues overriding the router-wide ones, as a
        /// JSON object of queue → settings: `job_timeout`, `max_retries`,
        /// `max_queue_len`, `max_queue_bytes`
        /// (`{"reports": {"job_timeout": "2h", "max_retries": 10}}`).
        queues: QueuesKind = String::from("{}"), env "EMQ_QUEUES";
        /// Retries of a job that failed, passed its deadline or lost its
        /// worker before it goes to the dead set (a `retry:N` header overrides).
        max_retries: Retries = limits::MAX_RETRIES, env "EMQ_MAX_RETRIES";
        /// Wait before the first retry of a failed job; doubles per retry,
        /// less up to a quarter of jitter (e.g. `1s`).
        retry_backoff: Humantime = limits::RETRY_BACKOFF, env "EMQ_RETRY_BACKOFF";
        /// Longest wait between two tries (e.g. `10m`).
        retry_backoff_max: Humantime = limits::RETRY_BACKOFF_MAX, env "EMQ_RETRY_BACKOFF_MAX";
        /// Most jobs in the dead set; past it the oldest are dropped.
        dead_max_jobs: AtLeastOne = limits::DEAD_MAX_JOBS, env "EMQ_DEAD_MAX_JOBS";
        /// Most bytes of jobs in the dead set; past it the oldest are dropped.
        dead_max_bytes: AtLeastOne = limits::DEAD_MAX_BYTES, env "EMQ_DEAD_MAX_BYTES";
        /// How long shutdown waits for queued and in-flight jobs (e.g. `10s`).
        drain_timeout: Humantime = limits::DRAIN_TIMEOUT, env "EMQ_DRAIN_TIMEOUT";
        /// ZeroMQ send and receive high-water mark per peer (messages).
        zmq_hwm: Plain<i32> = limits::ZMQ_HWM, env "EMQ_ZMQ_HWM";
        /// Log filter (`info`, `emq=debug` for every job's steps, `warn`).
        log: LogFilter = limits::LOG, env "EMQ_LOG";
        text: TextConfig {
            //! Text protocol limits (docs/text-protocol.md "Limits on connections")
            //! and the text front end's threads.
            /// Longest text line in bytes, LF (and a CR before it) not counted.
            text_max_line_bytes => max_line_bytes: AtLeastOne = limits::TEXT_MAX_LINE_BYTES,
                env "EMQ_TEXT_MAX_LINE_BYTES", was text_max_line "EMQ_TEXT_MAX_LINE";
            /// Text offer timeout (e.g. `300s`).
            text_offer_timeout => offer_timeout: Period = limits::TEXT_OFFER_TIMEOUT,
                env "EMQ_TEXT_OFFER_TIMEOUT";
            /// A text line must be complete this long after its first byte (e.g. `60s`).
            text_line_timeout => line_timeout: Period = limits::TEXT_LINE_TIMEOUT, env "EMQ_TEXT_LINE_TIMEOUT",
                was text_idle_timeout "EMQ_TEXT_IDLE_TIMEOUT";
            /// Most open text connections.
            text_max_connections => max_connections: AtLeastOne = limits::TEXT_MAX_CONNECTIONS,
                env "EMQ_TEXT_MAX_CONNECTIONS";
            /// Text I/O threads, each serving many connections. 0 = one per two cores.
            text_threads => threads: TextThreads = 0usize, env "EMQ_TEXT_THREADS";
            /// Text I/O threads that also accept connections (at most text_threads).
            text_acceptors => acceptors: AtLeastOne = limits::TEXT_ACCEPTORS, env "EMQ_TEXT_ACCEPTORS";
            /// Descriptors kept free for eMQP and admin: text connections get ERR BUSY below it.
            text_reserved_fds => reserved_fds: Plain<usize> = limits::TEXT_RESERVED_FDS,
                env "EMQ_TEXT_RESERVED_FDS";
            /// A text connection holding more unsent reply bytes than this is closed.
            text_max_unsent_bytes => max_unsent_bytes: AtLeastOne = limits::TEXT_MAX_UNSENT_BYTES,
                env "EMQ_TEXT_MAX_UNSENT_BYTES";
            /// Most bytes of input held for all text connections together that
            /// are not commands yet (partial lines, bytes read but not decoded);
            /// past it connections are read only to the end of their next line,
            /// or one at a time through a longer line (at least 2 × text_max_line_bytes).
            text_max_buffered_bytes => max_buffered_bytes: AtLeastOne = limits::TEXT_MAX_BUFFERED_BYTES,
                env "EMQ_TEXT_MAX_BUFFERED_BYTES";
            /// Longest wait of a long-poll `ASK <queue> <ms>` (e.g. `300s`).
            text_max_ask_wait => max_ask_wait: Humantime = limits::TEXT_MAX_ASK_WAIT, env "EMQ_TEXT_MAX_ASK_WAIT";
            /// An ASK keeps its queue known for eMQP REQUESTs this long (e.g. `60s`).
            text_ask_grace => ask_grace: Humantime = limits::TEXT_ASK_GRACE, env "EMQ_TEXT_ASK_GRACE";
            /// Most queue names kept known only by ASKs; past it ASK gets ERR QUEUE_LIMIT.
            text_max_asked_queues => max_asked_queues: AtLeastOne = limits::TEXT_MAX_ASKED_QUEUES,
                env "EMQ_TEXT_MAX_ASKED_QUEUES";
            /// Text protocol over TLS: listen address (`ip:port`), or `off`
            /// (docs/security.md "Text protocol: TLS and tokens").
            text_tls => tls_addr: TextListen = String::from("off"), env "EMQ_TEXT_TLS";
            /// PEM certificate chain of the `text_tls` listener (server
            /// certificate first); re-read for new connections when it changes.
            text_tls_cert_file => tls_cert_file: Optional<Plain<PathBuf>>, env "EMQ_TEXT_TLS_CERT_FILE";
            /// PEM private key of `text_tls_cert_file`.
            text_tls_key_file => tls_key_file: Optional<Plain<PathBuf>>, env "EMQ_TEXT_TLS_KEY_FILE";
            /// PEM CA certificates: when set, `text_tls` clients must present a
            /// certificate signed by one of them (mutual TLS).
            text_tls_client_ca_file => tls_client_ca_file: Optional<Plain<PathBuf>>,
                env "EMQ_TEXT_TLS_CLIENT_CA_FILE";
            /// A `text_tls` handshake must finish this long after the accept (e.g. `10s`).
            text_tls_handshake_timeout => tls_handshake_timeout: Period = limits::TEXT_TLS_HANDSHAKE_TIMEOUT,
                env "EMQ_TEXT_TLS_HANDSHAKE_TIMEOUT";
            /// File of accepted tokens (`NAME sha256:<hex>` lines): when set,
            /// every text connection (plain and TLS) must send `AUTH <token>` first.
            text_auth_tokens_file => auth_tokens_file: Optional<Plain<PathBuf>>,
                env "EMQ_TEXT_AUTH_TOKENS_FILE";
        }
        wal: WalConfig {
            //! Write-ahead log settings (see [`crate::wal`]).
            /// Data directory: the write-ahead log (`wal/`) and its lock file
            /// (default `$XDG_STATE_HOME/emq-router`, else
            /// `~/.local/state/emq-router`).
            data_dir => data_dir: Optional<Plain<PathBuf>>, env "EMQ_DATA_DIR";
            /// `sync` (a job is acknowledged once its record is synced to
            /// disk), `async` (acknowledged once written; synced every
            /// `sync_interval`), `memory` (no log) or `replicated` (once a
            /// NATS JetStream cluster holds it: the `nats_*` settings).
            durability => durability: DurabilityKind = "sync", env "EMQ_DURABILITY";
            /// With `durability = "async"`: how often the log is synced (e.g. `50ms`).
            sync_interval => sync_interval: Period = limits::WAL_SYNC_INTERVAL, env "EMQ_SYNC_INTERVAL";
            /// Size at which a log segment file is closed and the next begun.
            wal_segment_bytes => segment_bytes: SegmentBytes = limits::WAL_SEGMENT_BYTES, env "EMQ_WAL_SEGMENT_BYTES";
            /// With `durability = "sync"`: sync on a thread of each shard's own
            /// (`true`), so the shard serves the next batch meanwhile, or on
            /// the shard's thread (`false`).
            wal_sync_thread => sync_thread: Plain<bool> = limits::WAL_SYNC_THREAD, env "EMQ_WAL_SYNC_THREAD";
            /// New jobs are refused (`STORE_FULL`) while the data directory's
            /// file system has fewer free bytes than this; 0: never
            /// (docs/durability.md).
            disk_free_limit => disk_free_limit: FreeLimit = limits::DISK_FREE_LIMIT, env "EMQ_DISK_FREE_LIMIT";
            /// At start, on damage in the middle of the log: skip the damaged
            /// bytes (logged with counts), move the damaged segments to the
            /// data directory's `damaged/` folder and start with the rest,
            /// instead of refusing to start (`--recover-skip-damaged`).
            recover_skip_damaged => skip_damaged: Switch = false, env "EMQ_RECOVER_SKIP_DAMAGED";
        }
        nats: NatsConfig {
            //! With `durability = "replicated"`: the NATS JetStream cluster
            //! that holds the job log (see [`crate::jslog`], docs/replicated.md).
            /// NATS server URLs of the JetStream cluster (`nats://host:port`,
            /// `tls://host:port`); several for one cluster. Needed with
            /// `durability = "replicated"`.
            nats_urls => urls: Many<NatsUrl> = Vec::<String>::new(), env "EMQ_NATS_URLS";
            /// This router's name: its streams are `<prefix>_<name>_...`, and
            /// one live router at a time may hold a name.
            router_name => router_name: StoreName = limits::ROUTER_NAME, env "EMQ_ROUTER_NAME";
            /// Prefix of the router's streams and key-value buckets.
            nats_stream_prefix => stream_prefix: StoreName = limits::NATS_STREAM_PREFIX, env "EMQ_NATS_STREAM_PREFIX";
            /// Copies JetStream keeps of each stream (1 to 5; 3 survives one
            /// server's loss).
            nats_replicas => replicas: Replicas = limits::NATS_REPLICAS, env "EMQ_NATS_REPLICAS";
            /// JetStream's duplicate window on the log streams: a publish retried
            /// with the same message id inside it is stored once (e.g. `120s`).
            nats_dedup_window => dedup_window: Period = limits::NATS_DEDUP_WINDOW, env "EMQ_NATS_DEDUP_WINDOW";
            /// How long one publish waits for its PubAck (and an API request
            /// for its answer) before it is retried (e.g. `2s`).
            nats_ack_timeout => ack_timeout: Period = limits::NATS_ACK_TIMEOUT, env "EMQ_NATS_ACK_TIMEOUT";
            /// How long a batch is retried before its jobs are refused
            /// (`STORE_FAILED`); at most half of `nats_dedup_window` (e.g. `30s`).
            nats_give_up => give_up: Period = limits::NATS_GIVE_UP, env "EMQ_NATS_GIVE_UP";
            /// The router's hold on its name: renewed every third of it; a
            /// router that stops renewing loses the name this long after
            /// its last renewal (e.g. `10s`).
            nats_lease => lease: Period = limits::NATS_LEASE, env "EMQ_NATS_LEASE";
            /// Start as a standby: while another router holds `router_name`,
            /// wait (reading its lease key every 250 ms) instead
            /// of refusing to start; take the name once its lease expires,
            /// fence the old holder, replay and serve (docs/replicated.md,
            /// "Failover").
            standby => standby: Switch = false, env "EMQ_STANDBY";
            /// Most publishes in flight (all shards together).
            nats_max_in_flight => max_in_flight: AtLeastOne = limits::NATS_MAX_IN_FLIGHT, env "EMQ_NATS_MAX_IN_FLIGHT";
            /// PEM file of the CA certificates to trust for the servers' TLS
            /// certificates (TLS is used when a URL says `tls://` or this is set).
            nats_tls_ca => tls_ca: Optional<Plain<PathBuf>>, env "EMQ_NATS_TLS_CA";
            /// PEM client certificate for mutual TLS (with `nats_tls_key`).
            nats_tls_cert => tls_cert: Optional<Plain<PathBuf>>, env "EMQ_NATS_TLS_CERT";
            /// PEM private key of `nats_tls_cert`.
            nats_tls_key => tls_key: Optional<Plain<PathBuf>>, env "EMQ_NATS_TLS_KEY";
            /// NATS credentials file (a user JWT and NKey seed, `.creds`).
            nats_creds => creds: Optional<Plain<PathBuf>>, env "EMQ_NATS_CREDS";
            /// NATS user name (with `nats_password_file`). Give one kind of
            /// credentials: this, `nats_token_file`, `nats_nkey_file` or
            /// `nats_creds` (docs/replicated.md, "Secure connections").
            nats_user => user: Optional<Plain<String>>, env "EMQ_NATS_USER";
            /// File holding `nats_user`'s password (read at start, trimmed).
            /// Secrets are read from files only, never given as flag values
            /// (those show in `ps`).
            nats_password_file => password_file: Optional<Plain<PathBuf>>, env "EMQ_NATS_PASSWORD_FILE";
            /// File holding a NATS authentication token (read at start, trimmed).
            nats_token_file => token_file: Optional<Plain<PathBuf>>, env "EMQ_NATS_TOKEN_FILE";
            /// File holding an NKey user seed (`SU...`, read at start, trimmed).
            nats_nkey_file => nkey_file: Optional<Plain<PathBuf>>, env "EMQ_NATS_NKEY_FILE";
        }
        curve: CurveServerConfig {
            //! CURVE (ZeroMQ RFC 26) endpoints: a second bind of the frontend,
            //! backend or admin ROUTER socket that only peers with a listed key
            //! may use (docs/security.md "CURVE").
            /// CURVE frontend address to bind besides `frontend` (same socket;
            /// ZAP domain `frontend`, allow-list `curve_clients_dir`), or `off`.
            frontend_curve => frontend: EmqpAddrOrOff = "off", env "EMQ_FRONTEND_CURVE";
            /// CURVE backend address to bind besides `backend` (ZAP domain
            /// `backend`, allow-list `curve_workers_dir`), or `off`.
            backend_curve => backend: EmqpAddrOrOff = "off", env "EMQ_BACKEND_CURVE";
            /// CURVE admin address to bind besides `admin` (ZAP domain `admin`,
            /// allow-list `curve_admins_dir`), or `off`.
            admin_curve => admin: EmqpAddrOrOff = "off", env "EMQ_ADMIN_CURVE";
            /// The router's secret key file (`NAME.key_secret`, czmq/pyzmq
            /// format, mode 0600 or stricter); needed by any `*_curve` address.
            curve_secret_key_file => secret_key_file: Optional<Plain<PathBuf>>, env "EMQ_CURVE_SECRET_KEY_FILE";
            /// Directory of the `*.key` files of clients allowed on `frontend_curve`.
            curve_clients_dir => clients_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_CLIENTS_DIR";
            /// Directory of the `*.key` files of workers allowed on `backend_curve`.
            curve_workers_dir => workers_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_WORKERS_DIR";
            /// Directory of the `*.key` files of operators allowed on `admin_curve`.
            curve_admins_dir => admins_dir: Optional<Plain<PathBuf>>, env "EMQ_CURVE_ADMINS_DIR";
        }
        latency: LatencyConfig {
            //! Latency reporter settings.
            /// Period of the latency log line (e.g. `60s`; `0s` = off; at least `1s`).
            latency_interval => report_interval: ReportPeriodOrOff = limits::LATENCY_REPORT_INTERVAL,
                env "EMQ_LATENCY_INTERVAL";
            /// Directory for per-interval `.hgrm` latency files (off when unset).
            latency_dir => hgrm_dir: Optional<Plain<PathBuf>>, env "EMQ_LATENCY_DIR";
        }
    }
}

/// What an acknowledgement promises (setting `durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged once synced to disk.
    Sync,
    /// Acknowledged once written; synced every `sync_interval`.
    Async,
    /// No log.
    Memory,
    /// Acknowledged once a NATS JetStream cluster confirms it holds the
    /// record (its replicas, `nats_replicas`); no local log.
    Replicated,
}

impl Durability {
    /// The setting's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Async => "async",
            Durability::Memory => "memory",
            Durability::Replicated => "replicated",
        }
    }
}

impl WalConfig {
    /// The data directory: as configured, else the default
    /// ([`default_data_dir`], read from the environment now).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }
}

/// `$XDG_STATE_HOME/emq-router`, else `$HOME/.local/state/emq-router`,
/// else `./emq-router-data` (the scheduler's rule: a log of jobs is state,
/// not configuration or cache).
pub fn default_data_dir() -> PathBuf {
    let nonempty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(state) = nonempty("XDG_STATE_HOME") {
        return state.join("emq-router");
    }
    if let Some(home) = nonempty("HOME") {
        return home.join(".local/state/emq-router");
    }
    PathBuf::from("emq-router-data")
}

/// The commented default configuration; `--print-config` prints it with the
/// resolved values ([`super::template::resolved`]).
pub const DEFAULT_TOML: &str = include_str!("default.toml");

impl RawRouterConfig {
    /// Validates into a [`RouterConfig`], applying defaults; warns when the
    /// heartbeat settings will lose Python EventMQ peers.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(self) -> Result<RouterConfig, ConfigError> {
        let config = self.build()?;
        match (&config.metrics_tls_cert_file, &config.metrics_tls_key_file) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    name: "metrics_tls_cert_file",
                    why: "metrics_tls_cert_file and metrics_tls_key_file go together (both or neither)".into(),
                })
            }
            (None, None) if config.metrics_tls_client_ca_file.is_some() => {
                return Err(ConfigError::Invalid {
                    name: "metrics_tls_client_ca_file",
                    why: "needs TLS: set metrics_tls_cert_file and metrics_tls_key_file too".into(),
                })
            }
            _ => {}
        }
        check_curve_settings(&config.curve).map_err(|(name, why)| ConfigError::Invalid { name, why })?;
        if config.text.max_unsent_bytes < config.text.max_line_bytes + WANT_LINE_OVERHEAD_BYTES {
            return Err(ConfigError::Invalid {
                name: "text_max_unsent_bytes",
                why: format!(
                    "must hold one full WANT? line: at least text_max_line_bytes + {WANT_LINE_OVERHEAD_BYTES} ({})",
                    config.text.max_line_bytes + WANT_LINE_OVERHEAD_BYTES
                ),
            });
        }
        if config.text.max_buffered_bytes / 2 < config.text.max_line_bytes {
            return Err(ConfigError::Invalid {
                name: "text_max_buffered_bytes",
                why: format!(
                    "must hold two longest lines (one is kept for the oldest waiting line to finish): \
                     at least 2 × text_max_line_bytes ({})",
                    config.text.max_line_bytes.saturating_mul(2)
                ),
            });
        }
        // The router raises its soft descriptor limit to the hard one; a
        // reserve that is not below it refuses every text connection
        // (the descriptors the router itself holds are checked at start:
        // `text::fds::check_text_reserve`).
        let hard = crate::fds::hard_nofile_limit();
        if let (Some(_), Ok(hard)) = (config.text_addr, hard) {
            if config.text.reserved_fds as u64 >= hard {
                return Err(ConfigError::Invalid {
                    name: "text_reserved_fds",
                    why: format!(
                        "{} is not below the descriptor limit (RLIMIT_NOFILE, hard) of {hard}: every text \
                         connection would get ERR BUSY too few descriptors left; lower it or raise the limit \
                         (ulimit -n), or turn the text port off (text = \"off\")",
                        config.text.reserved_fds
                    ),
                });
            }
        }
        if config.wal.durability == Durability::Replicated {
            let nats = &config.nats;
            if nats.urls.is_empty() {
                return Err(ConfigError::Invalid {
                    name: "nats_urls",
                    why: "durability = \"replicated\" needs the NATS JetStream cluster's URLs (--nats-urls, \
                          EMQ_NATS_URLS, e.g. nats://10.0.0.1:4222,nats://10.0.0.2:4222)"
                        .into(),
                });
            }
            if nats.give_up > nats.dedup_window / 2 {
                return Err(ConfigError::Invalid {
                    name: "nats_give_up",
                    why: format!(
                        "{:?} is more than half of nats_dedup_window ({:?}): a publish retried late could be stored twice",
                        nats.give_up, nats.dedup_window
                    ),
                });
            }
            if nats.ack_timeout >= nats.give_up {
                return Err(ConfigError::Invalid {
                    name: "nats_ack_timeout",
                    why: format!("{:?} must be below nats_give_up ({:?})", nats.ack_timeout, nats.give_up),
                });
            }
            check_nats_settings(nats)?;
        }
        let text = &config.text;
        if text.tls_addr.is_some() && (text.tls_cert_file.is_none() || text.tls_key_file.is_none()) {
            return Err(ConfigError::Invalid {
                name: "text_tls",
                why: "a TLS listener needs text_tls_cert_file and text_tls_key_file".into(),
            });
        }
        if text.tls_addr.is_some() && text.tls_addr == config.text_addr {
            return Err(ConfigError::Invalid {
                name: "text_tls",
                why: "must not be the plain text address (text)".into(),
            });
        }
        super::exposure::check_plain_listeners(&config.plain_listeners(), config.allow_insecure_remote)?;
        if let Err(why) = super::queues::QueuePolicies::new(&config) {
            return Err(ConfigError::Invalid { name: "queues", why });
        }
        let (interval, timeout) = (config.heartbeat_interval, config.heartbeat_timeout);
        if interval.is_zero() || timeout <= interval {
            return Err(ConfigError::Invalid {
                name: "heartbeat_timeout",
                why: "must be longer than a non-zero heartbeat_interval".into(),
            });
        }
        if timeout < limits::PYTHON_PEER_HEARTBEAT + limits::PYTHON_PEER_HEARTBEAT_SLACK
            || interval > limits::PYTHON_PEER_SILENCE / 3
        {
            tracing::warn!(
                heartbeat_interval = ?interval,
                heartbeat_timeout = ?timeout,
                "Python EventMQ peers heartbeat every 3 s and reconnect after ~15 s of router silence: \
                 these settings will expire or lose them"
            );
        }
        Ok(config)
    }
}

/// Checks the TLS and credential settings of `config` without reading any
/// file: `nats_tls_cert` and `nats_tls_key` together, `nats_user` and
/// `nats_password_file` together, and at most one kind of credentials.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the setting, e.g. `setting
/// nats_token_file: give one kind of NATS credentials, not nats_user and
/// nats_token_file: ...`.
pub fn check_nats_settings(config: &NatsConfig) -> Result<(), ConfigError> {
    let invalid = |name: &'static str, why: String| Err(ConfigError::Invalid { name, why });
    if config.tls_cert.is_some() != config.tls_key.is_some() {
        return invalid("nats_tls_cert", "nats_tls_cert and nats_tls_key go together".into());
    }
    match (&config.user, &config.password_file) {
        (Some(_), None) => {
            return invalid(
                "nats_password_file",
                "nats_user needs nats_password_file (a file holding the password: secrets are never \
                 given as flag values)"
                    .into(),
            )
        }
        (None, Some(_)) => return invalid("nats_user", "nats_password_file needs nats_user".into()),
        _ => {}
    }
    let kinds: Vec<&'static str> = [
        (config.user.is_some(), "nats_user"),
        (config.token_file.is_some(), "nats_token_file"),
        (config.nkey_file.is_some(), "nats_nkey_file"),
        (config.creds.is_some(), "nats_creds"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect();
    if let [first, second, ..] = kinds[..] {
        return invalid(
            second,
            format!(
                "give one kind of NATS credentials, not {first} and {second}: nats_user with \
                 nats_password_file, nats_token_file, nats_nkey_file or nats_creds"
            ),
        );
    }
    Ok(())
}

/// Checks the CURVE settings (config validation: one line each): every
/// `*_curve` address needs `curve_secret_key_file`, its allow-list
/// directory, and a libzmq built with CURVE.
///
/// # Errors
/// `(setting, why)`.
pub fn check_curve_settings(c: &CurveServerConfig) -> Result<(), (&'static str, String)> {
    let endpoints = [
        (&c.frontend, "frontend_curve", "curve_clients_dir", &c.clients_dir),
        (&c.backend, "backend_curve", "curve_workers_dir", &c.workers_dir),
        (&c.admin, "admin_curve", "curve_admins_dir", &c.admins_dir),
    ];
    for (_, setting, dir_setting, dir) in endpoints.into_iter().filter(|(addr, ..)| addr.is_some()) {
        crate::curve::require_curve().map_err(|e| (setting, e.to_string()))?;
        if c.secret_key_file.is_none() {
            return Err((setting, "needs curve_secret_key_file (the router's .key_secret)".into()));
        }
        if dir.is_none() {
            return Err((setting, format!("needs {dir_setting} (the allow-list directory of *.key files)")));
        }
    }
    Ok(())
}

impl RouterConfig {
    /// The listeners with neither encryption nor authentication, by
    /// setting: `frontend`, `backend`, `admin`, `text` and `metrics` (the
    /// last two unless off; `metrics` also not with TLS). An encrypted listener (a CURVE endpoint, text
    /// over TLS, HTTP with TLS) is not one: leave it out
    /// ([`super::exposure`]).
    pub fn plain_listeners(&self) -> Vec<PlainListener> {
        let mut plain = vec![
            PlainListener::new("frontend", &self.frontend_addr),
            PlainListener::new("backend", &self.backend_addr),
            PlainListener::new("admin", &self.admin_addr),
        ];
        plain.extend(self.text_addr.map(|a| PlainListener::new("text", a.to_string())));
        // HTTP with TLS (`metrics_tls_cert_file`) is encrypted; Basic auth
        // alone is not (its passwords cross the network in the clear).
        if self.metrics_tls_cert_file.is_none() {
            plain.extend(self.metrics_addr.map(|a| PlainListener::new("metrics", a.to_string())));
        }
        plain
    }

    /// The broker-wide byte limit: [`RouterConfig::max_memory_bytes`], or,
    /// when unset, a quarter of the memory the process may use (at least
    /// 64 MiB): the machine's physical memory, or the memory limit of its
    /// control group when that is lower (in a container).
    pub fn memory_limit_bytes(&self) -> usize {
        self.max_memory_bytes.unwrap_or_else(|| {
            // SAFETY: sysconf has no preconditions; it returns -1 on error.
            let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
            let physical = (pages.max(0) as usize).saturating_mul(page.max(0) as usize);
            let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|groups| {
                let files = cgroup_limit_files(&groups);
                files.iter().filter_map(|file| parse_cgroup_limit(&std::fs::read_to_string(file).ok()?)).min()
            });
            default_memory_limit(cgroup, physical)
        })
    }
}

/// A quarter of what the process may use, at least 64 MiB: the lower of the
/// control group's limit and the physical memory (0: sysconf could not
/// tell, no limit of its own).
fn default_memory_limit(cgroup: Option<usize>, physical: usize) -> usize {
    let total = match (cgroup, physical) {
        (Some(limit), 0) => limit,
        (Some(limit), physical) => limit.min(physical),
        (None, physical) => physical,
    };
    (total / 4).max(64 << 20)
}

/// The files that may hold this process's memory limit, given
/// `/proc/self/cgroup`: cgroup v2 `memory.max` or cgroup v1
/// `memory.limit_in_bytes` (under `/sys/fs/cgroup`) of its group and of each
/// group above it; the lowest limit among them applies. A path leading
/// outside this namespace ("/../..") names only the root's file; malformed
/// lines are skipped.
fn cgroup_limit_files(proc_cgroup: &str) -> Vec<String> {
    let mut files = Vec::new();
    for line in proc_cgroup.lines() {
        // "0::/path" (v2) or "N:memory:/path" (v1, possibly "memory,..." lists).
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            continue;
        };
        let parts: Vec<&str> = path.trim_end_matches(" (deleted)").split('/').filter(|p| !p.is_empty()).collect();
        let depths = if parts.contains(&"..") { 0..=0 } else { 0..=parts.len() };
        for depth in depths.rev() {
            files.push(match depth {
                0 => format!("{root}/{file}"),
                _ => format!("{root}/{}/{file}", parts[..depth].join("/")),
            });
        }
    }
    files
}

/// A cgroup memory limit file's content: a number of bytes, or `max` (v2)
/// or a huge number (v1's "unlimited", 2^63 rounded to pages) for none.
fn parse_cgroup_limit(text: &str) -> Option<usize> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes < 1 << 60).then(|| usize::try_from(bytes).ok()).flatten()
}

impl Default for RouterConfig {
    fn default() -> RouterConfig {
        match RawRouterConfig::default().validate() {
            Ok(c) => c,
            Err(e) => unreachable!("built-in defaults are valid: {e}"),
        }
    }
}

/// `durability`: `sync`, `async`, `memory` or `replicated`.
pub struct DurabilityKind;

impl Kind for DurabilityKind {
    type Raw = String;
    type Value = Durability;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.to_string())
    }

    fn check(text: String) -> Result<Durability, String> {
        match text.trim() {
            "sync" => Ok(Durability::Sync),
            "async" => Ok(Durability::Async),
            "memory" => Ok(Durability::Memory),
            "replicated" => Ok(Durability::Replicated),
            other => Err(format!("{other:?} is not one of sync, async, memory, replicated")),
        }
    }
}

/// A NATS server URL: `nats://`, `tls://` or a bare `host:port`.
pub struct NatsUrl;

impl Kind for NatsUrl {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.trim().to_string())
    }

    fn check(text: String) -> Result<String, String> {
        let rest = text.strip_prefix("nats://").or_else(|| text.strip_prefix("tls://")).unwrap_or(&text);
        let host_port = rest.rsplit('@').next().unwrap_or(rest);
        match host_port.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(text),
            _ => Err(format!("{text:?} is not a NATS URL like nats://host:4222")),
        }
    }
}

/// A router name or stream prefix: 1 to 32 of `A-Z a-z 0-9 - _` (it goes
/// into JetStream stream, subject and key names, which forbid `.`, `*`,
/// `>` and spaces).
pub struct StoreName;

impl Kind for StoreName {
    type Raw = String;
    type Value = String;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.trim().to_string())
    }

    fn check(text: String) -> Result<String, String> {
        let ok =
            (1..=32).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(text)
        } else {
            Err(format!("{text:?} must be 1 to 32 characters of A-Z, a-z, 0-9, - and _"))
        }
    }
}

/// `nats_replicas`: 1 to 5 (JetStream's own bounds).
pub struct Replicas;

impl Kind for Replicas {
    type Raw = u64;
    type Value = usize;

    fn parse(text: &str) -> Result<u64, String> {
        Plain::<u64>::parse(text)
    }

    fn check(n: u64) -> Result<usize, String> {
        if (1..=5).contains(&n) {
            Ok(n as usize)
        } else {
            Err(format!("{n} is not between 1 and 5"))
        }
    }
}

/// `wal_segment_bytes`: at least [`limits::WAL_MIN_SEGMENT_BYTES`], at most 4 GiB.
pub struct SegmentBytes;

impl Kind for SegmentBytes {
    type Raw = u64;
    type Value = u64;

    fn parse(text: &str) -> Result<u64, String> {
        Plain::<u64>::parse(text)
    }

    fn check(n: u64) -> Result<u64, String> {
        if n < limits::WAL_MIN_SEGMENT_BYTES {
            return Err(format!("must be at least {}", limits::WAL_MIN_SEGMENT_BYTES));
        }
        if n > u64::from(u32::MAX) {
            return Err("must be at most 4294967295".into());
        }
        Ok(n)
    }
}

/// `disk_free_limit`: bytes, at most `i64::MAX` (the largest integer a TOML
/// config file, and the config the router prints, can hold).
pub struct FreeLimit;

impl Kind for FreeLimit {
    type Raw = u64;
    type Value = u64;

    fn parse(text: &str) -> Result<u64, String> {
        Plain::<u64>::parse(text)
    }

    fn check(n: u64) -> Result<u64, String> {
        if n > i64::MAX as u64 {
            return Err(format!("{n} bytes is more than a TOML integer holds: at most {} (0: no limit)", i64::MAX));
        }
        Ok(n)
    }
}

/// Default shard count: one per two cores, at least one, so that the I/O
/// thread and the shards do not oversubscribe small machines (2 cores → 1).
pub fn default_shards() -> usize {
    one_per_two_cores()
}

/// Half the cores (`available_parallelism`), at least one: the default for
/// shards and for text I/O threads, which share the cores between them.
fn one_per_two_cores() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores / 2).max(1)
}

/// A thread count: 0 picks `auto()`; at most `max`.
fn count_or_auto(n: usize, auto: impl FnOnce() -> usize, max: usize) -> Result<usize, String> {
    match n {
        0 => Ok(auto()),
        n if n > max => Err(format!("at most {max}")),
        n => Ok(n),
    }
}

/// `WANT? ` and the LF around an offered task's data.
const WANT_LINE_OVERHEAD_BYTES: usize = 7;

/// Text I/O threads: 0 picks one per two cores (at least one), like the
/// shards they hand commands to; at most [`limits::MAX_TEXT_THREADS`].
///
/// Why not one per core: on 2 cores, one text thread beside the one shard
/// took 0.84 × the broker CPU per job of two and 1.07 × their throughput
/// in text-16x16 (`memory`; `sync` 0.89 × and 1.12 ×; medians of 5
/// interleaved runs, README "How it works"). A second thread there only
/// splits each readiness round, and the shard's answers, in two.
pub struct TextThreads;

impl Kind for TextThreads {
    type Raw = usize;
    type Value = usize;

    fn parse(text: &str) -> Result<usize, String> {
        super::kinds::Plain::<usize>::parse(text)
    }

    fn check(n: usize) -> Result<usize, String> {
        count_or_auto(n, one_per_two_cores, limits::MAX_TEXT_THREADS)
    }
}

/// The metrics listener: an IP address and port, or `""`/`off` for none
/// (read like [`TextListen`], with its own error text).
pub struct HttpListen;

impl Kind for HttpListen {
    type Raw = <TextListen as Kind>::Raw;
    type Value = <TextListen as Kind>::Value;

    fn parse(text: &str) -> Result<String, String> {
        TextListen::parse(text)
    }

    fn check(text: String) -> Result<Option<SocketAddr>, String> {
        if text.is_empty() || text == "off" {
            return Ok(None);
        }
        let why = || format!("{text:?} is not an IP address and port (e.g. 127.0.0.1:47296), or \"\" for none");
        text.parse().map(Some).map_err(|_| why())
    }
}

/// Dispatcher shards: 0 picks [`default_shards`]; at most
/// [`limits::MAX_SHARDS`].
pub struct Shards;

impl Kind for Shards {
    type Raw = usize;
    type Value = usize;

    fn parse(text: &str) -> Result<usize, String> {
        super::kinds::Plain::<usize>::parse(text)
    }

    fn check(n: usize) -> Result<usize, String> {
        count_or_auto(n, default_shards, limits::MAX_SHARDS)
    }
}

/// `max_retries`: a whole number from 0 to
/// [`limits::MAX_RETRIES_HEADER`] (a job counts at most 63
/// setbacks).
pub struct Retries;

impl Kind for Retries {
    type Raw = u32;
    type Value = u32;

    fn parse(text: &str) -> Result<u32, String> {
        super::kinds::Plain::<u32>::parse(text)
    }

    fn check(n: u32) -> Result<u32, String> {
        let max = limits::MAX_RETRIES_HEADER;
        if n > max {
            return Err(format!("{n} retries; at most {max}"));
        }
        Ok(n)
    }
}

/// An eMQP queue list as JSON, `[[weight, "name"], …]` (docs/emqp.md "INFORM").
pub struct QueueList;

impl Kind for QueueList {
    type Raw = String;
    type Value = Vec<(i64, String)>;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(json: String) -> Result<Vec<(i64, String)>, String> {
        crate::protocol::queues::parse_queue_list(json.as_bytes()).map_err(|e| e.to_string())
    }
}

/// Per-queue job time limits as a JSON object of queue name → humantime
/// duration (`"0s"`: none), at most [`limits::MAX_QUEUE_JOB_TIMEOUTS`]
/// names, each a valid queue name (README "Deadlines").
pub struct QueueTimeouts;

impl Kind for QueueTimeouts {
    type Raw = String;
    type Value = Vec<(String, Option<Duration>)>;

    fn parse(text: &str) -> Result<String, String> {
        Ok(text.into())
    }

    fn check(json: String) -> Result<Vec<(String, Option<Duration>)>, String> {
        let map: std::collections::BTreeMap<String, String> = serde_json::from_str(&json)
            .map_err(|e| format!("{json:?} is not a JSON object of queue names and durations: {e}"))?;
        if map.len() > limits::MAX_QUEUE_JOB_TIMEOUTS {
            return Err(format!(
                "{} queues; at most {} may have their own time limit",
                map.len(),
                limits::MAX_QUEUE_JOB_TIMEOUTS
            ));
        }
        map.into_iter()
            .map(|(queue, limit)| {
                crate::protocol::queues::check_queue_name(&queue)?;
                let limit = super::kinds::DurationText(limit).parse()?;
                Ok((queue, (!limit.is_zero()).then_some(limit)))
            })
            .collect()
    }
}

/// EventMQ's `QUEUES = [(10, "default")]` as JSON.
fn default_queues_json() -> String {
    serde_json::json!([[limits::DEFAULT_QUEUE_WEIGHT, limits::DEFAULT_QUEUE]]).to_string()
}

super::table::program!(RawRouterConfig => RouterConfig, DEFAULT_TOML, RawRouterConfig::validate);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> RawRouterConfig {
        let vars: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), v.into())).collect();
        RawRouterConfig::from_env(&|name| vars.get(name).cloned()).unwrap()
    }

    #[test]
    fn default_toml_matches_the_table() {
        assert_eq!(super::super::template::problems::<RawRouterConfig>(DEFAULT_TOML), Vec::<String>::new());
        let c = toml::from_str::<RawRouterConfig>(DEFAULT_TOML).unwrap().validate().unwrap();
        assert_eq!(c.default_queues, vec![(10, "default".to_string())]);
        assert_eq!(c.text.max_line_bytes, limits::TEXT_MAX_LINE_BYTES);
        assert_eq!(c.text.max_buffered_bytes, limits::TEXT_MAX_BUFFERED_BYTES);
    }

    /// Black-box finding 8: a limit TOML cannot hold is refused at start
    /// with the setting's name and the bound, not later when the config is
    /// printed or written.
    #[test]
    fn disk_free_limit_above_i64_max_is_refused_clearly() {
        let max = i64::MAX.to_string();
        let c = env(&[("EMQ_DISK_FREE_LIMIT", &max)]).validate().unwrap();
        assert_eq!(c.wal.disk_free_limit, i64::MAX as u64);
        let above = (i64::MAX as u64 + 1).to_string();
        let err = env(&[("EMQ_DISK_FREE_LIMIT", &above)]).validate().unwrap_err().to_string();
        assert!(err.contains("disk_free_limit"), "{err}");
        assert!(
            err.contains("9223372036854775808 bytes is more than a TOML integer holds: at most 9223372036854775807 (0: no limit)"),
            "{err}"
        );
        let err = env(&[("EMQ_DISK_FREE_LIMIT", &u64::MAX.to_string())]).validate().unwrap_err().to_string();
        assert!(err.contains("at most 9223372036854775807"), "{err}");
    }

    #[test]
    fn cgroup_memory_limits_parse_and_unlimited_is_none() {
        assert_eq!(parse_cgroup_limit("536870912\n"), Some(512 << 20));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None, "v1 unlimited");
        assert_eq!(parse_cgroup_limit(""), None);
        assert_eq!(parse_cgroup_limit("-1"), None);
        let gib = 1 << 30;
        assert_eq!(default_memory_limit(Some(2 * gib), 24 * gib), gib / 2, "the container's limit");
        assert_eq!(default_memory_limit(Some(64 * gib), 24 * gib), 6 * gib, "RAM when lower");
        assert_eq!(default_memory_limit(None, 24 * gib), 6 * gib);
        assert_eq!(default_memory_limit(Some(2 * gib), 0), gib / 2, "sysconf could not tell");
        assert_eq!(default_memory_limit(None, 0), 64 << 20, "at least 64 MiB");
    }

    #[test]
    fn cgroup_limit_files_cover_the_group_and_every_group_above_it() {
        let v2 = cgroup_limit_files("0::/system.slice/emq.service\n");
        assert_eq!(
            v2,
            [
                "/sys/fs/cgroup/system.slice/emq.service/memory.max",
                "/sys/fs/cgroup/system.slice/memory.max",
                "/sys/fs/cgroup/memory.max"
            ]
        );
        let v1 = cgroup_limit_files("9:cpu:/\n4:memory,hugetlb:/docker/abc (deleted)\ngarbage\n0::/../..\n");
        assert_eq!(
            v1,
            [
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory.max"
            ]
        );
    }

    #[test]
    fn max_retries_is_at_most_50() {
        assert_eq!(Retries::check(50), Ok(50));
        assert_eq!(Retries::check(51), Err("51 retries; at most 50".into()));
    }

    #[test]
    fn per_queue_job_timeouts_are_checked() {
        let ok = QueueTimeouts::check(r#"{"reports": "2h", "free": "0s"}"#.into()).unwrap();
        assert_eq!(ok, [("free".to_string(), None), ("reports".to_string(), Some(Duration::from_secs(7200)))]);
        for (bad, why) in [
            (r#"[1]"#, "not a JSON object"),
            (r#"{"a b": "1s"}"#, "is not valid"),
            (r#"{"q": "soon"}"#, "soon"),
            (r#"{"q": 5}"#, "not a JSON object"),
        ] {
            let err = QueueTimeouts::check(bad.into()).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let many: serde_json::Map<String, serde_json::Value> =
            (0..=limits::MAX_QUEUE_JOB_TIMEOUTS).map(|i| (format!("q{i}"), "1s".into())).collect();
        assert!(QueueTimeouts::check(serde_json::Value::Object(many).to_string()).unwrap_err().contains("at most"));
    }

    #[test]
    fn template_check_catches_each_kind_of_drift() {
        let problems = |from: &str, to: &str| {
            assert!(DEFAULT_TOML.contains(from), "{from}");
            super::super::template::problems::<RawRouterConfig>(&DEFAULT_TOML.replacen(from, to, 1))
        };
        assert_eq!(problems("shards = 0 ", "shards = 2 "), ["shards: not the default"]);
        assert_eq!(problems("kbye_grace = \"300s\"", "kbye_grace = \"5m\""), Vec::<String>::new());
        let commented = problems("zmq_hwm = 100000", "# zmq_hwm = 100000");
        assert_eq!(commented, ["zmq_hwm: write a setting commented out if and only if it has no default"]);
        assert_eq!(problems("\nzmq_hwm = 100000", "\n# zmq = 1"), ["zmq_hwm: missing", "zmq: not a setting"]);
        assert_eq!(problems("(EMQ_ZMQ_HWM)", "(EMQ_HWM)"), ["zmq_hwm: comment lacks EMQ_ZMQ_HWM"]);
        let old = problems("text_max_line_bytes = ", "text_max_line = ");
        assert_eq!(old, ["text_max_line_bytes: missing", "text_max_line: deprecated name of text_max_line_bytes"]);
        assert!(problems("\nzmq_hwm", "\nzmq_hwm_x")[0].starts_with("does not parse"));
    }

    #[test]
    fn flags_win_over_env_over_file() {
        let flags = RawRouterConfig { shards: Some(3), ..Default::default() };
        let env = env(&[("EMQ_SHARDS", "2"), ("EMQ_ZMQ_HWM", "5"), ("EMQ_KBYE_GRACE", "1s")]);
        let file = RawRouterConfig { shards: Some(1), zmq_hwm: Some(4), max_queue_len: Some(7), ..Default::default() };
        let c = flags.or(env).or(file).validate().unwrap();
        assert_eq!((c.shards, c.zmq_hwm, c.max_queue_len, c.kbye_grace), (3, 5, 7, Duration::from_secs(1)));
    }

    #[test]
    fn deprecated_text_max_line_still_works_and_loses_to_the_new_name() {
        let file: RawRouterConfig = toml::from_str("text_max_line = 64").unwrap();
        assert_eq!(file.validate().unwrap().text.max_line_bytes, 64);
        let old_env = env(&[("EMQ_TEXT_MAX_LINE", "65")]);
        assert_eq!(old_env.clone().validate().unwrap().text.max_line_bytes, 65);
        let new_env = env(&[("EMQ_TEXT_MAX_LINE", "65"), ("EMQ_TEXT_MAX_LINE_BYTES", "66")]);
        assert_eq!(new_env.validate().unwrap().text.max_line_bytes, 66);
        let flags = RawRouterConfig { text_max_line: Some(67), ..Default::default() };
        let (c, log) = crate::logging::capture("warn", || flags.or(old_env).validate().unwrap());
        assert_eq!(c.text.max_line_bytes, 67, "an old flag beats a variable");
        assert!(log.contains("WARN"), "{log}");
        assert!(log.contains("setting text_max_line (--text-max-line, EMQ_TEXT_MAX_LINE) is deprecated: use text_max_line_bytes (--text-max-line-bytes, EMQ_TEXT_MAX_LINE_BYTES)"), "{log}");
    }

    #[test]
    fn renamed_addresses_keep_their_variables_and_old_flags() {
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            raw: RawRouterConfig,
        }
        let parse = |args: &[&str]| {
            use clap::Parser;
            let raw = Args::try_parse_from([&["emq-router"], args].concat()).unwrap().raw;
            crate::logging::capture("warn", || raw.or(RawRouterConfig::default()).validate().unwrap())
        };
        let (c, log) = parse(&["--frontend-addr", "tcp://127.0.0.1:1", "--text", "off"]);
        assert_eq!((c.frontend_addr.as_str(), c.text_addr), ("tcp://127.0.0.1:1", None));
        assert!(
            log.contains(
                "setting frontend_addr (--frontend-addr) is deprecated: use frontend (--frontend, EMQ_FRONTEND_ADDR)"
            ),
            "{log}"
        );
        let (c, log) = parse(&["--backend", "tcp://127.0.0.1:2"]);
        assert_eq!((c.backend_addr.as_str(), log.as_str()), ("tcp://127.0.0.1:2", ""));
        let c = env(&[("EMQ_ADMIN_ADDR", "tcp://127.0.0.1:3")]).validate().unwrap();
        assert_eq!(c.admin_addr, "tcp://127.0.0.1:3");
    }

    #[test]
    fn a_text_reserve_not_below_the_descriptor_limit_is_refused() {
        let hard = crate::fds::hard_nofile_limit().unwrap();
        let Ok(reserve) = usize::try_from(hard) else { return };
        let raw = RawRouterConfig { text_reserved_fds: Some(reserve), ..Default::default() };
        assert_eq!(
            raw.validate().unwrap_err().to_string(),
            format!(
                "setting text_reserved_fds: {hard} is not below the descriptor limit (RLIMIT_NOFILE, hard) of \
                 {hard}: every text connection would get ERR BUSY too few descriptors left; lower it or raise \
                 the limit (ulimit -n), or turn the text port off (text = \"off\")"
            )
        );
        let raw = RawRouterConfig { text_reserved_fds: Some(reserve - 1), ..Default::default() };
        assert_eq!(raw.validate().unwrap().text.reserved_fds, reserve - 1, "the rest is checked at start");
        let raw = RawRouterConfig { text_reserved_fds: Some(reserve), text: Some("off".into()), ..Default::default() };
        assert_eq!(raw.validate().unwrap().text_addr, None, "no text port: no reserve to check");
    }

    #[test]
    fn bad_values_name_the_setting() {
        let message = |raw: RawRouterConfig| raw.validate().unwrap_err().to_string();
        let raw = RawRouterConfig { heartbeat_timeout: Some("1s".into()), ..Default::default() };
        assert!(message(raw).contains("heartbeat_timeout"));
        let raw = RawRouterConfig { text: Some("nowhere".into()), ..Default::default() };
        assert!(message(raw).starts_with("setting text: \"nowhere\" is not a text address (no :port): "));
        let raw = RawRouterConfig { text_max_line_bytes: Some(0), ..Default::default() };
        assert_eq!(message(raw), "setting text_max_line_bytes: must be at least 1");
        // A zero time that would make its feature unusable: every offer
        // lapsing at once, every partial line cut, a sync loop never sleeping.
        let raw = RawRouterConfig { text_offer_timeout: Some("0s".into()), ..Default::default() };
        assert_eq!(message(raw), "setting text_offer_timeout: must be more than 0");
        let raw = RawRouterConfig { text_line_timeout: Some("0ms".into()), ..Default::default() };
        assert_eq!(message(raw), "setting text_line_timeout: must be more than 0");
        let raw = RawRouterConfig { sync_interval: Some("0s".into()), ..Default::default() };
        assert_eq!(message(raw), "setting sync_interval: must be more than 0");
        // A report period so short that an idle router would keep writing.
        let raw = RawRouterConfig { latency_interval: Some("1ns".into()), ..Default::default() };
        assert_eq!(message(raw), "setting latency_interval: must be 0s (off) or at least 1s");
        let raw = RawRouterConfig { text_max_line: Some(0), ..Default::default() };
        assert_eq!(message(raw), "setting text_max_line_bytes: must be at least 1");
        let raw = RawRouterConfig { text_max_buffered_bytes: Some(0), ..Default::default() };
        assert_eq!(message(raw), "setting text_max_buffered_bytes: must be at least 1");
        let raw = RawRouterConfig { text_max_buffered_bytes: Some(1000), ..Default::default() };
        assert_eq!(
            message(raw),
            "setting text_max_buffered_bytes: must hold two longest lines (one is kept for the oldest waiting \
             line to finish): at least 2 × text_max_line_bytes (2097152)"
        );
        let raw = RawRouterConfig {
            text_max_buffered_bytes: Some(2000),
            text_max_line_bytes: Some(1000),
            text_max_unsent_bytes: Some(2000),
            ..Default::default()
        };
        assert_eq!(raw.validate().unwrap().text.max_buffered_bytes, 2000);
        let c = env(&[("EMQ_TEXT_MAX_BUFFERED_BYTES", "33554432")]).validate().unwrap();
        assert_eq!(c.text.max_buffered_bytes, 32 << 20);
        let raw = RawRouterConfig { shards: Some(limits::MAX_SHARDS + 1), ..Default::default() };
        assert_eq!(message(raw), "setting shards: at most 65535");
        let raw = RawRouterConfig { drain_timeout: Some("10 parsecs".into()), ..Default::default() };
        assert!(message(raw).starts_with("setting drain_timeout: \"10 parsecs\""));
        let vars: HashMap<&str, OsString> = [("EMQ_SHARDS", OsString::from("two"))].into();
        let err = RawRouterConfig::from_env(&|name| vars.get(name).cloned()).unwrap_err().to_string();
        assert!(err.starts_with("setting shards: EMQ_SHARDS=\"two\": "), "{err}");
    }

    #[test]
    fn print_config_shows_what_was_given_with_its_comment() {
        let defaults = super::super::template::resolved(&RawRouterConfig::default(), DEFAULT_TOML).unwrap();
        assert_eq!(defaults, DEFAULT_TOML);
        let raw = env(&[("EMQ_TEXT_MAX_LINE", "64"), ("EMQ_LATENCY_DIR", "/tmp/l")]).or(RawRouterConfig::default());
        let out = super::super::template::resolved(&raw, DEFAULT_TOML).unwrap();
        assert!(out.starts_with("# Resolved: text_max_line_bytes, latency_dir given by"), "{out}");
        assert!(out.contains("\ntext_max_line_bytes = 64 "), "{out}");
        assert!(out.contains("\nlatency_dir = \"/tmp/l\"  "), "{out}");
        let reread: RawRouterConfig = toml::from_str(&out).unwrap();
        assert!(reread.differing_keys(&raw).is_empty());
    }
}
