//! All schedules and their next fire times: a map by key plus a min-heap of
//! deadlines on the monotonic clock, so the scheduler sleeps until the
//! earliest one and 10,000 idle schedules cost nothing between fires. Pure
//! logic: every call takes the time ([`Now`], both clocks).
//!
//! Replacement rules (docs/emqp.md "The scheduler"; EventMQ re-ran a job on every repeated SCHEDULE):
//! * a SCHEDULE whose key is new adds the job and, unless `nohaste`, runs it
//!   once at once (the "haste" run);
//! * a SCHEDULE identical to the stored one (same key and same five frames:
//!   queue, headers, interval, body, cron) changes nothing: the timer keeps
//!   its phase, the remaining run count is kept, no haste run. Apps that
//!   re-register their schedules at boot get no extra runs;
//! * a SCHEDULE with the same key but another definition replaces the job:
//!   new timer from `now`, run count from its headers, haste rule as for a
//!   new job.
//!
//! UNSCHEDULE removes the job whatever its kind (EventMQ kept cron jobs running).
//!
//! Clocks (emq's rules; EventMQ kept interval deadlines in UTC, so a clock
//! step back of an hour silenced every interval job for an hour):
//! * **Interval jobs run on the monotonic clock**: fixed rate (each fire
//!   moves the deadline by exactly one interval), and after a stall (the
//!   process was stopped, the machine slept) the overdue job fires **once**
//!   and the next deadline becomes `now + interval`: no catch-up burst
//!   (EventMQ burst). Wall-clock steps do not touch them.
//! * **Cron jobs run on the wall clock**: each is planned for a wall time,
//!   which the loop waits for on the monotonic clock. Every call compares
//!   the two clocks; when they have drifted or stepped apart by more than
//!   [`limits::SCHEDULER_CLOCK_STEP`] (1 s) since the cron jobs were
//!   planned, they are re-planned: after a **forward** step each keeps its
//!   planned time, so a job whose time was jumped over fires once at once
//!   (as after a stall); after a **backward** step each is planned anew for
//!   its first time after the new clock reading, except that a fixed-time
//!   job never fires twice for the same planned time (Vixie cron: "jobs
//!   that fall into the repeated time will not be re-run"). A cron job
//!   never fires before its wall time: one due on the monotonic clock with
//!   the wall clock still behind waits for it. The scheduler's loop turns
//!   at least once per heartbeat interval (3 s), so a step is seen within
//!   that long.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;

use super::key::ScheduleKey;
use super::schedule::{Definition, Kind, ScheduleError};
use crate::limits;

/// The time on both clocks, read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock (interval jobs, sleeping).
    pub mono: Instant,
    /// The wall clock (cron jobs, and what admins see).
    pub wall: DateTime<Utc>,
}

impl Now {
    /// Reads both clocks.
    pub fn read() -> Now {
        Now { mono: Instant::now(), wall: Utc::now() }
    }

    /// The wall time at which the monotonic clock reads `at`, as far as
    /// the clocks agree now.
    pub fn wall_at(&self, at: Instant) -> DateTime<Utc> {
        match at.checked_duration_since(self.mono) {
            Some(ahead) => self.wall + TimeDelta::from_std(ahead).unwrap_or(TimeDelta::MAX),
            None => self.wall - TimeDelta::from_std(self.mono - at).unwrap_or(TimeDelta::MAX),
        }
    }

    /// The monotonic instant at which the wall clock should read `wall`
    /// (now, if that is past).
    pub fn mono_at(&self, wall: DateTime<Utc>) -> Instant {
        let ahead = (wall - self.wall).to_std().unwrap_or(Duration::ZERO);
        self.mono.checked_add(ahead).unwrap_or(self.mono)
    }
}

/// A REQUEST to emit: one firing of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The job's key.
    pub key: ScheduleKey,
    /// frame 4 of the REQUEST.
    pub queue: String,
    /// frame 6 of the REQUEST (docs/emqp.md "The scheduler").
    pub body: String,
}

/// What a SCHEDULE did to the timetable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new key.
    Added,
    /// Same key, another definition: replaced.
    Replaced,
    /// Same key, same definition: nothing changed.
    Unchanged,
    /// `run_count:0`: nothing to run, any job with the key is gone.
    Removed,
}

/// A change the caller must persist after [`Timetable::fire_due`] or
/// [`Timetable::schedule`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Store the job's definition with this many runs left (`None`:
    /// unlimited) and its next fire ([`Timetable::next_of`]): after every
    /// run, and when a SCHEDULE adds or replaces it.
    Put(ScheduleKey, Option<u64>),
    /// The job is gone (finished or removed).
    Delete(ScheduleKey),
}

