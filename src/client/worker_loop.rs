//! The worker's I/O thread: owns the DEALER, moves frames, keeps the
//! heartbeat, liveness and INFORM timers, and does the READY accounting.
//! Jobs run on the pool threads started here.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::body::result_json;
use super::worker_types::{Counters, Handler, Job, JobError, Stopper, WorkerConfig, WorkerError};
use crate::limits;
use crate::protocol::emqp::{decode, heartbeat_timestamp, Command, Frame, Message, PeerType, ShowFrames, Socket};
use crate::protocol::queues::encode_queue_list;
use crate::zmq_error::ZmqError;

/// What the I/O thread is given.
pub(crate) struct Parts {
    pub ctx: zmq::Context,
    pub config: WorkerConfig,
    pub handler: Handler,
    pub wake_rx: zmq::Socket,
    pub stopper: Stopper,
    pub counters: Arc<Counters>,
}

/// A job handed to the pool, tagged with the connection it came in on.
struct Dispatch {
    epoch: u64,
    job: Job,
}

/// A finished job.
struct Completion {
    epoch: u64,
    msgid: Frame,
    reply_requested: bool,
    result: Result<Vec<u8>, JobError>,
}

enum State {
    /// INFORM sent (when), no ACK yet; `None` while no router of the
    /// list is connected (`ZMQ_IMMEDIATE` refused the INFORM): it is tried
    /// again every [`limits::WORKER_INFORM_WAIT_POLL`] on the same
    /// identity, which no router has seen yet.
    Registering { sent_at: Option<Instant> },
    /// ACKed: jobs, READY and heartbeats flow.
    Ready,
}

struct Loop {
    p: Parts,
    dealer: Option<zmq::Socket>,
    epoch: u64,
    state: State,
    busy: usize,
    last_recv: Instant,
    next_heartbeat: Instant,
    drain_deadline: Option<Instant>,
    /// Set when the drain timeout passed with jobs running and the
    /// `on_drain_timeout` hook was called: the end of the wait for them.
    abandon_deadline: Option<Instant>,
    /// Jobs handed to the pool and not finished, by (epoch, msgid): whether
    /// each wants a REPLY (a msgid may be held twice).
    running: HashMap<(u64, Frame), Vec<bool>>,
    jobs_tx: Sender<Dispatch>,
    done_rx: Receiver<Completion>,
}

/// Runs the worker until stopped. Pool threads end when it returns.
pub(crate) fn run(p: Parts) -> Result<(), WorkerError> {
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Dispatch>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Completion>();
    for i in 0..p.config.concurrency.max(1) {
        let (rx, tx, handler, waker) = (jobs_rx.clone(), done_tx.clone(), p.handler.clone(), p.stopper.clone());
        std::thread::Builder::new()
            .name(format!("emq-worker-job-{i}"))
            .spawn(move || pool_thread(rx, tx, handler, waker))
            .map_err(|e| WorkerError::Config(format!("cannot spawn a pool thread: {e}")))?;
    }
    let now = Instant::now();
    let mut lp = Loop {
        p,
        dealer: None,
        epoch: 0,
        state: State::Registering { sent_at: None },
        busy: 0,
        last_recv: now,
        next_heartbeat: now,
        drain_deadline: None,
        abandon_deadline: None,
        running: HashMap::new(),
        jobs_tx,
        done_rx,
    };
    lp.connect()?;
    let result = lp.event_loop();
    if let Some(d) = lp.dealer.take() {
        let _ = d.set_linger(limits::WORKER_CLOSE_LINGER_MS);
    }
    result
}

fn pool_thread(rx: Receiver<Dispatch>, tx: Sender<Completion>, handler: Handler, waker: Stopper) {
    for Dispatch { epoch, job } in rx {
        let (msgid, reply_requested) = (job.msgid.clone(), job.reply_requested());
        let h = handler.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || h(job)))
            .unwrap_or_else(|_| Err(JobError::Failed("job handler panicked".into())));
        if tx.send(Completion { epoch, msgid, reply_requested, result }).is_err() {
            return;
        }
        waker.waker.wake();
    }
}

