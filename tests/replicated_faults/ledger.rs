//! The [`Ledger`] of the fault tests: every job a producer sent, its
//! answer and when, and what consumers got.
//!
//! A job is **acknowledged** when its eMQP acceptance `REPLY` arrives, or,
//! for a text `SCHED` (which answers nothing of its own), when the `NOPE`
//! of the `ASK probe` sent right behind it arrives with no `ERR` before it.
//! It is **refused** when an eMQP `ERROR` names it, or an `ERR <code>`
//! comes before that `NOPE`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a job was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// eMQP acceptance `REPLY`, or the text `NOPE` behind the SCHED.
    Acked,
    /// eMQP `ERROR` or text `ERR` with this code; `text` is the eMQP
    /// ERROR's explanation, or the text after a text `ERR`'s code.
    Refused {
        /// `STORE_FAILED`, `QUEUE_FULL`, …
        code: String,
        /// The eMQP ERROR's third frame, or the rest of the `ERR` line.
        text: String,
    },
}

/// One job a producer sent.
#[derive(Debug, Clone)]
pub struct Sent {
    /// When it was written to its client's socket.
    pub at: Instant,
    /// Its answer and when it arrived; `None`: none (yet).
    pub answer: Option<(Instant, Answer)>,
}

impl Sent {
    /// Whether it was acknowledged.
    pub fn acked(&self) -> bool {
        matches!(self.answer, Some((_, Answer::Acked)))
    }
}

/// One job a consumer got.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Which consumer.
    pub consumer: String,
    /// The job's body (producers make each unique).
    pub body: String,
}

/// What the producers sent and what came back, and what consumers got.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Every job sent, by body.
    pub jobs: BTreeMap<String, Sent>,
    /// Deliveries in arrival order.
    pub deliveries: Vec<Delivery>,
    /// Anything a client did not expect (checked empty by the tests).
    pub oddities: Vec<String>,
}

impl Ledger {
    /// Records `body`'s answer (an oddity when it has one already or was
    /// never sent).
    pub fn answer(&mut self, body: &str, answer: Answer) {
        let now = Instant::now();
        match self.jobs.get_mut(body) {
            Some(sent) if sent.answer.is_none() => sent.answer = Some((now, answer)),
            Some(sent) => self.oddities.push(format!("{body} answered twice: {:?} then {answer:?}", sent.answer)),
            None => self.oddities.push(format!("an answer for {body}, never sent: {answer:?}")),
        }
    }

    /// Bodies acknowledged.
    pub fn acked(&self) -> impl Iterator<Item = (&String, &Sent)> {
        self.jobs.iter().filter(|(_, s)| s.acked())
    }

    /// How many times each body was delivered.
    pub fn delivery_counts(&self) -> BTreeMap<&str, usize> {
        let mut n = BTreeMap::new();
        for d in &self.deliveries {
            *n.entry(d.body.as_str()).or_default() += 1;
        }
        n
    }

    /// Sent, acknowledged, refused (by code), unanswered, delivered.
    pub fn counts(&self) -> String {
        let mut codes: BTreeMap<&str, usize> = BTreeMap::new();
        let (mut acked, mut open) = (0, 0);
        for s in self.jobs.values() {
            match &s.answer {
                Some((_, Answer::Acked)) => acked += 1,
                Some((_, Answer::Refused { code, .. })) => *codes.entry(code).or_default() += 1,
                None => open += 1,
            }
        }
        format!(
            "sent {}, acked {acked}, refused {codes:?}, unanswered {open}, delivered {}",
            self.jobs.len(),
            self.deliveries.len()
        )
    }

    /// Acknowledgements that arrived in `[from, to)`.
    pub fn acks_between(&self, from: Instant, to: Instant) -> Vec<(&String, Instant)> {
        self.jobs
            .iter()
            .filter_map(|(b, s)| match s.answer {
                Some((at, Answer::Acked)) if at >= from && at < to => Some((b, at)),
                _ => None,
            })
            .collect()
    }

    /// The first refusal with `code` to arrive after `from`: when, and
    /// the job's body.
    pub fn first_refusal_after(&self, code: &str, from: Instant) -> Option<(Instant, &String)> {
        self.jobs
            .iter()
            .filter_map(|(b, s)| match &s.answer {
                Some((at, Answer::Refused { code: c, .. })) if c == code && *at >= from => Some((*at, b)),
                _ => None,
            })
            .min()
    }

    /// How many jobs sent at or after `from` were acknowledged.
    pub fn acked_sent_after(&self, from: Instant) -> usize {
        self.jobs.values().filter(|s| s.at >= from && s.acked()).count()
    }

    /// The first acknowledgement of a job sent at or after `from`.
    pub fn first_ack_of_sent_after(&self, from: Instant) -> Option<(Instant, &String)> {
        self.jobs
            .iter()
            .filter_map(|(b, s)| match s.answer {
                Some((at, Answer::Acked)) if s.at >= from => Some((at, b)),
                _ => None,
            })
            .min()
    }

    /// The longest time between two acknowledgements in `[from, to)`
    /// (counting from `from` and up to the first one after it), and where
    /// it began.
    pub fn longest_ack_gap(&self, from: Instant, to: Instant) -> (Duration, Instant) {
        let mut times: Vec<Instant> = self
            .jobs
            .values()
            .filter_map(|s| match s.answer {
                Some((at, Answer::Acked)) if at >= from && at < to => Some(at),
                _ => None,
            })
            .collect();
        times.sort();
        let mut best = (Duration::ZERO, from);
        let mut last = from;
        for t in times {
            if t - last > best.0 {
                best = (t - last, last);
            }
            last = t;
        }
        best
    }
}

/// The ledger shared by a test's threads.
pub type Shared = Arc<Mutex<Ledger>>;

/// The ledger, also after a thread panicked holding it.
pub fn lock(l: &Shared) -> MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}