/// A row of the `SCHEDULES` admin listing.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    /// The key.
    pub key: ScheduleKey,
    /// The queue.
    pub queue: String,
    /// `Some(secs)` for interval jobs.
    pub interval_secs: Option<u64>,
    /// `Some(expr)` for cron jobs.
    pub cron: Option<String>,
    /// The next fire time on the wall clock (for interval jobs, as far as
    /// the clocks agree now).
    pub next_fire: DateTime<Utc>,
    /// Runs left (`None`: unlimited).
    pub runs_left: Option<u64>,
    /// The REQUEST body each run sends.
    pub body: String,
}

#[derive(Debug)]
struct Job {
    def: Definition,
    /// When it fires, on the monotonic clock.
    due: Instant,
    /// Cron jobs: the wall time it is planned for.
    wall: Option<DateTime<Utc>>,
    /// Cron jobs: the planned wall time of its last fire.
    fired: Option<DateTime<Utc>>,
    runs_left: Option<u64>,
    /// Generation of the live heap entry; older heap entries are stale.
    gen: u64,
}

/// The set of schedules, keyed, with a deadline heap. See the module docs.
#[derive(Debug)]
pub struct Timetable {
    jobs: HashMap<ScheduleKey, Job>,
    heap: BinaryHeap<Reverse<(Instant, u64, ScheduleKey)>>,
    gen: u64,
    tz: Tz,
    /// The clocks when the cron jobs were last planned.
    planned: Option<Now>,
}

impl Timetable {
    /// An empty timetable evaluating cron expressions in `tz`.
    pub fn new(tz: Tz) -> Timetable {
        Timetable { jobs: HashMap::new(), heap: BinaryHeap::new(), gen: 0, tz, planned: None }
    }

    /// Number of jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether there are no jobs.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The definition and runs left of a job.
    pub fn get(&self, key: &ScheduleKey) -> Option<(&Definition, Option<u64>)> {
        self.jobs.get(key).map(|j| (&j.def, j.runs_left))
    }

    /// The next fire time of the job with `key` on the wall clock, if
    /// there is one.
    pub fn next_of(&self, key: &ScheduleKey, now: Now) -> Option<DateTime<Utc>> {
        self.jobs.get(key).map(|j| j.wall.unwrap_or_else(|| now.wall_at(j.due)))
    }

    /// Applies a SCHEDULE received at `now` (rules in the module docs).
    /// Returns the outcome, the haste [`Fire`] if any, and the changes to
    /// persist.
    ///
    /// # Errors
    /// [`ScheduleError::BadCron`] when a cron expression never matches after
    /// `now`, [`ScheduleError::TooMany`] for a new key past
    /// [`limits::SCHEDULER_MAX_SCHEDULES`]; the timetable is then unchanged.
    pub fn schedule(
        &mut self,
        def: Definition,
        now: Now,
    ) -> Result<(Outcome, Option<Fire>, Vec<Change>), ScheduleError> {
        self.check_clocks(now);
        let key = def.key.clone();
        if self.jobs.get(&key).is_some_and(|j| j.def.same_definition(&def)) {
            return Ok((Outcome::Unchanged, None, Vec::new()));
        }
        if !self.jobs.contains_key(&key) && self.jobs.len() >= limits::SCHEDULER_MAX_SCHEDULES {
            return Err(ScheduleError::TooMany(self.jobs.len()));
        }
        let (due, wall) = self.first(&def, now)?;
        let existed = self.jobs.remove(&key).is_some();
        let mut runs_left = def.run_count;
        if runs_left == Some(0) {
            let changes = if existed { vec![Change::Delete(key)] } else { Vec::new() };
            return Ok((Outcome::Removed, None, changes));
        }
        let haste = (!def.nohaste).then(|| fire_of(&def));
        if haste.is_some() {
            runs_left = runs_left.map(|n| n - 1);
        }
        let outcome = if existed { Outcome::Replaced } else { Outcome::Added };
        if runs_left == Some(0) {
            let changes = if existed { vec![Change::Delete(key)] } else { Vec::new() };
            return Ok((outcome, haste, changes));
        }
        self.insert(Job { def, due, wall, fired: None, runs_left, gen: 0 });
        Ok((outcome, haste, vec![Change::Put(key, runs_left)]))
    }

