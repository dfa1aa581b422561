//! What a replicated router knows about the ownership of its name, for
//! STATUS (`emq.wal.nats.ownership`), `/metrics`, the status page and a
//! standby's admin socket (docs/replicated.md "Failover", "Watching a
//! take-over"). Written by the lease code ([`super::owner`]) and the
//! start's replay ([`super::open`]); read by the admin thread. Off the
//! hot path: a lock taken a few times a second at most.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde_json::{json, Value};

/// A router's role for its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Connecting, or taking a free name.
    #[default]
    Starting,
    /// Another router holds the name; this one waits for its lease to
    /// expire (`standby`).
    Standby,
    /// This router took the name and reads its streams.
    Replaying,
    /// This router holds the name and serves.
    Owner,
    /// Another router took the name from this one: it acknowledges
    /// nothing more.
    Fenced,
}

impl Role {
    /// The role's name in STATUS and `/metrics`: `starting`, `standby`,
    /// `replaying`, `owner`, `fenced`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Standby => "standby",
            Role::Replaying => "replaying",
            Role::Owner => "owner",
            Role::Fenced => "fenced",
        }
    }

    /// Every role, in the order above (for `/metrics`, one gauge each).
    pub const ALL: [Role; 5] = [Role::Starting, Role::Standby, Role::Replaying, Role::Owner, Role::Fenced];
}

/// The shared view ([`Ownership::to_json`] says what each figure means).
#[derive(Debug, Default)]
struct View {
    role: Role,
    /// Who holds the name, as its lease key says: this router's own
    /// holder string once it took it.
    holder: Option<String>,
    /// When the holder's lease was last renewed, by the NATS server's
    /// clock (a standby's view: the key's time).
    holder_renewed: Option<SystemTime>,
    /// When this router last renewed its own lease.
    renewed: Option<Instant>,
    /// The lease key's revision this router created.
    epoch: u64,
    /// The holder this router took the name from (its lease had expired).
    took_over_from: Option<String>,
    /// Names taken by this process since it started.
    takeovers: u64,
    /// When this router took the name, and how long its replay took.
    taken_at: Option<Instant>,
    replay_took: Option<Duration>,
    /// Streams read so far and in all, messages read.
    streams_read: usize,
    streams: usize,
    messages_read: u64,
}

/// The figures `/metrics` shows ([`Ownership::figures`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnershipFigures {
    /// The role now.
    pub role: Role,
    /// Time since the holder's lease was last renewed (as `lease_age_ms`
    /// in [`Ownership::to_json`]); `None` when unknown.
    pub lease_age: Option<Duration>,
    /// Names taken by this process.
    pub takeovers: u64,
    /// The lease revision this router took (0 before).
    pub epoch: u64,
}

/// The view of one router's ownership of its name, shared by the threads
/// that change and read it.
#[derive(Debug, Default)]
pub struct Ownership {
    view: Mutex<View>,
    /// The other router names of the stream prefix (listed by the lease
    /// code, [`super::peers`]).
    peers: super::peers::Peers,
}

/// Set by a stop signal: a standby waiting for the name gives up waiting
/// ([`stop_waiting`]).
static STOP_WAITING: AtomicBool = AtomicBool::new(false);

/// Asks a router that waits for its name (a standby) to stop waiting: its
/// start fails with [`super::JsError::Stopped`]. A router past the wait is
/// not affected (its program stops it once started). Process-wide, as the
/// signal that calls it.
pub fn stop_waiting() {
    STOP_WAITING.store(true, Ordering::Release);
}

/// Whether [`stop_waiting`] was called.
pub fn waiting_stopped() -> bool {
    STOP_WAITING.load(Ordering::Acquire)
}

