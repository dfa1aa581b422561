//! A text-protocol client over several owners (router names,
//! docs/scaleout.md): SCHED spread round-robin over the owners that are up,
//! ASK over every owner in turn, and ACK, DCL and DEL back to the owner the
//! offer came from.
//!
//! Owners are given as [`crate::config::addr::text_owners`] splits them:
//! `;` between owners, `,` between one owner's addresses (its owner and
//! standby, docs/failover.md). [`TextOwners`] keeps at most one connection
//! per owner, to the first of its addresses that accepts one; a broken
//! connection is dropped and the next command connects again, in the same
//! order. An owner none of whose addresses accepts a connection is left
//! out of the rotation for [`limits::TEXT_OWNER_RETRY`] (1 s), so that it
//! costs one connect timeout per second and not one per command; when
//! every owner is out, all are tried anyway.
//!
//! # SCHED: where it goes and when it is sent again
//!
//! Each SCHED goes to the next owner in a round-robin over the owners
//! that are up, starting at a random owner (so that one-shot producers
//! such as `emq-cli sched` do not all load the first owner). The choice
//! is per SCHED and not per connection: one producer's tasks spread evenly
//! however few producers there are, and nothing is measured (a refused
//! SCHED moves on by itself).
//!
//! A SCHED answers nothing when it works, so [`TextOwners::sched`] writes
//! it, then the barrier ([`TextClient::sync`]), and reads its outcome: one
//! round trip per SCHED. The re-send rule:
//!
//! * **Never written** (no address of the owner accepts a connection, or
//!   the write fails: the line's final LF never left, so the server never
//!   ran it): sent to the next owner.
//! * **Refused so that it is certainly not stored**: `QUEUE_FULL`,
//!   `SHUTTING_DOWN`, `QUEUE_LIMIT`, `BUSY`, `NOAUTH`, `AUTH_FAILED`, and
//!   `STORE_FULL` or `STORE_FAILED` *without* `not confirmed:`: sent to
//!   the next owner.
//! * **Refused the same way everywhere** (`BAD_FORMAT`, `TOO_BIG`,
//!   `UNKNOWN_COMMAND`): not sent again, [`OwnersError::Refused`].
//! * **Written, answer lost** (the connection broke or timed out before
//!   the barrier's answer), or `STORE_FAILED`/`STORE_FULL` `not confirmed:`
//!   (taken, its log write given up): **not** sent anywhere else, because a
//!   text SCHED has no msgid and another owner cannot know it is a
//!   duplicate; [`OwnersError::Unknown`] to the caller, which decides.
//!
//! When every owner was tried and none stored it: [`OwnersError::NotStored`]
//! with each owner's reason.
//!
//! # ASK over every owner
//!
//! [`TextOwners::ask`] asks one owner at a time, as beanstalkd clients
//! with several servers do: the long-poll `ASK <queue> <ms>` with a short
//! per-owner wait `w` (or a plain `ASK` for `w = 0`), moving to the next
//! owner on `NOPE`; a round of `NOPE`s from every owner is `Ok(None)`. It
//! starts with the owner that gave the last task, so a busy owner is
//! drained without a `NOPE` in between. The worst wait before a task that
//! arrives on owner k is seen is (N − 1) × w plus N round trips for N
//! owners: the ask had just moved past k, and every other owner waits its
//! whole `w`. A task is taken by the first asker of its own owner, so
//! several consumers over the same owners do not wait for each other.
//!
//! The offer is held on the connection of the owner it came from, and
//! [`TextOwners::ack`], [`TextOwners::dcl`] and [`TextOwners::del`] go
//! there. If that connection breaks first, the server puts the task back
//! at the front of its queue (docs/text-protocol.md "The offer").
//! `ERR` lines for ACK, DCL and DEL (`NO_TASK` after `text_offer_timeout`)
//! surface as for [`TextClient`]: kept, handed over by
//! [`TextOwners::take_deferred`], [`TextOwners::sync`] and
//! [`TextOwners::end`], each naming its owner.
//!
//! ```no_run
//! use std::time::Duration;
//! use emq::client::text::TextClientOptions;
//! use emq::client::text_spread::TextOwners;
//! use emq::config::addr;
//!
//! let owners = addr::text_owners("127.0.0.1:47294;127.0.0.1:48294").expect("owner list");
//! let mut c = TextOwners::new(owners, Duration::from_secs(5), &TextClientOptions::default())?;
//! let owner = c.sched(b"hello", Some("q"))?; // stored on this owner
//! println!("stored on {}", c.owner_name(owner));
//! if let Some(offer) = c.ask("q", Duration::from_millis(200))? {
//!     println!("{} from {}", String::from_utf8_lossy(&offer.data), c.owner_name(offer.owner));
//!     c.ack()?;
//! }
//! c.end()?;
//! # Ok::<(), emq::client::text_spread::OwnersError>(())
//! ```

