//! [`Releaser`]: where a shard's promised output waits for its job log.
//! A batch whose acceptances wait for a ticket ([`Ticket`]) is handed over
//! with it; the releaser asks the log to make the ticket durable
//! ([`Durable::make_durable`]) and only then runs the release (hands the
//! frames to the I/O thread, the answers to their text ports). Releases
//! run in the order they were handed over.
//!
//! * [`Releaser::thread`] (`durability = "sync"` with `wal_sync_thread`):
//!   a thread of the shard's own (`emq-sync-<n>`) syncs and releases while
//!   the shard serves its next batch; releases that pile up while a sync
//!   runs share the next one (group commit across batches).
//! * [`Releaser::inline`] (everything else): the shard's own thread asks
//!   the log at the end of the batch (`sync` without the thread: it syncs
//!   there; `async`: written is durable; `memory`: always).
//!
//! While the log is faulty nothing is released: the releases wait (the
//! thread sleeps on [`Durable::wait`]; inline ones are asked again at every
//! batch end) until a repair makes their tickets durable, or until the log
//! gives up on them ([`Durable::gave_up`], the replicated log): a release
//! then runs with the refusal, and what it promised is refused instead. Dropping the
//! releaser at shutdown runs what has become durable and drops the rest,
//! with a log line: those acknowledgements were never earned.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::joblog::{Durable, StoreFault, Ticket};
use crate::limits;

/// A batch's promised output, run once the log holds its ticket (`None`),
/// or refused with the log's fault once it gave up on it (`Some`).
pub type Release = Box<dyn FnOnce(Option<StoreFault>) + Send>;

/// How long a release waits on a faulty log before it asks again.
const FAULT_WAIT: Duration = Duration::from_millis(100);

/// One release and what it waits for (`None`: only the releases before it).
struct Item {
    ticket: Option<Ticket>,
    release: Release,
}

/// A shard's releaser (see the module docs).
pub enum Releaser {
    /// On a thread of its own.
    Thread(ReleaseThread),
    /// On the shard's thread.
    Inline(Inline),
}

impl Releaser {
    /// Releases on a thread of its own, `emq-sync-<shard>`, waiting on `durable`.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub fn thread(shard: usize, durable: Arc<dyn Durable>) -> std::io::Result<Releaser> {
        ReleaseThread::start(shard, durable).map(Releaser::Thread)
    }

    /// Releases on the caller's thread, waiting on `durable`.
    pub fn inline(durable: Arc<dyn Durable>) -> Releaser {
        Releaser::Inline(Inline { durable, pending: VecDeque::new() })
    }

    /// Runs `release` once the log holds `ticket` (and every release
    /// handed over before it has run).
    pub fn submit(&mut self, ticket: Option<Ticket>, release: Release) {
        match self {
            Releaser::Thread(t) => t.submit(Item { ticket, release }),
            Releaser::Inline(i) => {
                i.pending.push_back(Item { ticket, release });
                i.poll();
            }
        }
    }

    /// Runs the inline releases whose tickets are durable now.
    pub fn poll(&mut self) {
        if let Releaser::Inline(i) = self {
            i.poll();
        }
    }
}

/// Releases run on the shard's thread.
pub struct Inline {
    durable: Arc<dyn Durable>,
    pending: VecDeque<Item>,
}

impl Inline {
    fn poll(&mut self) {
        while let Some(item) = self.pending.front() {
            let mut refusal = None;
            if let Some(t) = item.ticket {
                if !self.durable.make_durable(t) {
                    refusal = self.durable.gave_up(t);
                    if refusal.is_none() {
                        return;
                    }
                }
            }
            if let Some(item) = self.pending.pop_front() {
                (item.release)(refusal);
            }
        }
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        self.poll();
        if !self.pending.is_empty() {
            let batches = self.pending.len();
            tracing::error!(batches, "acknowledgements dropped at shutdown: the job log never held their jobs");
        }
    }
}

/// A shard's release thread. Dropping it lets the thread finish what is
/// durable, then joins it.
pub struct ReleaseThread {
    tx: Option<Sender<Item>>,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl ReleaseThread {
    fn start(shard: usize, durable: Arc<dyn Durable>) -> std::io::Result<ReleaseThread> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let join =
            std::thread::Builder::new().name(format!("emq-sync-{shard}")).spawn(move || run(rx, durable, stopping))?;
        Ok(ReleaseThread { tx: Some(tx), stop, join: Some(join) })
    }

    fn submit(&self, item: Item) {
        if let Some(tx) = &self.tx {
            if let Err(e) = tx.send(item) {
                // Only at teardown: the thread is gone.
                drop(e);
                tracing::error!("release thread gone: a batch's acknowledgements dropped");
            }
        }
    }
}