    /// Re-adds a persisted job after a restart (EventMQ 0.3.13 never
    /// restored). A restore is not a registration: no haste run, and
    /// `nohaste` plays no part. `next_fire` is the wall time the job was due
    /// next when it was last stored (docs/emqp.md "The scheduler",
    /// "Restarts"):
    /// * passed (the job fell due while the scheduler was down): it fires
    ///   once at once, then keeps its period from that run, as after a
    ///   stall (one run however many were missed, interval and cron alike);
    /// * still ahead: an interval job fires then, but never later than one
    ///   interval from `now` (a wall clock set back while the scheduler was
    ///   down cannot silence it for longer); a cron job at its next time
    ///   after `now`;
    /// * `None` (unknown: an older record): as a new job without its haste
    ///   run, `now + interval` or the next cron time.
    ///
    /// # Errors
    /// As [`Timetable::schedule`].
    pub fn restore(
        &mut self,
        def: Definition,
        runs_left: Option<u64>,
        next_fire: Option<DateTime<Utc>>,
        now: Now,
    ) -> Result<(), ScheduleError> {
        self.check_clocks(now);
        let (mut due, mut wall) = self.first(&def, now)?;
        match (next_fire, &def.kind) {
            (Some(next), Kind::Cron(_)) if next <= now.wall => (due, wall) = (now.mono, Some(next)),
            (Some(next), Kind::Interval { .. }) => due = due.min(now.mono_at(next)),
            _ => {}
        }
        self.jobs.remove(&def.key);
        if runs_left != Some(0) {
            self.insert(Job { def, due, wall, fired: None, runs_left, gen: 0 });
        }
        Ok(())
    }

    /// Removes the job with `key`, interval or cron. Returns
    /// whether there was one.
    pub fn unschedule(&mut self, key: &ScheduleKey) -> bool {
        self.jobs.remove(key).is_some()
    }

    /// Heap entries, live and stale (a diagnostic: stale entries are dropped
    /// lazily, and the heap is rebuilt when they outnumber live jobs).
    pub fn pending_timers(&self) -> usize {
        self.heap.len()
    }

    /// The first deadline of a new or restored job: `now + interval`, or
    /// the next cron time after `now` in the time zone.
    fn first(&self, def: &Definition, now: Now) -> Result<(Instant, Option<DateTime<Utc>>), ScheduleError> {
        match &def.kind {
            Kind::Interval { secs } => Ok((now.mono + interval(*secs), None)),
            Kind::Cron(cron) => {
                let wall = self.cron_after(cron, now.wall)?;
                Ok((now.mono_at(wall), Some(wall)))
            }
        }
    }

    fn cron_after(&self, cron: &super::cron::CronExpr, after: DateTime<Utc>) -> Result<DateTime<Utc>, ScheduleError> {
        cron.next_after(after, self.tz).map_err(|why| ScheduleError::BadCron { expr: cron.as_str().to_string(), why })
    }

    fn insert(&mut self, mut job: Job) {
        if self.heap.len() > 2 * self.jobs.len() + limits::SCHEDULER_STALE_HEAP_ENTRIES {
            self.heap = self.jobs.iter().map(|(k, j)| Reverse((j.due, j.gen, k.clone()))).collect();
        }
        self.gen += 1;
        job.gen = self.gen;
        let key = job.def.key.clone();
        self.heap.push(Reverse((job.due, self.gen, key.clone())));
        self.jobs.insert(key, job);
    }