use std::time::{Duration, Instant};

use crate::client::text::{ServerError, TextClient, TextClientError, TextClientOptions};
use crate::limits;
use crate::protocol::text::{encode_command, EncodeError, ErrorCode, TextCommand};

/// Why one owner did not take a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerFailure {
    /// The owner, its addresses as given (`a,b`).
    pub owner: String,
    /// What happened there.
    pub why: String,
}

/// Errors of [`TextOwners`].
#[derive(Debug, thiserror::Error)]
pub enum OwnersError {
    /// The command cannot be written as one line (nothing was sent).
    #[error("cannot encode command: {0}")]
    Encode(#[from] EncodeError),
    /// An owner refused the command in a way every owner would (SCHED:
    /// `BAD_FORMAT`, `TOO_BIG`; ASK: `BAD_FORMAT` for a wait over
    /// `text_max_ask_wait`, `PENDING`): nothing was stored or taken.
    #[error("{owner} refused it: server error {}: {}", .error.code, .error.text)]
    Refused {
        /// The owner that answered.
        owner: String,
        /// Its `ERR` line.
        error: ServerError,
    },
    /// No owner stored the SCHED: each was down or refused it so that it
    /// is certainly not stored (reasons in the order tried).
    #[error("no owner stored the task: {}", failures(.0))]
    NotStored(Vec<OwnerFailure>),
    /// The SCHED was written to `owner` and no answer said what became of
    /// it: it may or may not be stored, and was not sent elsewhere.
    #[error("SCHED written to {owner}, outcome unknown: {why}")]
    Unknown {
        /// The owner it was written to.
        owner: String,
        /// What happened instead of an answer.
        why: String,
    },
    /// No owner answered the ASK (each was down or broke).
    #[error("no owner answered: {}", failures(.0))]
    AllDown(Vec<OwnerFailure>),
    /// ACK, DCL or DEL while no offer is held.
    #[error("no offer is held")]
    NoOffer,
    /// ASK while an offer is still held: answer it first.
    #[error("an offer from {0} is still held: ACK, DCL or DEL it first")]
    OfferHeld(String),
    /// The answer to an offer could not be written to its owner; the
    /// server puts the task back at the front of its queue when it sees the
    /// connection end.
    #[error("answer to the offer from {owner} not sent: {why}")]
    OfferLost {
        /// The owner the offer came from.
        owner: String,
        /// The failure.
        why: String,
    },
    /// `ERR` lines for earlier ACK, DCL or DEL commands, with their owners,
    /// in the order read.
    #[error("{} earlier command(s) failed, first: {}", .0.len(), .0.first().map(|(o, e)| format!("{} at {o}", e.code)).unwrap_or_default())]
    Deferred(Vec<(String, ServerError)>),
}

fn failures(list: &[OwnerFailure]) -> String {
    list.iter().map(|f| format!("{}: {}", f.owner, f.why)).collect::<Vec<_>>().join("; ")
}

/// A task offered by one owner ([`TextOwners::ask`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The task's data.
    pub data: Vec<u8>,
    /// Index of the owner holding the offer ([`TextOwners::owner_name`]).
    pub owner: usize,
}

/// One owner: its addresses and the connection to one of them.
#[derive(Debug)]
struct Owner {
    name: String,
    addrs: Vec<(String, TextClientOptions)>,
    conn: Option<TextClient>,
    /// Left out of the rotation until then (a connect failed).
    down_until: Option<Instant>,
}

/// What one SCHED attempt at one owner came to.
enum Attempt {
    Stored,
    /// Certainly not stored there; try the next owner.
    NotStored(String),
    /// Stop: the caller gets this.
    Final(OwnersError),
}