impl Drop for ReleaseThread {
    fn drop(&mut self) {
        drop(self.tx.take());
        self.stop.store(true, Ordering::Release);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn run(rx: Receiver<Item>, durable: Arc<dyn Durable>, stop: Arc<AtomicBool>) {
    while let Ok(first) = rx.recv() {
        let mut items = vec![first];
        items.extend(rx.try_iter().take(limits::BATCH));
        // Each in order, as soon as its own ticket is durable: a local log
        // syncs everything written at the first ask, so the rest are
        // durable then too; a replicated log confirms batches one by one,
        // and an acceptance need not wait for a later batch's PubAck.
        let mut items = items.into_iter();
        while let Some(item) = items.next() {
            let outcome = item.ticket.map_or(Outcome::Durable, |t| wait_durable(durable.as_ref(), t, &stop));
            match outcome {
                Outcome::Durable => (item.release)(None),
                Outcome::GaveUp => {
                    let refusal = item.ticket.filter(|t| !durable.make_durable(*t)).and_then(|t| durable.gave_up(t));
                    (item.release)(refusal);
                }
                Outcome::Stopped => {
                    // Stopping with a log that never held them: drop this
                    // and every later release at once.
                    let dropped = 1 + items.len() + rx.try_iter().count();
                    tracing::error!(
                        batches = dropped,
                        "acknowledgements dropped at shutdown: the job log never held their jobs"
                    );
                    break;
                }
            }
        }
    }
}

/// How a wait for a ticket ended.
enum Outcome {
    /// The log holds it.
    Durable,
    /// The log gave up on it (or on one before it).
    GaveUp,
    /// The router stops and the log never held it.
    Stopped,
}

/// Makes `ticket` durable, waiting through faults until a repair does or
/// the log gives up on it; [`Outcome::Stopped`] once `stop` is set while
/// it is neither.
fn wait_durable(durable: &dyn Durable, ticket: Ticket, stop: &AtomicBool) -> Outcome {
    loop {
        if durable.make_durable(ticket) {
            return Outcome::Durable;
        }
        if durable.gave_up(ticket).is_some() {
            return Outcome::GaveUp;
        }
        let t0 = Instant::now();
        if durable.wait(ticket, FAULT_WAIT) {
            return Outcome::Durable;
        }
        if stop.load(Ordering::Acquire) {
            return if durable.make_durable(ticket) { Outcome::Durable } else { Outcome::Stopped };
        }
        // `wait` returns at once for a log no longer faulty: ask again,
        // but not in a busy loop.
        if t0.elapsed() < Duration::from_millis(1) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::sync::atomic::AtomicU64;

    /// A log whose durable point the test moves by hand.
    #[derive(Default)]
    struct Hand {
        durable: AtomicU64,
    }

    impl Durable for Hand {
        fn make_durable(&self, upto: Ticket) -> bool {
            self.durable.load(Ordering::Acquire) >= upto.0
        }
        fn wait(&self, upto: Ticket, timeout: Duration) -> bool {
            std::thread::sleep(timeout.min(Duration::from_millis(5)));
            self.make_durable(upto)
        }
        fn durable_upto(&self) -> Ticket {
            Ticket(self.durable.load(Ordering::Acquire))
        }
    }

    fn recorder(log: &Arc<Mutex<Vec<u32>>>, n: u32) -> Release {
        let log = log.clone();
        Box::new(move |_| log.lock().push(n))
    }

    #[test]
    fn releases_wait_for_their_ticket_and_keep_their_order() {
        for threaded in [false, true] {
            let hand = Arc::new(Hand::default());
            let mut r =
                if threaded { Releaser::thread(0, hand.clone()).unwrap() } else { Releaser::inline(hand.clone()) };
            let seen = Arc::new(Mutex::new(Vec::new()));
            r.submit(Some(Ticket(10)), recorder(&seen, 1));
            r.submit(None, recorder(&seen, 2));
            r.submit(Some(Ticket(5)), recorder(&seen, 3));
            std::thread::sleep(Duration::from_millis(30));
            r.poll();
            assert!(seen.lock().is_empty(), "nothing before ticket 10 is durable (threaded {threaded})");
            hand.durable.store(10, Ordering::Release);
            let t0 = Instant::now();
            while seen.lock().len() < 3 && t0.elapsed() < Duration::from_secs(5) {
                r.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(*seen.lock(), [1, 2, 3], "in order (threaded {threaded})");
        }
    }

    /// Releases handed over together: the first leaves once the log holds
    /// its ticket, without waiting for the last one's (a replicated log
    /// whose later batch waits for an election, or its give-up).
    #[test]
    fn a_release_leaves_when_its_own_ticket_is_durable_not_its_groups_last() {
        let hand = Arc::new(Hand::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = crossbeam_channel::unbounded();
        for (n, t) in [(1, 1), (2, 2)] {
            tx.send(Item { ticket: Some(Ticket(t)), release: recorder(&seen, n) }).unwrap();
        }
        drop(tx);
        let stop = Arc::new(AtomicBool::new(false));
        let (durable, stopping): (Arc<dyn Durable>, _) = (hand.clone(), stop.clone());
        let thread = std::thread::spawn(move || run(rx, durable, stopping));
        hand.durable.store(1, Ordering::Release);
        let t0 = Instant::now();
        while seen.lock().is_empty() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*seen.lock(), [1], "the first alone: ticket 2 is not durable");
        hand.durable.store(2, Ordering::Release);
        thread.join().unwrap();
        assert_eq!(*seen.lock(), [1, 2]);
    }

    #[test]
    fn what_never_became_durable_is_dropped_at_shutdown() {
        for threaded in [false, true] {
            let hand = Arc::new(Hand::default());
            let r = if threaded { Releaser::thread(0, hand.clone()).unwrap() } else { Releaser::inline(hand.clone()) };
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut r = r;
            r.submit(Some(Ticket(1)), recorder(&seen, 1));
            drop(r);
            assert!(seen.lock().is_empty(), "threaded {threaded}");
        }
    }
}
