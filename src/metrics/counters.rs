//! Broker-wide counters: plain atomics, bumped by whichever thread saw the
//! event, read by STATUS.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Event counts since the broker started.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        impl Counters {
            /// All counters as a JSON object, in declaration order, then
            /// the process's own: `log_write_failures`, log lines (and
            /// other stderr diagnostics) that could not be written and
            /// were dropped ([`crate::logging::write_failures`]: a closed
            /// pipe, a full disk; the router serves on).
            pub fn to_json(&self) -> Value {
                let mut m = serde_json::Map::new();
                $(m.insert(stringify!($name).to_string(), json!(self.$name.load(Ordering::Relaxed)));)*
                m.insert("log_write_failures".to_string(), json!(crate::logging::write_failures()));
                Value::Object(m)
            }
        }
    };
}

counters! {
    /// Undecodable or not-allowed messages on the frontend.
    malformed_frontend,
    /// Undecodable or not-allowed messages on the backend.
    malformed_backend,
    /// Undecodable or not-allowed messages on the admin socket.
    malformed_admin,
    /// Messages from workers that are not registered (not acted on).
    unknown_worker_messages,
    /// DISCONNECTs sent to unregistered workers (READY, HEARTBEAT or job
    /// REPLY from a worker the router does not know): "register again".
    disconnects_to_unknown_workers,
    /// Free slots a worker took back with UNREADY (it moves them to
    /// another router with a backlog, docs/scaleout.md "Slots").
    slots_taken_back,
    /// UNREADYs answered `NO_FREE_SLOT`: every slot the worker announced
    /// was already used by a job on its way to it.
    unready_no_free_slot,
    /// Schedulers registered again on a HEARTBEAT after the router had
    /// forgotten them (expired, or registered with an earlier router).
    readmitted_schedulers,
    /// Registrations of a scheduler under a name it had lost to another
    /// live scheduler: two schedulers share a name (logged as a warning).
    scheduler_name_conflicts,
    /// REQUESTs and SCHEDs accepted (queued or dispatched).
    accepted_jobs,
    /// REQUESTs found in the duplicate window (same client routing identity
    /// and msgid as a REQUEST accepted within `limits::DEDUP_WINDOW`):
    /// answered with the first job's acceptance again, no new job
    /// (docs/failover.md "Duplicates").
    dedup_hits,
    /// Duplicate keys forgotten before their window ended because a shard
    /// held `limits::DEDUP_MAX_KEYS` (oldest first), at run time and when
    /// the window is rebuilt from the log at start.
    dedup_evicted,
    /// Jobs sent to eMQP workers (not text offers: see `text_acked` and the
    /// other `text_` counters).
    dispatched_jobs,
    /// Job-result REPLYs matched to an in-flight job, failed ones included
    /// (the per-queue figures split them into completed and failed).
    completed_jobs,
    /// The failed ones among `completed_jobs` (REPLYs marked `failed`: the
    /// job is retried or goes to the dead set), so `completed_jobs -
    /// failed_results` is the jobs that succeeded.
    failed_results,
    /// Jobs put back to the front of their queue (dead worker, failed send).
    requeued_jobs,
    /// Jobs moved to the dead set, out of retries (`max_retries`,
    /// `retry:N`).
    dead_lettered,
    /// Jobs set back for another try after a back-off (a failed result,
    /// a deadline).
    retried_jobs,
    /// Dead jobs dropped to keep the dead set within `dead_max_jobs` and
    /// `dead_max_bytes` (the oldest first).
    dead_evicted,
    /// REQUESTs and SCHEDs refused because the queue was full.
    rejected_queue_full,
    /// SCHEDs, ASKs and INFORMs refused with `QUEUE_LIMIT`: the broker holds
    /// `max_queues` queues, or (ASK) `text_max_asked_queues` names known
    /// only through ASKs.
    rejected_queue_limit,
    /// eMQP messages refused for their size (`max_message_bytes`).
    rejected_too_big,
    /// Idle queues forgotten (see `queue_idle_grace`).
    queues_reclaimed,
    /// REQUESTs and SCHEDs refused while draining.
    rejected_shutting_down,
    /// REQUESTs and SCHEDs refused with `STORE_FULL`: the job log is out
    /// of space, or free space is below `disk_free_limit`.
    rejected_store_full,
    /// REQUESTs and SCHEDs refused with `STORE_FAILED`: the job log cannot
    /// be written (read-only, I/O errors, its directory gone) or is stalled.
    rejected_store_failed,
    /// Times a shard found its job log stalled: acknowledgements waited
    /// the log's stall bound (`LOG_STALL_TIMEOUT`, 5 s; replicated:
    /// `NATS_STALL_TIMEOUT`, 12 s) without its durable point moving.
    log_stalls,
    /// SCHEDULE/UNSCHEDULE refused because no scheduler is connected.
    rejected_no_scheduler,
    /// REQUESTs refused before admission (a frame past its limit: msgid,
    /// queue name, headers).
    rejected_bad_request,
    /// INFORMs refused (bad queue list, wrong socket for the peer type, too
    /// many schedulers).
    rejected_inform,
    /// Worker INFORMs refused because `max_workers` workers are registered.
    rejected_worker_limit,
    /// Scheduler INFORMs refused because `max_schedulers` are registered.
    rejected_scheduler_limit,
    /// Workers removed after missing heartbeats.
    expired_workers,
    /// Schedulers removed after missing heartbeats.
    expired_schedulers,
    /// ERROR messages from schedulers (a SCHEDULE they refused).
    scheduler_errors,
    /// Answers (acceptance REPLYs, ERRORs, HEARTBEATs, admin answers) that
    /// could not be delivered: the peer is gone or does not read its socket.
    undelivered_answers,
    /// SCHEDULE/UNSCHEDULE refused by the router with the scheduler's rules
    /// (bad frames, body, interval, cron, headers).
    rejected_schedule_invalid,
    /// SCHEDULE/UNSCHEDULE refused because too many answers were pending.
    rejected_schedule_busy,
    /// Scheduler answers (REPLY, ERROR) forwarded to the client that sent
    /// the SCHEDULE/UNSCHEDULE.
    schedule_answers_forwarded,
    /// REPLY/ERROR on the frontend that no client waits for (dropped).
    schedule_answers_unmatched,
    /// SCHEDULE/UNSCHEDULE whose scheduler did not answer in time
    /// (EventMQ's scheduler never does).
    schedule_answers_expired,
    /// Schedule keys whose owner the router forgot to make room
    /// (`MAX_ROUTED_SCHEDULE_KEYS`, least recently routed first).
    schedule_owners_forgotten,
    /// UNSCHEDULEs whose schedule's owner was not connected: answered
    /// `deferred` by the router, delivered when the owner registers.
    schedule_unschedules_deferred,
    /// UNSCHEDULE/DROP messages sent to a scheduler at its registration
    /// (tombstones it had not heard of).
    schedule_tombstones_delivered,
    /// Tombstones forgotten to make room (`MAX_SCHEDULE_TOMBSTONES`,
    /// `MAX_SCHEDULE_TOMBSTONE_BYTES`, oldest first).
    schedule_tombstones_evicted,
    /// Sends that failed (peer gone or pipe full), all kinds.
    send_failures,
    /// Text offers ACKed.
    text_acked,
    /// Text offers declined (DCL).
    text_declined,
    /// Text offers deleted (DEL).
    text_deleted,
    /// Text offers returned because the connection ended.
    text_returned_disconnect,
    /// Text offers returned by the offer timeout.
    text_returned_timeout,
    /// Text offers returned (disconnect, timeout) by a job out of retries,
    /// which went to the dead set instead (also counted in `dead_lettered`).
    text_dead_lettered,
    /// Long-poll ASKs answered `NOPE` because their wait ran out.
    text_ask_waits_expired,
    /// Jobs taken back from their eMQP worker because their deadline passed
    /// (`timeout:N` or `job_timeout`).
    jobs_timed_out,
    /// Job-result REPLYs for jobs already taken back by their deadline
    /// (ignored).
    late_replies,
    /// Answers owed for jobs taken back by their deadline that did not come
    /// within the job's time limit again: the worker gets that queue's
    /// jobs again.
    late_replies_given_up,
    /// Job-result REPLYs from a registered worker that match no job it
    /// holds (ignored): a duplicate, an unknown msgid, the answer to a job
    /// its re-INFORM under the same identity already sent back, or one
    /// that came after `late_replies_given_up` gave up on it (while the
    /// same worker runs that job again, such an answer completes the
    /// new run instead).
    unmatched_replies,
    /// HTTP requests to the metrics server (`/metrics`, the status page),
    /// every request head read, answered 200 or refused.
    http_requests,
    /// HTTP requests refused: 404 (unknown path), 405 (a method but GET
    /// and HEAD: the server is read-only), 413 (a request with a body,
    /// which is never read), 431 (a head over `limits::HTTP_MAX_HEAD_BYTES`),
    /// 400 (a malformed head), 505 (an HTTP version but 1.0 and 1.1),
    /// 401 (no or wrong password, `metrics_basic_auth_file`), 429 (password
    /// checks throttled).
    http_refused,
    /// HTTP connections refused with `503` because `metrics_max_connections`
    /// were open: none since a connection past the limit takes an open
    /// one's slot instead (`http_connections_evicted`); kept at 0 so that
    /// what reads it does not break.
    http_connections_refused,
    /// HTTP connections closed to make room for a new one while
    /// `metrics_max_connections` were open (an answered one, else the one
    /// waiting longest for its request head, else the one longest not
    /// reading its answer, of the address holding the most connections).
    http_connections_evicted,
    /// HTTP connections closed by `metrics_head_timeout` (the request head
    /// did not arrive in time: answered `408`) or `metrics_request_timeout`
    /// (the answer was not read in time).
    http_timed_out,
    /// HTTP requests refused `401` by `metrics_basic_auth_file` because
    /// their credentials were wrong: an unknown user, a wrong password, or
    /// an `Authorization` field that is not well-formed `Basic`. A request
    /// without credentials (a browser's first) is not counted here (it is
    /// in `http_refused`).
    http_auth_failures,
    /// HTTP requests answered `429` without a password check because
    /// failed checks used up `limits::HTTP_AUTH_FAILURE_BUDGET` of the
    /// current second.
    http_auth_throttled,
    /// HTTP requests whose password was taken as right from the cache of
    /// earlier successful checks (no bcrypt run).
    http_auth_cache_hits,
    /// HTTP connections on the TLS listener (`metrics_tls_cert_file`)
    /// closed because TLS failed: a plain-HTTP request (answered a plain
    /// `400`), a client that does not trust the certificate, no client
    /// certificate or one not issued by `metrics_tls_client_ca_file`, a
    /// corrupt record.
    http_tls_failures,
}

impl Counters {
    /// Adds one to `c`.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