/// A text client over several owners (see the module docs).
#[derive(Debug)]
pub struct TextOwners {
    owners: Vec<Owner>,
    timeout: Duration,
    sched_next: usize,
    ask_next: usize,
    held: Option<usize>,
    deferred: Vec<(String, ServerError)>,
}

impl TextOwners {
    /// A client over `owners` (as [`crate::config::addr::text_owners`]
    /// gives them), every connection opened with `options`; `timeout`
    /// bounds each connect, read and write as for [`TextClient`]. Connects
    /// lazily, at the first command.
    ///
    /// # Errors
    /// [`OwnersError::AllDown`] for no owner or more than
    /// [`limits::TEXT_MAX_OWNERS`], or an owner without addresses.
    pub fn new(
        owners: Vec<Vec<String>>,
        timeout: Duration,
        options: &TextClientOptions,
    ) -> Result<TextOwners, OwnersError> {
        let owners = owners.into_iter().map(|o| o.into_iter().map(|a| (a, options.clone())).collect()).collect();
        TextOwners::with_options(owners, timeout)
    }

    /// [`TextOwners::new`] with options per address (TLS server names
    /// differ by host).
    ///
    /// # Errors
    /// As [`TextOwners::new`].
    pub fn with_options(
        owners: Vec<Vec<(String, TextClientOptions)>>,
        timeout: Duration,
    ) -> Result<TextOwners, OwnersError> {
        let bad = |why: &str| OwnersError::AllDown(vec![OwnerFailure { owner: String::new(), why: why.into() }]);
        if owners.is_empty() || owners.iter().any(Vec::is_empty) {
            return Err(bad("no owner address given"));
        }
        if owners.len() > limits::TEXT_MAX_OWNERS {
            return Err(bad(&format!("more than {} owners", limits::TEXT_MAX_OWNERS)));
        }
        let owners: Vec<Owner> = owners
            .into_iter()
            .map(|addrs| {
                let name = addrs.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>().join(",");
                Owner { name, addrs, conn: None, down_until: None }
            })
            .collect();
        let start = random_index(owners.len());
        Ok(TextOwners { owners, timeout, sched_next: start, ask_next: 0, held: None, deferred: Vec::new() })
    }

    /// How many owners.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Always `false`: a client has at least one owner.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Owner `k`'s addresses as given (`a,b`); `""` past the last.
    pub fn owner_name(&self, k: usize) -> &str {
        self.owners.get(k).map_or("", |o| o.name.as_str())
    }

    /// Sends `SCHED <data>[@<queue>]` to one owner and waits for its
    /// outcome (see the module docs for the owner chosen and the re-send
    /// rule). Returns the index of the owner that stored it.
    ///
    /// # Errors
    /// [`OwnersError::Encode`] (nothing sent), [`OwnersError::Refused`],
    /// [`OwnersError::NotStored`], [`OwnersError::Unknown`].
    pub fn sched(&mut self, data: &[u8], queue: Option<&str>) -> Result<usize, OwnersError> {
        let queue = queue.unwrap_or(limits::DEFAULT_QUEUE);
        encode_command(&mut Vec::new(), &TextCommand::Sched { data: data.to_vec(), queue: queue.to_string() })?;
        let start = self.sched_next;
        self.sched_next = (start + 1) % self.owners.len();
        let mut failed = Vec::new();
        for k in self.rotation(start) {
            match self.sched_at(k, data, queue) {
                Attempt::Stored => return Ok(k),
                Attempt::NotStored(why) => failed.push(OwnerFailure { owner: self.owners[k].name.clone(), why }),
                Attempt::Final(e) => return Err(e),
            }
        }
        Err(OwnersError::NotStored(failed))
    }