/// Returns once [`stop_waiting`] was called (checked every 100 ms).
pub async fn stop_requested() {
    while !waiting_stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Ownership {
    /// The other router names of the stream prefix, as last listed.
    pub fn peers(&self) -> &super::peers::Peers {
        &self.peers
    }

    /// The current role.
    pub fn role(&self) -> Role {
        self.view.lock().role
    }

    /// Another router holds the name (`holder`, renewed at `renewed` by
    /// the server's clock): this one waits.
    pub fn waiting(&self, holder: &str, renewed: SystemTime) {
        let mut v = self.view.lock();
        v.role = Role::Standby;
        if v.holder.as_deref() != Some(holder) {
            v.holder = Some(holder.to_string());
        }
        v.holder_renewed = Some(renewed);
    }

    /// This router took the name at lease revision `epoch`, from
    /// `previous` (a holder whose lease expired), or free (`None`); its
    /// streams are read next.
    pub fn took(&self, holder: &str, epoch: u64, previous: Option<&str>) {
        let mut v = self.view.lock();
        v.role = Role::Replaying;
        v.holder = Some(holder.to_string());
        v.holder_renewed = None;
        v.renewed = Some(Instant::now());
        v.epoch = epoch;
        v.took_over_from = previous.map(str::to_string);
        v.takeovers += 1;
        v.taken_at = Some(Instant::now());
    }

    /// `n` streams are to be read.
    pub fn streams_to_read(&self, n: usize) {
        self.view.lock().streams = n;
    }

    /// One stream was read, with `messages` messages.
    pub fn stream_read(&self, messages: u64) {
        let mut v = self.view.lock();
        v.streams_read += 1;
        v.messages_read += messages;
    }

    /// The streams are read and the router serves.
    pub fn serving(&self) {
        let mut v = self.view.lock();
        if v.role == Role::Replaying || v.role == Role::Starting {
            v.role = Role::Owner;
        }
        v.replay_took = v.taken_at.map(|t| t.elapsed());
    }

    /// This router's lease was renewed.
    pub fn renewed(&self) {
        self.view.lock().renewed = Some(Instant::now());
    }

    /// Another router took the name (`holder`, when known).
    pub fn fenced(&self, holder: Option<&str>) {
        let mut v = self.view.lock();
        v.role = Role::Fenced;
        if let Some(h) = holder {
            v.holder = Some(h.to_string());
        }
    }

    /// The figures for `/metrics`.
    pub fn figures(&self) -> OwnershipFigures {
        let v = self.view.lock();
        OwnershipFigures { role: v.role, lease_age: lease_age(&v), takeovers: v.takeovers, epoch: v.epoch }
    }

    /// The view as JSON (docs/emqp.md "STATUS"): `role`; `holder` (who
    /// holds the name, as its lease key says; this router's own string
    /// when it is the owner); `lease_age_ms` (milliseconds since the
    /// holder's lease was last renewed: by this router's clock for its own
    /// lease, by the NATS server's key time against this machine's clock
    /// for another holder's); `epoch` (the lease revision this router took,
    /// 0 before); `took_over_from`; `takeovers` (names taken by this
    /// process); `replay` (`streams_read`, `streams`, `messages_read`,
    /// `took_ms` once done).
    pub fn to_json(&self) -> Value {
        let v = self.view.lock();
        let age = lease_age(&v);
        json!({
            "role": v.role.as_str(),
            "holder": v.holder,
            "lease_age_ms": age.map(|a| a.as_millis() as u64),
            "epoch": v.epoch,
            "took_over_from": v.took_over_from,
            "takeovers": v.takeovers,
            "replay": {
                "streams_read": v.streams_read,
                "streams": v.streams,
                "messages_read": v.messages_read,
                "took_ms": v.replay_took.map(|d| d.as_millis() as u64),
            },
        })
    }
}

/// Time since the holder's last renewal: this router's own (by its clock)
/// while it holds the name, another holder's by the key's time; none for
/// a fenced router (it no longer knows the taker's renewals).
fn lease_age(v: &View) -> Option<Duration> {
    match v.role {
        Role::Replaying | Role::Owner => v.renewed.map(|r| r.elapsed()),
        Role::Fenced => None,
        Role::Starting | Role::Standby => {
            v.holder_renewed.map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_then_owner_then_fenced() {
        let o = Ownership::default();
        assert_eq!(o.to_json()["role"], "starting");
        o.waiting("router a", SystemTime::now() - Duration::from_secs(2));
        let j = o.to_json();
        assert_eq!((j["role"].as_str(), j["holder"].as_str()), (Some("standby"), Some("router a")));
        let age = j["lease_age_ms"].as_u64().unwrap_or(0);
        assert!((2000..3000).contains(&age), "{age}");
        o.took("router b", 42, Some("router a"));
        o.streams_to_read(2);
        o.stream_read(10);
        let j = o.to_json();
        assert_eq!(j["role"], "replaying");
        assert_eq!((j["epoch"].as_u64(), j["took_over_from"].as_str()), (Some(42), Some("router a")));
        assert_eq!((j["replay"]["streams_read"].as_u64(), j["replay"]["messages_read"].as_u64()), (Some(1), Some(10)));
        assert!(j["replay"]["took_ms"].is_null());
        o.stream_read(5);
        o.serving();
        let j = o.to_json();
        assert_eq!((j["role"].as_str(), j["takeovers"].as_u64()), (Some("owner"), Some(1)));
        assert!(j["replay"]["took_ms"].is_u64());
        assert!(j["lease_age_ms"].as_u64().is_some_and(|a| a < 1000));
        o.fenced(Some("router c"));
        let j = o.to_json();
        assert_eq!((j["role"].as_str(), j["holder"].as_str()), (Some("fenced"), Some("router c")));
        // A fenced router's own lease age no longer counts; the taker's is unknown.
        assert!(j["lease_age_ms"].is_null());
    }
}
