//! The worker's I/O thread: owns the DEALERs (one per owner, i.e. router
//! name: docs/scaleout.md), moves frames, keeps each connection's
//! heartbeat, liveness and INFORM timers, and does the READY accounting
//! across all of them. Jobs run on the pool threads started here.
//!
//! **Slots** (docs/scaleout.md "Slots"). The worker never announces more
//! slots than it has: `busy + Σ credits ≤ concurrency`, where a link's
//! credits are the READYs it announced on its current registration and no
//! job has used yet. A free slot goes, in this order, to a registered
//! owner holding no slot at all, else to the owner holding the fewest
//! among those that handed a job within
//! [`WorkerConfig::slot_move_after`] (*hot*), else to the owner holding
//! the fewest (on a tie, the owner whose job just ended). An owner
//! *wants* a slot when it is hot and used every slot it was given. A
//! slot idle at one owner (no job from it for `slot_move_after`) while
//! another owner wants one or holds none is taken back with
//! UNREADY (each owner keeps one) and, once the router ACKs it, given to
//! that owner; a router that answers `NO_FREE_SLOT` had already sent a
//! job against it. With one owner this is exactly EventMQ's rule: every
//! free slot READY to the one router.

use std::collections::{HashMap, VecDeque};
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

/// A job handed to the pool, tagged with the owner and connection it came
/// in on.
struct Dispatch {
    link: usize,
    epoch: u64,
    job: Job,
}

/// A finished job.
struct Completion {
    link: usize,
    epoch: u64,
    msgid: Frame,
    reply_requested: bool,
    result: Result<Vec<u8>, JobError>,
}

enum State {
    /// INFORM sent (when), no ACK yet; `None` while no router of the
    /// owner's list is connected (`ZMQ_IMMEDIATE` refused the INFORM): it
    /// is tried again every [`limits::WORKER_INFORM_WAIT_POLL`] on the
    /// same identity, which no router has seen yet.
    Registering { sent_at: Option<Instant> },
    /// ACKed: jobs, READY and heartbeats flow.
    Ready,
}

/// One owner (a router name: its owner and standby addresses) and what it
/// holds of this worker's slots.
struct Link {
    /// The owner's addresses, joined by commas.
    addrs: String,
    /// CURVE keys for this owner's addresses.
    curve: Option<crate::curve::ClientCurve>,
    dealer: Option<zmq::Socket>,
    /// With several owners: the DEALER's `DISCONNECTED` events (a PAIR on
    /// its monitor). An owner whose connection drops loses the slots it
    /// held at once, instead of after the silence timeout.
    monitor: Option<zmq::Socket>,
    /// Connection generation: a new identity each time.
    epoch: u64,
    state: State,
    last_recv: Instant,
    next_heartbeat: Instant,
    /// READYs announced on the current registration not yet used by a job.
    credits: usize,
    /// Jobs from this owner running now (any connection generation).
    busy: usize,
    /// When this owner last handed a job, or registered.
    last_job: Instant,
    /// UNREADYs sent and not answered yet: msgid → when. At most
    /// `credits` of them.
    unready: HashMap<Frame, Instant>,
    /// False once an UNREADY went unanswered for
    /// [`limits::WORKER_UNREADY_ANSWER_WAIT`] (a router without the
    /// extension): no more are sent to this owner.
    can_unready: bool,
    /// When the last DISCONNECTs came (at most
    /// [`limits::WORKER_DISCONNECT_HINT_COUNT`]), for the `,`-for-`;` hint.
    disconnects: VecDeque<Instant>,
}

impl Link {
    /// Logs the `,`-for-`;` hint when this owner's list has several
    /// addresses and DISCONNECTs came too often (see
    /// [`limits::WORKER_DISCONNECT_HINT_COUNT`]). Returns whether it did.
    fn hint_if_disconnected_often(&mut self, now: Instant) -> bool {
        self.disconnects.push_back(now);
        while self.disconnects.len() > limits::WORKER_DISCONNECT_HINT_COUNT {
            self.disconnects.pop_front();
        }
        let often = self.disconnects.len() == limits::WORKER_DISCONNECT_HINT_COUNT
            && self
                .disconnects
                .front()
                .is_some_and(|&t| now.saturating_duration_since(t) <= limits::WORKER_DISCONNECT_HINT_WINDOW);
        if often && self.addrs.contains(',') {
            crate::log_limited!(warn, router = %self.addrs, count = limits::WORKER_DISCONNECT_HINT_COUNT,
                within = ?limits::WORKER_DISCONNECT_HINT_WINDOW,
                "told DISCONNECT again and again: if these addresses are different routers (router names), \
                 separate them with ';' (',' lists one router name's owner and standby, and the worker sends \
                 each message to one of them in turn)");
        }
        often
    }

    fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready)
    }

    /// Slots this owner holds: announced and unused, or running its jobs.
    fn holds(&self) -> usize {
        self.credits + self.busy
    }

    /// Whether it handed a job within `window`.
    fn is_hot(&self, now: Instant, window: Duration) -> bool {
        self.is_ready() && now.saturating_duration_since(self.last_job) < window
    }

    /// Whether it used every slot it was given and handed a job lately.
    fn wants(&self, now: Instant, window: Duration) -> bool {
        self.is_hot(now, window) && self.credits == 0
    }
}

struct Loop {
    p: Parts,
    links: Vec<Link>,
    /// Jobs running, all owners together.
    busy: usize,
    drain_deadline: Option<Instant>,
    /// Set when the drain timeout passed with jobs running and the
    /// `on_drain_timeout` hook was called: the end of the wait for them.
    abandon_deadline: Option<Instant>,
    /// Jobs handed to the pool and not finished, by (owner, epoch, msgid):
    /// whether each wants a REPLY (a msgid may be held twice).
    running: HashMap<(usize, u64, Frame), Vec<bool>>,
    jobs_tx: Sender<Dispatch>,
    done_rx: Receiver<Completion>,
}

/// The owners of `config.addresses` (entries joined by commas, split at
/// `;`), each with its share of the CURVE server keys (one per address
/// when there are as many keys as addresses, else the one key for all).
fn owners(config: &WorkerConfig) -> Result<Vec<(String, Option<crate::curve::ClientCurve>)>, WorkerError> {
    let all = config.addresses.join(",");
    let owners = crate::config::addr::emqp_owners(&all).map_err(|e| WorkerError::Config(e.to_string()))?;
    let curves = crate::curve::ClientCurve::per_owner(config.curve.as_ref(), &owners);
    Ok(owners.iter().map(|g| g.join(",")).zip(curves).collect())
}

/// Runs the worker until stopped. Pool threads end when it returns.
pub(crate) fn run(p: Parts) -> Result<(), WorkerError> {
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Dispatch>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Completion>();
    let now = Instant::now();
    let links = owners(&p.config)?
        .into_iter()
        .map(|(addrs, curve)| Link {
            addrs,
            curve,
            dealer: None,
            monitor: None,
            epoch: 0,
            state: State::Registering { sent_at: None },
            last_recv: now,
            next_heartbeat: now,
            credits: 0,
            busy: 0,
            last_job: now,
            unready: HashMap::new(),
            can_unready: true,
            disconnects: VecDeque::new(),
        })
        .collect();
    for i in 0..p.config.concurrency.max(1) {
        let (rx, tx, handler, waker) = (jobs_rx.clone(), done_tx.clone(), p.handler.clone(), p.stopper.clone());
        std::thread::Builder::new()
            .name(format!("emq-worker-job-{i}"))
            .spawn(move || pool_thread(rx, tx, handler, waker))
            .map_err(|e| WorkerError::Config(format!("cannot spawn a pool thread: {e}")))?;
    }
    let mut lp = Loop {
        p,
        links,
        busy: 0,
        drain_deadline: None,
        abandon_deadline: None,
        running: HashMap::new(),
        jobs_tx,
        done_rx,
    };
    for i in 0..lp.links.len() {
        lp.connect(i)?;
    }
    let result = lp.event_loop();
    for link in &mut lp.links {
        if let Some(d) = link.dealer.take() {
            let _ = d.set_linger(limits::WORKER_CLOSE_LINGER_MS);
        }
    }
    result
}