    fn sched_at(&mut self, k: usize, data: &[u8], queue: &str) -> Attempt {
        let timeout = self.timeout;
        let (c, name) = match self.connect(k) {
            Ok(c) => c,
            Err(why) => return Attempt::NotStored(why),
        };
        // Earlier ACK/DCL/DEL errors first, so that the next ERR is this SCHED's.
        match c.sync() {
            Ok(()) => {}
            Err(TextClientError::Deferred(errors)) => {
                self.deferred.extend(errors.into_iter().map(|e| (name.clone(), e)))
            }
            Err(e) => return self.drop_conn(k, Attempt::NotStored(format!("connection lost before SCHED: {e}"))),
        }
        let Some(c) = self.owners[k].conn.as_mut() else { return Attempt::NotStored("no connection".into()) };
        if let Err(e) = c.sched(data, Some(queue)) {
            // The line's LF never left: the server did not run it.
            return self.drop_conn(k, Attempt::NotStored(format!("SCHED not written: {e}")));
        }
        match c.sync() {
            Ok(()) => Attempt::Stored,
            Err(TextClientError::Deferred(errors)) => match errors.into_iter().next() {
                Some(error) => sched_refusal(name, error),
                None => Attempt::Stored,
            },
            Err(TextClientError::Server { code, text }) => {
                // BUSY, NOAUTH, AUTH_FAILED: the server closed before running it.
                self.drop_conn(k, Attempt::NotStored(format!("{code} {text}")))
            }
            Err(e) => {
                let why = match e {
                    TextClientError::Timeout => format!("no answer within {}", humantime::format_duration(timeout)),
                    e => format!("the connection failed after SCHED was written ({e})"),
                };
                self.drop_conn(k, Attempt::Final(OwnersError::Unknown { owner: name, why }))
            }
        }
    }

    /// Asks every owner in turn for a task of `queue`, each with the
    /// long-poll wait `wait` (`ASK <queue> <ms>`; zero: plain `ASK`), until
    /// one offers one. `Ok(None)` after a `NOPE` from every owner that
    /// answered. Worst wait: (owners − 1) × `wait` plus a round trip per
    /// owner (module docs).
    ///
    /// # Errors
    /// [`OwnersError::OfferHeld`]; [`OwnersError::Encode`] for an invalid
    /// queue name; [`OwnersError::Refused`] for `BAD_FORMAT` (a wait over
    /// the server's `text_max_ask_wait`); [`OwnersError::AllDown`] when no
    /// owner answered at all.
    pub fn ask(&mut self, queue: &str, wait: Duration) -> Result<Option<Offer>, OwnersError> {
        if let Some(k) = self.held {
            return Err(OwnersError::OfferHeld(self.owners[k].name.clone()));
        }
        encode_command(&mut Vec::new(), &TextCommand::Ask { queue: queue.to_string() })?;
        let mut failed = Vec::new();
        let mut answered = false;
        for k in self.rotation(self.ask_next) {
            let (c, name) = match self.connect(k) {
                Ok(c) => c,
                Err(why) => {
                    failed.push(OwnerFailure { owner: self.owners[k].name.clone(), why });
                    continue;
                }
            };
            let answer = if wait.is_zero() { c.ask(queue) } else { c.ask_wait(queue, wait) };
            let earlier = c.take_deferred();
            self.deferred.extend(earlier.into_iter().map(|e| (name.clone(), e)));
            match answer {
                Ok(Some(data)) => {
                    self.held = Some(k);
                    self.ask_next = k;
                    return Ok(Some(Offer { data, owner: k }));
                }
                Ok(None) => answered = true,
                Err(TextClientError::Server { code, text })
                    if matches!(code, ErrorCode::BadFormat | ErrorCode::UnknownCommand | ErrorCode::Pending) =>
                {
                    return Err(OwnersError::Refused { owner: name, error: ServerError { code, text } });
                }
                Err(e) => {
                    failed.push(OwnerFailure { owner: name, why: e.to_string() });
                    if !matches!(e, TextClientError::Server { code: ErrorCode::QueueLimit, .. }) {
                        self.owners[k].conn = None;
                    }
                }
            }
        }
        if answered {
            Ok(None)
        } else {
            Err(OwnersError::AllDown(failed))
        }
    }

    /// Sends `ACK` for the offer held to the owner it came from (write
    /// only). Returns that owner's index.
    ///
    /// # Errors
    /// [`OwnersError::NoOffer`]; [`OwnersError::OfferLost`] when the write
    /// fails.
    pub fn ack(&mut self) -> Result<usize, OwnersError> {
        self.answer(TextClient::ack)
    }

