//! The worker's I/O thread: owns the DEALER, moves frames, keeps the
//! heartbeat, liveness and INFORM timers, and does the READY accounting.
//! Jobs run on the pool threads started here.

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
    /// INFORM sent (msgid, when), no ACK yet.
    Registering { sent_at: Instant },
    /// ACKed: jobs, READY and heartbeats flow.
    Ready,
}

struct Loop {
    p: Parts,
    dealer: Option<zmq::Socket>,
    addr_index: usize,
    epoch: u64,
    state: State,
    busy: usize,
    last_recv: Instant,
    next_heartbeat: Instant,
    drain_deadline: Option<Instant>,
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
        addr_index: 0,
        epoch: 0,
        state: State::Registering { sent_at: now },
        busy: 0,
        last_recv: now,
        next_heartbeat: now,
        drain_deadline: None,
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
                if self.busy == 0 || Instant::now() >= deadline {
                    if self.busy > 0 {
                        tracing::warn!(busy = self.busy, "drain timeout: jobs still running are abandoned");
                    }
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

    fn next_deadline(&self) -> Instant {
        let c = &self.p.config;
        let mut d = match self.state {
            State::Registering { sent_at } => sent_at + c.inform_retry,
            State::Ready if self.drain_deadline.is_none() => {
                self.next_heartbeat.min(self.last_recv + c.silence_timeout())
            }
            State::Ready => self.last_recv + c.silence_timeout(),
        };
        if let Some(dd) = self.drain_deadline {
            d = d.min(dd);
        }
        d
    }

    /// Heartbeat, liveness and registration timers. A missing ACK (after
    /// `inform_retry`) or router silence (after `silence_timeout`) both
    /// reconnect under a new identity to the next address: re-sending INFORM
    /// on the same identity would make an EventMQ router reset its slots
    /// (an EventMQ router would reset its slots), and a new identity also moves on to the failover address.
    fn timers(&mut self) -> Result<(), WorkerError> {
        if self.drain_deadline.is_some() {
            return Ok(());
        }
        let now = Instant::now();
        let (silence, retry, interval) =
            (self.p.config.silence_timeout(), self.p.config.inform_retry, self.p.config.heartbeat_interval);
        match self.state {
            State::Registering { sent_at } if now >= sent_at + retry => {
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

    fn connect(&mut self) -> Result<(), WorkerError> {
        let addr = self.p.config.addresses[self.addr_index % self.p.config.addresses.len()].clone();
        let zerr = |what| ZmqError::at(format!("worker DEALER {what} for {addr}"));
        let socket = self.p.ctx.socket(zmq::DEALER).map_err(zerr("socket"))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(zerr("identity"))?;
        socket.set_linger(limits::RECONNECT_LINGER_MS).map_err(zerr("linger"))?;
        socket.set_sndhwm(limits::ZMQ_HWM).map_err(zerr("sndhwm"))?;
        socket.set_rcvhwm(limits::ZMQ_HWM).map_err(zerr("rcvhwm"))?;
        socket.connect(&addr).map_err(|e| WorkerError::Config(format!("cannot connect to {addr}: {e}")))?;
        tracing::info!(router = %addr, epoch = self.epoch, "connecting");
        self.dealer = Some(socket);
        self.last_recv = Instant::now();
        self.send_inform();
        Ok(())
    }

    fn reconnect(&mut self) -> Result<(), WorkerError> {
        self.dealer = None;
        self.epoch += 1;
        self.addr_index = self.addr_index.wrapping_add(1);
        self.p.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        self.connect()
    }

    fn send_inform(&mut self) {
        let queues = if self.p.config.queues.is_empty() {
            Vec::new()
        } else {
            encode_queue_list(&self.p.config.queues).into_bytes()
        };
        self.send(Command::Inform { queues, peer: PeerType::Worker, name: None });
        self.state = State::Registering { sent_at: Instant::now() };
    }

    fn begin_drain(&mut self) {
        tracing::info!(busy = self.busy, "stopping: KBYE, draining running jobs");
        self.send(Command::Kbye);
        self.drain_deadline = Some(Instant::now() + self.p.config.drain_timeout);
    }

    /// Sends one message; failures are logged and counted (never fatal).
    fn send(&mut self, command: Command) -> bool {
        let Some(dealer) = self.dealer.as_ref() else { return false };
        let frames = Message::new(command).encode();
        match dealer.send_multipart(&frames, zmq::DONTWAIT) {
            Ok(()) => true,
            Err(e) => {
                self.p.counters.send_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, frames = %ShowFrames(&frames), "send failed");
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
                    tracing::warn!(error = %e, frames = %ShowFrames(&frames), "malformed message from router dropped");
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
                tracing::error!(%code, %text, "router refused a message");
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
            tracing::warn!(busy = self.busy, "router sent more jobs than READYs; job waits for a free thread");
        }
        let epoch = self.epoch;
        if self.jobs_tx.send(Dispatch { epoch, job }).is_err() {
            self.busy -= 1;
            tracing::error!("job pool is gone; job dropped");
        }
    }

    fn drain_completions(&mut self) {
        while let Ok(done) = self.done_rx.try_recv() {
            self.handle_completion(done);
        }
    }

    fn handle_completion(&mut self, done: Completion) {
        self.busy = self.busy.saturating_sub(1);
        let c = &self.p.counters;
        let (counter, value) = match &done.result {
            Ok(out) => (&c.succeeded, result_json(out)),
            Err(JobError::Timeout) => (&c.timed_out, result_json(b"TimeoutError")),
            Err(JobError::Failed(text)) => (&c.failed, result_json(text.as_bytes())),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let current = done.epoch == self.epoch && matches!(self.state, State::Ready);
        if done.reply_requested && current {
            let failed = done.result.is_err();
            if self.send(Command::JobReply { result: value, request_msgid: done.msgid, failed }) {
                self.p.counters.replies_sent.fetch_add(1, Ordering::Relaxed);
            }
        } else if done.reply_requested {
            tracing::info!(msgid = %String::from_utf8_lossy(&done.msgid), "result of a job from an earlier connection dropped");
        }
        let may_ready = matches!(self.state, State::Ready) && self.drain_deadline.is_none();
        if may_ready && self.busy < self.p.config.concurrency {
            self.send_ready(1);
        }
    }
}