    /// The earliest deadline on the monotonic clock, dropping stale heap
    /// entries on the way. The caller sleeps until then (or until a message
    /// arrives).
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, gen, key))) = self.heap.peek() {
            if self.jobs.get(key).is_some_and(|j| j.gen == *gen) {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }

    /// Re-plans the cron jobs when the clocks moved apart by more than
    /// [`limits::SCHEDULER_CLOCK_STEP`] since they were planned (module
    /// docs). Returns the step (wall minus monotonic), if there was one.
    pub fn check_clocks(&mut self, now: Now) -> Option<TimeDelta> {
        let Some(planned) = self.planned else {
            self.planned = Some(now);
            return None;
        };
        let mono = TimeDelta::from_std(now.mono.saturating_duration_since(planned.mono)).unwrap_or(TimeDelta::MAX);
        let step = (now.wall - planned.wall) - mono;
        let limit = TimeDelta::from_std(limits::SCHEDULER_CLOCK_STEP).unwrap_or(TimeDelta::MAX);
        if step.abs() <= limit {
            return None;
        }
        tracing::warn!(
            step_ms = step.num_milliseconds(),
            "the wall clock moved against the monotonic clock: cron jobs re-planned"
        );
        self.planned = Some(now);
        let keys: Vec<ScheduleKey> =
            self.jobs.iter().filter(|(_, j)| j.wall.is_some()).map(|(k, _)| k.clone()).collect();
        for key in keys {
            let Some(mut job) = self.jobs.remove(&key) else { continue };
            let (Some(wall), Kind::Cron(cron)) = (job.wall, &job.def.kind) else { continue };
            if step < TimeDelta::zero() {
                let from = match job.fired {
                    Some(fired) if !cron.is_wild() => fired.max(now.wall),
                    _ => now.wall,
                };
                match self.cron_after(cron, from) {
                    Ok(next) => job.wall = Some(next),
                    Err(e) => tracing::warn!(key = %key, error = %e, "cron job cannot be re-planned; keeps its plan"),
                }
            }
            job.due = now.mono_at(job.wall.unwrap_or(wall));
            self.insert(job);
        }
        Some(step)
    }

    /// Fires every job due at `now`, each at most once, and reschedules it.
    /// Returns the REQUESTs to emit and the changes to persist (run counts,
    /// finished jobs, jobs whose cron never matches again).
    pub fn fire_due(&mut self, now: Now) -> (Vec<Fire>, Vec<Change>) {
        self.check_clocks(now);
        let (mut fires, mut changes) = (Vec::new(), Vec::new());
        let mut waiting = Vec::new();
        while let Some(due) = self.next_deadline().filter(|at| *at <= now.mono) {
            let Some(Reverse((_, _, key))) = self.heap.pop() else { break };
            let Some(mut job) = self.jobs.remove(&key) else { continue };
            if let Some(wall) = job.wall.filter(|w| *w > now.wall) {
                // Due on the monotonic clock, not yet on the wall clock.
                job.due = now.mono_at(wall);
                waiting.push(job);
                continue;
            }
            fires.push(fire_of(&job.def));
            job.runs_left = job.runs_left.map(|n| n.saturating_sub(1));
            if job.runs_left == Some(0) {
                changes.push(Change::Delete(key));
                continue;
            }
            match self.advance(&mut job, due, now) {
                Ok(()) => {
                    // Its next fire moved: stored, so a restart keeps the phase.
                    changes.push(Change::Put(key, job.runs_left));
                    self.insert(job);
                }
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "schedule never fires again; removed");
                    changes.push(Change::Delete(key));
                }
            }
        }
        for job in waiting {
            self.insert(job);
        }
        (fires, changes)
    }

    /// Moves a job that fired (due at `due`, fired at `now`) to its next
    /// deadline: fixed rate on the monotonic clock when on time, `now +
    /// interval` after a stall; for cron, the first time after the later
    /// of its planned time and now.
    fn advance(&self, job: &mut Job, due: Instant, now: Now) -> Result<(), ScheduleError> {
        match &job.def.kind {
            Kind::Interval { secs } => {
                let next = due + interval(*secs);
                job.due = if next > now.mono { next } else { now.mono + interval(*secs) };
            }
            Kind::Cron(cron) => {
                let planned = job.wall.unwrap_or(now.wall);
                let next = self.cron_after(cron, planned.max(now.wall))?;
                (job.fired, job.wall, job.due) = (Some(planned), Some(next), now.mono_at(next));
            }
        }
        Ok(())
    }

    /// Every job, earliest next fire first.
    pub fn list(&self, now: Now) -> Vec<JobInfo> {
        let mut rows: Vec<JobInfo> = self
            .jobs
            .values()
            .map(|j| JobInfo {
                key: j.def.key.clone(),
                queue: j.def.queue().to_string(),
                interval_secs: match &j.def.kind {
                    Kind::Interval { secs } => Some(*secs),
                    Kind::Cron(_) => None,
                },
                cron: match &j.def.kind {
                    Kind::Cron(cron) => Some(cron.as_str().to_string()),
                    Kind::Interval { .. } => None,
                },
                next_fire: j.wall.unwrap_or_else(|| now.wall_at(j.due)),
                runs_left: j.runs_left,
                body: j.def.request_body.clone(),
            })
            .collect();
        rows.sort_by(|a, b| (a.next_fire, &a.key).cmp(&(b.next_fire, &b.key)));
        rows
    }
}

fn interval(secs: u64) -> Duration {
    Duration::from_secs(secs.min(limits::SCHEDULER_MAX_INTERVAL_SECS))
}

fn fire_of(def: &Definition) -> Fire {
    Fire { key: def.key.clone(), queue: def.queue().to_string(), body: def.request_body.clone() }
}