    /// Sends `DCL` for the offer held (as [`TextOwners::ack`]).
    ///
    /// # Errors
    /// As [`TextOwners::ack`].
    pub fn dcl(&mut self) -> Result<usize, OwnersError> {
        self.answer(TextClient::dcl)
    }

    /// Sends `DEL` for the offer held (as [`TextOwners::ack`]).
    ///
    /// # Errors
    /// As [`TextOwners::ack`].
    pub fn del(&mut self) -> Result<usize, OwnersError> {
        self.answer(TextClient::del)
    }

    fn answer(&mut self, send: fn(&mut TextClient) -> Result<(), TextClientError>) -> Result<usize, OwnersError> {
        let k = self.held.take().ok_or(OwnersError::NoOffer)?;
        let owner = &mut self.owners[k];
        let Some(c) = owner.conn.as_mut() else {
            return Err(OwnersError::OfferLost { owner: owner.name.clone(), why: "connection gone".into() });
        };
        match send(c) {
            Ok(()) => Ok(k),
            Err(e) => {
                owner.conn = None;
                Err(OwnersError::OfferLost { owner: owner.name.clone(), why: e.to_string() })
            }
        }
    }

    /// Waits until every owner connected has handled every command sent
    /// to it. A connection that fails is dropped (its offer, if any, goes
    /// back to its queue).
    ///
    /// # Errors
    /// [`OwnersError::Deferred`] with every `ERR` kept for earlier ACK, DCL
    /// or DEL commands (then cleared).
    pub fn sync(&mut self) -> Result<(), OwnersError> {
        for k in 0..self.owners.len() {
            let owner = &mut self.owners[k];
            let Some(c) = owner.conn.as_mut() else { continue };
            match c.sync() {
                Ok(()) => {}
                Err(TextClientError::Deferred(errors)) => {
                    self.deferred.extend(errors.into_iter().map(|e| (owner.name.clone(), e)));
                }
                Err(_) => {
                    owner.conn = None;
                    if self.held == Some(k) {
                        self.held = None;
                    }
                }
            }
        }
        self.deferred_result()
    }

    /// Takes the `ERR` lines kept for earlier ACK, DCL and DEL commands,
    /// with their owners.
    pub fn take_deferred(&mut self) -> Vec<(String, ServerError)> {
        std::mem::take(&mut self.deferred)
    }

    /// Sends `END` to every owner connected and reads until each closes.
    ///
    /// # Errors
    /// [`OwnersError::Deferred`] as [`TextOwners::sync`]; a connection that
    /// fails otherwise is only closed.
    pub fn end(mut self) -> Result<(), OwnersError> {
        for owner in &mut self.owners {
            let Some(c) = owner.conn.take() else { continue };
            if let Err(TextClientError::Deferred(errors)) = c.end() {
                self.deferred.extend(errors.into_iter().map(|e| (owner.name.clone(), e)));
            }
        }
        self.deferred_result()
    }

    fn deferred_result(&mut self) -> Result<(), OwnersError> {
        if self.deferred.is_empty() {
            Ok(())
        } else {
            Err(OwnersError::Deferred(self.take_deferred()))
        }
    }

    /// The owners from `start` on, once each: those up first, then those
    /// left out after a failed connect (tried last, not skipped).
    fn rotation(&self, start: usize) -> Vec<usize> {
        let now = Instant::now();
        let n = self.owners.len();
        let order = (0..n).map(|i| (start + i) % n);
        let down = |k: &usize| self.owners[*k].down_until.is_some_and(|t| t > now);
        let mut up: Vec<usize> = order.clone().filter(|k| !down(k)).collect();
        up.extend(order.filter(down));
        up
    }