impl Loop {
    fn event_loop(&mut self) -> Result<(), WorkerError> {
        loop {
            let timeout = self.next_deadline().saturating_duration_since(Instant::now());
            self.poll(timeout)?;
            self.drain_completions();
            self.drain_socket()?;
            if self.p.stopper.stop.load(Ordering::SeqCst) && self.drain_deadline.is_none() {
                self.begin_drain();
            }
            if let Some(deadline) = self.drain_deadline {
                if self.busy == 0 {
                    return Ok(());
                }
                if self.drain_timed_out(deadline) {
                    self.abandon_running();
                    return Ok(());
                }
            }
            self.timers()?;
        }
    }

    fn poll(&mut self, timeout: Duration) -> Result<(), WorkerError> {
        let dealer = self.dealer.as_ref().ok_or(WorkerError::Config("no socket".into()))?;
        let mut items = [dealer.as_poll_item(zmq::POLLIN), self.p.wake_rx.as_poll_item(zmq::POLLIN)];
        zmq::poll(&mut items, timeout.as_millis().min(i64::MAX as u128) as i64).map_err(ZmqError::at("worker poll"))?;
        while self.p.wake_rx.recv_bytes(zmq::DONTWAIT).is_ok() {}
        Ok(())
    }

    /// Past the drain deadline with jobs running: calls the
    /// `on_drain_timeout` hook once and waits `abandon_wait` more for the
    /// jobs it stops. True when the worker should now give up on them.
    fn drain_timed_out(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now < deadline {
            return false;
        }
        if let Some(end) = self.abandon_deadline {
            return now >= end;
        }
        let Some(hook) = self.p.config.on_drain_timeout.clone() else { return true };
        tracing::warn!(busy = self.busy, "drain timeout: stopping the jobs still running");
        (hook.0)();
        self.abandon_deadline = Some(now + self.p.config.abandon_wait);
        false
    }