fn pool_thread(rx: Receiver<Dispatch>, tx: Sender<Completion>, handler: Handler, waker: Stopper) {
    for Dispatch { link, epoch, job } in rx {
        let (msgid, reply_requested) = (job.msgid.clone(), job.reply_requested());
        let h = handler.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || h(job)))
            .unwrap_or_else(|_| Err(JobError::Failed("job handler panicked".into())));
        if tx.send(Completion { link, epoch, msgid, reply_requested, result }).is_err() {
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
            for i in 0..self.links.len() {
                self.drain_socket(i)?;
                self.check_disconnect(i)?;
            }
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
        let mut items: Vec<zmq::PollItem> = self
            .links
            .iter()
            .flat_map(|l| l.dealer.iter().chain(l.monitor.iter()))
            .map(|d| d.as_poll_item(zmq::POLLIN))
            .collect();
        items.push(self.p.wake_rx.as_poll_item(zmq::POLLIN));
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
        let hooked = self.p.config.on_drain_timeout.is_some();
        for ((link, epoch, msgid), wants) in std::mem::take(&mut self.running) {
            let current = hooked && self.links.get(link).is_some_and(|l| l.is_ready() && l.epoch == epoch);
            for reply_requested in wants {
                self.p.counters.abandoned.fetch_add(1, Ordering::Relaxed);
                if reply_requested && current {
                    let reply = Command::JobReply { result: text.clone(), request_msgid: msgid.clone(), failed: true };
                    if self.send(link, reply) {
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
        let now = Instant::now();
        let mut next = now + limits::HEARTBEAT_INTERVAL;
        for l in &self.links {
            let at = match l.state {
                State::Registering { sent_at: Some(sent_at) } => sent_at + c.inform_retry,
                State::Registering { sent_at: None } => now + limits::WORKER_INFORM_WAIT_POLL,
                State::Ready => l.next_heartbeat.min(l.last_recv + c.silence_timeout()),
            };
            next = next.min(at);
            if let Some(sent) = l.unready.values().min() {
                next = next.min(*sent + limits::WORKER_UNREADY_ANSWER_WAIT);
            }
        }
        if self.links.len() > 1 {
            // The slot-moving check (`move_slots`).
            next = next.min(now + c.slot_move_after / 4);
        }
        next
    }

    /// Heartbeat, liveness and registration timers of every owner, then
    /// the slot moves. A missing ACK (after `inform_retry`) or router
    /// silence (after `silence_timeout`) both reconnect that owner under a
    /// new identity (to every address of it again): re-sending INFORM on
    /// the same identity would make an EventMQ router reset its slots.
    fn timers(&mut self) -> Result<(), WorkerError> {
        if self.drain_deadline.is_some() {
            return Ok(());
        }
        let (silence, retry, interval) =
            (self.p.config.silence_timeout(), self.p.config.inform_retry, self.p.config.heartbeat_interval);
        for i in 0..self.links.len() {
            let now = Instant::now();
            let l = &self.links[i];
            match l.state {
                State::Registering { sent_at: None } => self.send_inform(i),
                State::Registering { sent_at: Some(sent_at) } if now >= sent_at + retry => {
                    tracing::warn!(router = %l.addrs, ?retry, "no ACK: re-sending INFORM under a new identity");
                    self.reconnect(i)?;
                }
                State::Ready if now >= l.last_recv + silence => {
                    tracing::warn!(router = %l.addrs, ?silence, "router silent: reconnecting under a new identity");
                    self.reconnect(i)?;
                }
                State::Ready if now >= l.next_heartbeat => {
                    self.links[i].next_heartbeat = now + interval;
                    self.send(i, Command::Heartbeat { timestamp: heartbeat_timestamp() });
                }
                _ => {}
            }
            self.unready_timeouts(i, now);
        }
        self.move_slots();
        Ok(())
    }

    /// An UNREADY unanswered for [`limits::WORKER_UNREADY_ANSWER_WAIT`]:
    /// the router does not know the word; its slots stay where they are.
    fn unready_timeouts(&mut self, i: usize, now: Instant) {
        let l = &mut self.links[i];
        if l.unready.values().any(|sent| now >= *sent + limits::WORKER_UNREADY_ANSWER_WAIT) {
            tracing::warn!(router = %l.addrs, "no answer to UNREADY: this router cannot take slots back; not asked again");
            l.unready.clear();
            l.can_unready = false;
        }
    }

    /// A new DEALER for owner `i` under a new identity, connected to every
    /// address of it ([`super::socket::connect_router`]: `ZMQ_IMMEDIATE`
    /// and ZMTP heartbeats), then INFORM: it goes to the router that is up.
    fn connect(&mut self, i: usize) -> Result<(), WorkerError> {
        let l = &self.links[i];
        let addrs = l.addrs.clone();
        let zerr = |what| ZmqError::at(format!("worker DEALER {what} for {addrs}"));
        let socket = self.p.ctx.socket(zmq::DEALER).map_err(zerr("socket"))?;
        socket.set_identity(&crate::protocol::emqp::new_msgid()).map_err(zerr("identity"))?;
        socket.set_linger(limits::RECONNECT_LINGER_MS).map_err(zerr("linger"))?;
        socket.set_sndhwm(limits::ZMQ_HWM).map_err(zerr("sndhwm"))?;
        socket.set_rcvhwm(limits::ZMQ_HWM).map_err(zerr("rcvhwm"))?;
        super::socket::connect_router_curve(&socket, &addrs, l.curve.as_ref())
            .map_err(|e| WorkerError::Config(format!("cannot connect to {addrs}: {e}")))?;
        tracing::info!(router = %addrs, epoch = l.epoch, "connecting");
        let monitor = if self.links.len() > 1 { Some(self.monitor(&socket, &addrs)?) } else { None };
        let l = &mut self.links[i];
        l.dealer = Some(socket);
        l.monitor = monitor;
        l.last_recv = Instant::now();
        self.send_inform(i);
        Ok(())
    }

    /// A PAIR receiving `socket`'s `DISCONNECTED` events.
    fn monitor(&self, socket: &zmq::Socket, addrs: &str) -> Result<zmq::Socket, WorkerError> {
        let endpoint = format!("inproc://emq-worker-monitor-{}", uuid::Uuid::new_v4());
        let zerr = |what| ZmqError::at(format!("worker {what} for {addrs}"));
        socket.monitor(&endpoint, zmq::SocketEvent::DISCONNECTED as i32).map_err(zerr("monitor"))?;
        let pair = self.p.ctx.socket(zmq::PAIR).map_err(zerr("monitor socket"))?;
        pair.set_linger(0).map_err(zerr("monitor linger"))?;
        pair.connect(&endpoint).map_err(zerr("monitor connect"))?;
        Ok(pair)
    }

    /// With several owners, a dropped connection to owner `i` (its router
    /// died or closed it: ZMTP heartbeats or a reset) registers again under
    /// a new identity at once: the slots it held are free for the other
    /// owners now, not after the silence timeout (15 s). Its router, if it
    /// lives, requeues what it had sent on the old identity.
    fn check_disconnect(&mut self, i: usize) -> Result<(), WorkerError> {
        let Some(m) = self.links.get(i).and_then(|l| l.monitor.as_ref()) else { return Ok(()) };
        let mut lost = false;
        while m.recv_multipart(zmq::DONTWAIT).is_ok() {
            lost = true;
        }
        if lost && self.drain_deadline.is_none() {
            tracing::warn!(router = %self.links[i].addrs, "connection to this owner dropped: registering again, its slots freed");
            self.reconnect(i)?;
        }
        Ok(())
    }

    /// Owner `i` again under a new identity: the slots it held on the old
    /// registration are free again (its router forgets them, and requeues
    /// the jobs it had sent: their results are dropped here).
    fn reconnect(&mut self, i: usize) -> Result<(), WorkerError> {
        let l = &mut self.links[i];
        l.dealer = None;
        l.monitor = None;
        l.epoch += 1;
        l.credits = 0;
        l.unready.clear();
        self.p.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        self.connect(i)?;
        self.place_free_slots(None);
        Ok(())
    }

    fn send_inform(&mut self, i: usize) {
        let queues = if self.p.config.queues.is_empty() {
            Vec::new()
        } else {
            encode_queue_list(&self.p.config.queues).into_bytes()
        };
        // Quietly: with `ZMQ_IMMEDIATE` the send fails until a router of
        // the list is connected, which is no error (see `State`).
        let frames = Message::new(Command::Inform { queues, peer: PeerType::Worker, name: None }).encode();
        let l = &mut self.links[i];
        let sent = l.dealer.as_ref().is_some_and(|d| d.send_multipart(&frames, zmq::DONTWAIT).is_ok());
        l.state = State::Registering { sent_at: sent.then(Instant::now) };
    }

    fn begin_drain(&mut self) {
        tracing::info!(busy = self.busy, "stopping: KBYE, draining running jobs");
        for i in 0..self.links.len() {
            self.send(i, Command::Kbye);
        }
        self.drain_deadline = Some(Instant::now() + self.p.config.drain_timeout);
    }

    /// Sends one message to owner `i`; failures are logged and counted
    /// (never fatal).
    fn send(&mut self, i: usize, command: Command) -> bool {
        self.send_frames(i, Message::new(command).encode())
    }

    /// Sends one encoded message, as [`Loop::send`].
    fn send_frames(&mut self, i: usize, frames: Vec<Frame>) -> bool {
        let Some(dealer) = self.links.get(i).and_then(|l| l.dealer.as_ref()) else { return false };
        match dealer.send_multipart(&frames, zmq::DONTWAIT) {
            Ok(()) => true,
            Err(e) => {
                self.p.counters.send_failed.fetch_add(1, Ordering::Relaxed);
                crate::log_limited!(warn, error = %e, frames = %ShowFrames(&frames), "send failed");
                false
            }
        }
    }

    /// Slots neither running a job nor announced to an owner.
    fn free_slots(&self) -> usize {
        let credits: usize = self.links.iter().map(|l| l.credits).sum();
        self.p.config.concurrency.saturating_sub(self.busy + credits)
    }

    /// Announces every free slot (READY) to the owner the rule of the
    /// module docs picks; `ended` is the owner whose job just ended.
    fn place_free_slots(&mut self, ended: Option<usize>) {
        if self.drain_deadline.is_some() {
            return;
        }
        let window = self.p.config.slot_move_after;
        for _ in 0..self.free_slots() {
            let now = Instant::now();
            let ready = || self.links.iter().enumerate().filter(|(_, l)| l.is_ready());
            // The fewest slots held; on a tie the owner whose job ended.
            let fewest = |it: &mut dyn Iterator<Item = (usize, &Link)>| {
                it.min_by_key(|(i, l)| (l.holds(), Some(*i) != ended)).map(|(i, _)| i)
            };
            let slotless = ready().find(|(_, l)| l.holds() == 0).map(|(i, _)| i);
            let hot = fewest(&mut ready().filter(|(_, l)| l.is_hot(now, window)));
            let Some(target) = slotless.or(hot).or_else(|| fewest(&mut ready())) else {
                return;
            };
            if !self.send(target, Command::Ready) {
                return;
            }
            self.p.counters.ready_sent.fetch_add(1, Ordering::Relaxed);
            self.links[target].credits += 1;
        }
    }

    /// Takes back (UNREADY) the slots idle for `slot_move_after` at owners
    /// that keep more than one, while another owner holds none or wants
    /// one. Answers come as ACK (taken: the slot is placed again) or
    /// `ERROR NO_FREE_SLOT` (a job used it).
    fn move_slots(&mut self) {
        if self.links.len() < 2 || self.drain_deadline.is_some() {
            return;
        }
        let (now, window) = (Instant::now(), self.p.config.slot_move_after);
        let needy = self.links.iter().any(|l| l.is_ready() && (l.holds() == 0 || l.wants(now, window)));
        if !needy {
            return;
        }
        for i in 0..self.links.len() {
            let l = &self.links[i];
            let idle = now.saturating_duration_since(l.last_job) >= window;
            if !(l.is_ready() && l.can_unready && idle && l.credits > 0) {
                continue;
            }
            // Every owner keeps one slot, so that work arriving there is seen.
            let keep = usize::from(l.busy == 0);
            let spare = l.credits.saturating_sub(keep).saturating_sub(l.unready.len());
            for _ in 0..spare {
                let msg = Message::new(Command::Unready);
                let id = msg.msgid.clone();
                if !self.send_frames(i, msg.encode()) {
                    break;
                }
                self.links[i].unready.insert(id, now);
            }
        }
    }

    fn drain_socket(&mut self, i: usize) -> Result<(), WorkerError> {
        for _ in 0..limits::BATCH {
            let Some(dealer) = self.links.get(i).and_then(|l| l.dealer.as_ref()) else { return Ok(()) };
            let frames = match dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => return Ok(()),
                Err(source) => return Err(ZmqError::new("worker recv", source).into()),
            };
            self.links[i].last_recv = Instant::now();
            match decode(&frames, Socket::WorkerSide) {
                Ok(msg) => self.handle(i, msg)?,
                Err(e) => {
                    self.p.counters.malformed.fetch_add(1, Ordering::Relaxed);
                    crate::log_limited!(warn, error = %e, frames = %ShowFrames(&frames), "malformed message from router dropped");
                }
            }
        }
        Ok(())
    }

    fn handle(&mut self, i: usize, msg: Message) -> Result<(), WorkerError> {
        match msg.command {
            Command::Ack { acked } if self.links[i].unready.remove(&acked).is_some() => {
                let l = &mut self.links[i];
                l.credits = l.credits.saturating_sub(1);
                self.p.counters.slots_moved.fetch_add(1, Ordering::Relaxed);
                self.place_free_slots(None);
            }
            Command::Ack { .. } => self.handle_ack(i),
            Command::Request { queue, headers, body, extra } => {
                self.handle_request(i, Job { msgid: msg.msgid, queue, headers, body, extra })
            }
            Command::Kbye if self.drain_deadline.is_none() => {
                tracing::info!(router = %self.links[i].addrs, "router sent KBYE: reconnecting");
                return self.reconnect(i);
            }
            Command::Disconnect if self.drain_deadline.is_none() => {
                tracing::info!(router = %self.links[i].addrs,
                    "router sent DISCONNECT (it does not know this worker): registering again");
                self.links[i].hint_if_disconnected_often(Instant::now());
                return self.reconnect(i);
            }
            Command::Error { refers_to, .. } if self.links[i].unready.remove(&refers_to).is_some() => {
                // NO_FREE_SLOT: the job that used the slot came first.
            }
            Command::Error { code, text, .. } => {
                let (code, text) = (String::from_utf8_lossy(&code), String::from_utf8_lossy(&text));
                crate::log_limited!(error, %code, %text, "router refused a message");
            }
            _ => {}
        }
        Ok(())
    }

    fn handle_ack(&mut self, i: usize) {
        let free = self.free_slots();
        let l = &mut self.links[i];
        if let State::Registering { .. } = l.state {
            l.state = State::Ready;
            l.next_heartbeat = Instant::now() + self.p.config.heartbeat_interval;
            l.last_job = Instant::now();
            tracing::info!(router = %l.addrs, epoch = l.epoch, free, busy = self.busy, "registered: announcing free slots");
            self.place_free_slots(Some(i));
        }
    }

    fn handle_request(&mut self, i: usize, job: Job) {
        let l = &mut self.links[i];
        if l.credits == 0 {
            self.p.counters.over_limit.fetch_add(1, Ordering::Relaxed);
            crate::log_limited!(warn, busy = self.busy, router = %l.addrs,
                "router sent more jobs than READYs; job waits for a free thread");
        }
        l.credits = l.credits.saturating_sub(1);
        l.busy += 1;
        l.last_job = Instant::now();
        self.busy += 1;
        self.p.counters.peak_busy.fetch_max(self.busy as u64, Ordering::Relaxed);
        let epoch = l.epoch;
        let key = (i, epoch, job.msgid.clone());
        let reply_requested = job.reply_requested();
        if self.jobs_tx.send(Dispatch { link: i, epoch, job }).is_err() {
            self.busy -= 1;
            self.links[i].busy -= 1;
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
        if let Some(l) = self.links.get_mut(done.link) {
            l.busy = l.busy.saturating_sub(1);
        }
        let key = (done.link, done.epoch, done.msgid);
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
        let (link, epoch, msgid) = key;
        let c = &self.p.counters;
        let counter = match &done.result {
            Ok(_) => &c.succeeded,
            Err(JobError::Timeout) => &c.timed_out,
            Err(JobError::Failed(_)) => &c.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let current = self.links.get(link).is_some_and(|l| l.epoch == epoch && l.is_ready());
        if done.reply_requested && current {
            let max = self.p.config.max_reply_bytes.max(limits::WORKER_MIN_REPLY_BYTES);
            let (frames, oversized) = job_reply(msgid.clone(), &done.result, max);
            if oversized {
                self.p.counters.oversized_results.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(msgid = %String::from_utf8_lossy(&msgid), max,
                    "job result too big for a REPLY (max_reply_bytes): reported failed instead");
            }
            if self.send_frames(link, frames) {
                self.p.counters.replies_sent.fetch_add(1, Ordering::Relaxed);
            }
        } else if done.reply_requested {
            tracing::info!(msgid = %String::from_utf8_lossy(&msgid), "result of a job from an earlier connection dropped");
        }
        self.place_free_slots(Some(link));
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