    /// Owner `k`'s connection (made now if it has none, or if the server
    /// closed the idle one) and its name.
    ///
    /// # Errors
    /// Why no address of the owner took a connection; the owner is then
    /// left out of the rotation for [`limits::TEXT_OWNER_RETRY`].
    fn connect(&mut self, k: usize) -> Result<(&mut TextClient, String), String> {
        let timeout = self.timeout;
        let owner = &mut self.owners[k];
        if owner.conn.as_ref().is_some_and(TextClient::peer_closed) {
            owner.conn = None;
            if self.held == Some(k) {
                self.held = None;
            }
        }
        if owner.conn.is_none() {
            let mut why = Vec::new();
            for (addr, options) in &owner.addrs {
                match TextClient::connect_with(addr.as_str(), timeout, options) {
                    Ok(c) => {
                        owner.conn = Some(c);
                        break;
                    }
                    Err(e) if owner.addrs.len() == 1 => why.push(format!("cannot connect: {e}")),
                    Err(e) => why.push(format!("{addr}: cannot connect: {e}")),
                }
            }
            if owner.conn.is_none() {
                owner.down_until = Instant::now().checked_add(limits::TEXT_OWNER_RETRY);
                return Err(why.join("; "));
            }
            owner.down_until = None;
        }
        let name = owner.name.clone();
        match owner.conn.as_mut() {
            Some(c) => Ok((c, name)),
            None => Err("no connection".into()),
        }
    }

    /// Drops owner `k`'s connection and returns `attempt`.
    fn drop_conn(&mut self, k: usize, attempt: Attempt) -> Attempt {
        self.owners[k].conn = None;
        if self.held == Some(k) {
            self.held = None;
        }
        attempt
    }
}

/// What an `ERR` answering a SCHED means for the re-send rule (module docs).
fn sched_refusal(owner: String, error: ServerError) -> Attempt {
    let unconfirmed =
        matches!(error.code, ErrorCode::StoreFailed | ErrorCode::StoreFull) && error.text.starts_with("not confirmed:");
    if unconfirmed {
        let why = format!("{} {}", error.code, error.text);
        return Attempt::Final(OwnersError::Unknown { owner, why });
    }
    match error.code {
        ErrorCode::BadFormat | ErrorCode::TooBig | ErrorCode::UnknownCommand => {
            Attempt::Final(OwnersError::Refused { owner, error })
        }
        code => Attempt::NotStored(format!("{code} {}", error.text)),
    }
}

/// A random index below `n` (0 for `n` ≤ 1; the clock's nanoseconds if
/// the system has no random source: spreading is all it is for): where a
/// round-robin over owners starts, so that one-shot producers spread too.
pub(crate) fn random_index(n: usize) -> usize {
    let mut b = [0u8; 8];
    if getrandom::getrandom(&mut b).is_err() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = u64::from(nanos.subsec_nanos()).to_le_bytes();
    }
    (u64::from_le_bytes(b) % n.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: ErrorCode, text: &str) -> Attempt {
        sched_refusal("o".into(), ServerError { code, text: text.into() })
    }

    #[test]
    fn the_resend_rule_by_code() {
        for code in [
            ErrorCode::QueueFull,
            ErrorCode::ShuttingDown,
            ErrorCode::QueueLimit,
            ErrorCode::Busy,
            ErrorCode::StoreFull,
            ErrorCode::StoreFailed,
            ErrorCode::NoAuth,
            ErrorCode::AuthFailed,
        ] {
            assert!(matches!(refusal(code, "x"), Attempt::NotStored(_)), "{code}: next owner");
        }
        for code in [ErrorCode::BadFormat, ErrorCode::TooBig, ErrorCode::UnknownCommand] {
            assert!(
                matches!(refusal(code, "x"), Attempt::Final(OwnersError::Refused { .. })),
                "{code}: same everywhere"
            );
        }
        for code in [ErrorCode::StoreFailed, ErrorCode::StoreFull] {
            let a = refusal(code, "not confirmed: the log gave up");
            assert!(matches!(a, Attempt::Final(OwnersError::Unknown { .. })), "{code} not confirmed: unknown");
        }
    }

    #[test]
    fn rotation_puts_owners_that_are_down_last() {
        let owners = vec![vec!["127.0.0.1:1".to_string()], vec!["127.0.0.1:2".into()], vec!["127.0.0.1:3".into()]];
        let mut c = TextOwners::new(owners, Duration::from_secs(1), &TextClientOptions::default()).expect("owners");
        assert_eq!(c.rotation(1), [1, 2, 0]);
        c.owners[2].down_until = Instant::now().checked_add(Duration::from_secs(60));
        assert_eq!(c.rotation(1), [1, 0, 2]);
        assert!(TextOwners::new(Vec::new(), Duration::from_secs(1), &TextClientOptions::default()).is_err());
    }
}