    /// Reports every job still running failed (a failed REPLY, so that the
    /// router retries it at once instead of holding it for `kbye_grace`),
    /// when an `on_drain_timeout` hook stopped them. Without a hook the
    /// handlers may still run, and a failed REPLY would have the router run
    /// the job again beside them: nothing is sent, and the router holds the
    /// jobs for its `kbye_grace` as before. The worker closes next; the
    /// jobs' own results, if they ever come, are not sent.
    fn abandon_running(&mut self) {
        tracing::warn!(busy = self.busy, "drain timeout: jobs still running are abandoned");
        let text = result_json(b"worker stopped: job abandoned at its drain timeout");
        let current = matches!(self.state, State::Ready) && self.p.config.on_drain_timeout.is_some();
        for ((epoch, msgid), wants) in std::mem::take(&mut self.running) {
            for reply_requested in wants {
                self.p.counters.abandoned.fetch_add(1, Ordering::Relaxed);
                if reply_requested && current && epoch == self.epoch {
                    let reply = Command::JobReply { result: text.clone(), request_msgid: msgid.clone(), failed: true };
                    if self.send(reply) {
                        self.p.counters.replies_sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    fn next_deadline(&self) -> Instant {
        if let Some(drain) = self.drain_deadline {
            // No timers while draining (see `timers`): only the drain's own.
            return self.abandon_deadline.unwrap_or(drain);
        }
        let c = &self.p.config;
        match self.state {
            State::Registering { sent_at: Some(sent_at) } => sent_at + c.inform_retry,
            State::Registering { sent_at: None } => Instant::now() + limits::WORKER_INFORM_WAIT_POLL,
            State::Ready => self.next_heartbeat.min(self.last_recv + c.silence_timeout()),
        }
    }

    /// Heartbeat, liveness and registration timers. A missing ACK (after
    /// `inform_retry`) or router silence (after `silence_timeout`) both
    /// reconnect under a new identity (to every address again): re-sending
    /// INFORM on the same identity would make an EventMQ router reset its
    /// slots.
    fn timers(&mut self) -> Result<(), WorkerError> {
        if self.drain_deadline.is_some() {
            return Ok(());
        }
        let now = Instant::now();
        let (silence, retry, interval) =
            (self.p.config.silence_timeout(), self.p.config.inform_retry, self.p.config.heartbeat_interval);
        match self.state {
            State::Registering { sent_at: None } => self.send_inform(),
            State::Registering { sent_at: Some(sent_at) } if now >= sent_at + retry => {
                tracing::warn!(?retry, "no ACK: re-sending INFORM under a new identity");
                self.reconnect()?;
            }
            State::Ready if now >= self.last_recv + silence => {
                tracing::warn!(?silence, "router silent: reconnecting under a new identity");
                self.reconnect()?;
            }
            State::Ready if now >= self.next_heartbeat => {
                self.next_heartbeat = now + interval;
                self.send(Command::Heartbeat { timestamp: heartbeat_timestamp() });
            }
            _ => {}
        }
        Ok(())
    }

    /// A new DEALER under a new identity, connected to every address of
    /// the list ([`super::socket::connect_router`]: `ZMQ_IMMEDIATE` and
    /// ZMTP heartbeats), then INFORM: it goes to the router that is up.
    fn connect(&mut self) -> Result<(), WorkerError> {
        let addrs = self.p.config.addresses.join(",");
        let zerr = |what| ZmqError::at(format!("worker DEALER {what} for {addrs}"));
        let socket = self.p.ctx.socket(zmq::DEALER).map_err(zerr("socket"))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(zerr("identity"))?;
        socket.set_linger(limits::RECONNECT_LINGER_MS).map_err(zerr("linger"))?;
        socket.set_sndhwm(limits::ZMQ_HWM).map_err(zerr("sndhwm"))?;
        socket.set_rcvhwm(limits::ZMQ_HWM).map_err(zerr("rcvhwm"))?;
        super::socket::connect_router_curve(&socket, &addrs, self.p.config.curve.as_ref())
            .map_err(|e| WorkerError::Config(format!("cannot connect to {addrs}: {e}")))?;
        tracing::info!(router = %addrs, epoch = self.epoch, "connecting");
        self.dealer = Some(socket);
        self.last_recv = Instant::now();
        self.send_inform();
        Ok(())
    }

    fn reconnect(&mut self) -> Result<(), WorkerError> {
        self.dealer = None;
        self.epoch += 1;
        self.p.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        self.connect()
    }

    fn send_inform(&mut self) {
        let queues = if self.p.config.queues.is_empty() {
            Vec::new()
        } else {
            encode_queue_list(&self.p.config.queues).into_bytes()
        };
        // Quietly: with `ZMQ_IMMEDIATE` the send fails until a router of
        // the list is connected, which is no error (see `State`).
        let frames = Message::new(Command::Inform { queues, peer: PeerType::Worker, name: None }).encode();
        let sent = self.dealer.as_ref().is_some_and(|d| d.send_multipart(&frames, zmq::DONTWAIT).is_ok());
        self.state = State::Registering { sent_at: sent.then(Instant::now) };
    }

    fn begin_drain(&mut self) {
        tracing::info!(busy = self.busy, "stopping: KBYE, draining running jobs");
        self.send(Command::Kbye);
        self.drain_deadline = Some(Instant::now() + self.p.config.drain_timeout);
    }

    /// Sends one message; failures are logged and counted (never fatal).
    fn send(&mut self, command: Command) -> bool {
        self.send_frames(Message::new(command).encode())
    }

    /// Sends one encoded message, as [`Loop::send`].
    fn send_frames(&mut self, frames: Vec<Frame>) -> bool {
        let Some(dealer) = self.dealer.as_ref() else { return false };
        match dealer.send_multipart(&frames, zmq::DONTWAIT) {
            Ok(()) => true,
            Err(e) => {
                self.p.counters.send_failed.fetch_add(1, Ordering::Relaxed);
                crate::log_limited!(warn, error = %e, frames = %ShowFrames(&frames), "send failed");
                false
            }
        }
    }

    fn send_ready(&mut self, n: usize) {
        for _ in 0..n {
            if self.send(Command::Ready) {
                self.p.counters.ready_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn free_slots(&self) -> usize {
        self.p.config.concurrency.saturating_sub(self.busy)
    }

    fn drain_socket(&mut self) -> Result<(), WorkerError> {
        for _ in 0..limits::BATCH {
            let Some(dealer) = self.dealer.as_ref() else { return Ok(()) };
            let frames = match dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => return Ok(()),
                Err(source) => return Err(ZmqError::new("worker recv", source).into()),
            };
            self.last_recv = Instant::now();
            match decode(&frames, Socket::WorkerSide) {
                Ok(msg) => self.handle(msg)?,
                Err(e) => {
                    self.p.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    crate::log_limited!(warn, error = %e, frames = %ShowFrames(&frames), "malformed message from router dropped");
                }
            }
        }
        Ok(())
    }

    fn handle(&mut self, msg: Message) -> Result<(), WorkerError> {
        match msg.command {
            Command::Ack { .. } => self.handle_ack(),
            Command::Request { queue, headers, body, extra } => {
                self.handle_request(Job { msgid: msg.msgid, queue, headers, body, extra })
            }
            Command::Kbye if self.drain_deadline.is_none() => {
                tracing::info!("router sent KBYE: reconnecting");
                return self.reconnect();
            }
            Command::Disconnect if self.drain_deadline.is_none() => {
                tracing::info!("router sent DISCONNECT (it does not know this worker): registering again");
                return self.reconnect();
            }
            Command::Error { code, text, .. } => {
                let (code, text) = (String::from_utf8_lossy(&code), String::from_utf8_lossy(&text));
                crate::log_limited!(error, %code, %text, "router refused a message");
            }
            _ => {}
        }
        Ok(())
    }

    fn handle_ack(&mut self) {
        if let State::Registering { .. } = self.state {
            self.state = State::Ready;
            self.next_heartbeat = Instant::now() + self.p.config.heartbeat_interval;
            let free = if self.drain_deadline.is_some() { 0 } else { self.free_slots() };
            tracing::info!(epoch = self.epoch, free, busy = self.busy, "registered: announcing free slots");
            self.send_ready(free);
        }
    }

    fn handle_request(&mut self, job: Job) {
        self.busy += 1;
        if self.busy > self.p.config.concurrency {
            crate::log_limited!(
                warn,
                busy = self.busy,
                "router sent more jobs than READYs; job waits for a free thread"
            );
        }
        let epoch = self.epoch;
        let key = (epoch, job.msgid.clone());
        let reply_requested = job.reply_requested();
        if self.jobs_tx.send(Dispatch { epoch, job }).is_err() {
            self.busy -= 1;
            tracing::error!("job pool is gone; job dropped");
            return;
        }
        self.running.entry(key).or_default().push(reply_requested);
    }

    fn drain_completions(&mut self) {
        while let Ok(done) = self.done_rx.try_recv() {
            self.handle_completion(done);
        }
    }

    fn handle_completion(&mut self, done: Completion) {
        self.busy = self.busy.saturating_sub(1);
        let key = (done.epoch, done.msgid);
        if let Some(wants) = self.running.get_mut(&key) {
            // The run that ended: one whose reply wish matches (the same
            // msgid may be held twice).
            let at = wants.iter().position(|&w| w == done.reply_requested).unwrap_or(0);
            if at < wants.len() {
                wants.remove(at);
            }
            if wants.is_empty() {
                self.running.remove(&key);
            }
        }
        let (epoch, msgid) = key;
        let c = &self.p.counters;
        let counter = match &done.result {
            Ok(_) => &c.succeeded,
            Err(JobError::Timeout) => &c.timed_out,
            Err(JobError::Failed(_)) => &c.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let current = epoch == self.epoch && matches!(self.state, State::Ready);
        if done.reply_requested && current {
            let max = self.p.config.max_reply_bytes.max(limits::WORKER_MIN_REPLY_BYTES);
            let (frames, oversized) = job_reply(msgid.clone(), &done.result, max);
            if oversized {
                self.p.counters.oversized_results.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(msgid = %String::from_utf8_lossy(&msgid), max,
                    "job result too big for a REPLY (max_reply_bytes): reported failed instead");
            }
            if self.send_frames(frames) {
                self.p.counters.replies_sent.fetch_add(1, Ordering::Relaxed);
            }
        } else if done.reply_requested {
            tracing::info!(msgid = %String::from_utf8_lossy(&msgid), "result of a job from an earlier connection dropped");
        }
        let may_ready = matches!(self.state, State::Ready) && self.drain_deadline.is_none();
        if may_ready && self.busy < self.p.config.concurrency {
            self.send_ready(1);
        }
    }
}

/// The job-result REPLY of a finished job, encoded, and whether its result
/// was replaced: a REPLY over `max_bytes` (all frames) would be refused by
/// the router, so it becomes a failed REPLY whose result names the limit.
fn job_reply(request_msgid: Frame, result: &Result<Vec<u8>, JobError>, max_bytes: usize) -> (Vec<Frame>, bool) {
    let value = match result {
        Ok(out) => result_json(out),
        Err(JobError::Timeout) => result_json(b"TimeoutError"),
        Err(JobError::Failed(text)) => result_json(text.as_bytes()),
    };
    let failed = result.is_err();
    let frames =
        Message::new(Command::JobReply { result: value, request_msgid: request_msgid.clone(), failed }).encode();
    let size: usize = frames.iter().map(Vec::len).sum();
    if size <= max_bytes {
        return (frames, false);
    }
    let text = format!("job result too big: its REPLY would be {size} bytes, over the worker's limit of {max_bytes}");
    let reply = Command::JobReply { result: result_json(text.as_bytes()), request_msgid, failed: true };
    (Message::new(reply).encode(), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::emqp::FAILED;

    fn frames_size(frames: &[Frame]) -> usize {
        frames.iter().map(Vec::len).sum()
    }

    #[test]
    fn a_reply_over_the_limit_becomes_a_failed_reply_naming_it() {
        let id = b"job-1".to_vec();
        // Small results are sent as they are, failed or not.
        let (frames, oversized) = job_reply(id.clone(), &Ok(b"hi".to_vec()), limits::WORKER_MAX_REPLY_BYTES);
        assert!(!oversized);
        assert_eq!(&frames[4..], [br#"{"value": "hi"}"#.to_vec(), id.clone()]);
        let (frames, oversized) = job_reply(id.clone(), &Err(JobError::Timeout), limits::WORKER_MAX_REPLY_BYTES);
        assert!(!oversized);
        assert_eq!(&frames[4..], [br#"{"value": "TimeoutError"}"#.to_vec(), id.clone(), FAILED.to_vec()]);

        // 3 MiB of control bytes: 18 MiB once escaped (`\u0001`), over the
        // router's default 16 MiB message limit.
        let out = vec![1u8; 3 << 20];
        assert_eq!(result_json(&out).len(), 6 * (3 << 20) + 13);
        let (frames, oversized) = job_reply(id.clone(), &Ok(out), limits::WORKER_MAX_REPLY_BYTES);
        assert!(oversized);
        let size = "eMQP/1.0REPLY".len() + 36 + 6 * (3 << 20) + 13 + "job-1".len();
        let text = format!(
            r#"{{"value": "job result too big: its REPLY would be {size} bytes, over the worker's limit of {}"}}"#,
            limits::WORKER_MAX_REPLY_BYTES
        );
        assert_eq!(&frames[4..], [text.into_bytes(), id.clone(), FAILED.to_vec()]);
        assert!(frames_size(&frames) < 200);

        // Exactly at the limit is sent; one byte over is not.
        let (frames, _) = job_reply(id.clone(), &Ok(b"abc".to_vec()), usize::MAX);
        let exact = frames_size(&frames);
        assert!(!job_reply(id.clone(), &Ok(b"abc".to_vec()), exact).1);
        assert!(job_reply(id, &Ok(b"abc".to_vec()), exact - 1).1);
    }
}
