//! All schedules and their next fire times: a map by key plus a min-heap of
//! deadlines, so the scheduler sleeps until the earliest one and 10,000 idle
//! schedules cost nothing between fires. Pure logic: every call takes `now`.
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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::key::ScheduleKey;
use super::schedule::{Definition, Kind, ScheduleError};

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
    /// Store the job's definition with this many runs left (`None`: unlimited).
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
    /// The next fire time.
    pub next_fire: DateTime<Utc>,
    /// Runs left (`None`: unlimited).
    pub runs_left: Option<u64>,
    /// The REQUEST body each run sends.
    pub body: String,
}

#[derive(Debug)]
struct Job {
    def: Definition,
    next: DateTime<Utc>,
    runs_left: Option<u64>,
    /// Generation of the live heap entry; older heap entries are stale.
    gen: u64,
}

/// The set of schedules, keyed, with a deadline heap. See the module docs.
#[derive(Debug)]
pub struct Timetable {
    jobs: HashMap<ScheduleKey, Job>,
    heap: BinaryHeap<Reverse<(DateTime<Utc>, u64, ScheduleKey)>>,
    gen: u64,
    tz: Tz,
}

impl Timetable {
    /// An empty timetable evaluating cron expressions in `tz`.
    pub fn new(tz: Tz) -> Timetable {
        Timetable { jobs: HashMap::new(), heap: BinaryHeap::new(), gen: 0, tz }
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

    /// Applies a SCHEDULE received at `now` (rules in the module docs).
    /// Returns the outcome, the haste [`Fire`] if any, and the changes to
    /// persist.
    ///
    /// # Errors
    /// [`ScheduleError::BadCron`] when a cron expression never matches after
    /// `now`; the timetable is then unchanged.
    pub fn schedule(
        &mut self,
        def: Definition,
        now: DateTime<Utc>,
    ) -> Result<(Outcome, Option<Fire>, Vec<Change>), ScheduleError> {
        let key = def.key.clone();
        if self.jobs.get(&key).is_some_and(|j| j.def.same_definition(&def)) {
            return Ok((Outcome::Unchanged, None, Vec::new()));
        }
        let first = def.first_fire(now, self.tz)?;
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
        self.insert(def, first, runs_left);
        Ok((outcome, haste, vec![Change::Put(key, runs_left)]))
    }

    /// Re-adds a persisted job after a restart: no haste run, first fire
    /// computed from `now` (docs/emqp.md "The scheduler"; EventMQ 0.3.13 never restored).
    ///
    /// # Errors
    /// As [`Timetable::schedule`].
    pub fn restore(
        &mut self,
        def: Definition,
        runs_left: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<(), ScheduleError> {
        let first = def.first_fire(now, self.tz)?;
        self.jobs.remove(&def.key);
        if runs_left != Some(0) {
            self.insert(def, first, runs_left);
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

    fn insert(&mut self, def: Definition, next: DateTime<Utc>, runs_left: Option<u64>) {
        if self.heap.len() > 2 * self.jobs.len() + crate::limits::SCHEDULER_STALE_HEAP_ENTRIES {
            self.heap = self.jobs.iter().map(|(k, j)| Reverse((j.next, j.gen, k.clone()))).collect();
        }
        self.gen += 1;
        let key = def.key.clone();
        self.heap.push(Reverse((next, self.gen, key.clone())));
        self.jobs.insert(key, Job { def, next, runs_left, gen: self.gen });
    }

    /// The earliest deadline, dropping stale heap entries on the way. The
    /// caller sleeps until then (or until a message arrives).
    pub fn next_deadline(&mut self) -> Option<DateTime<Utc>> {
        while let Some(Reverse((at, gen, key))) = self.heap.peek() {
            if self.jobs.get(key).is_some_and(|j| j.gen == *gen) {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }

    /// Fires every job due at `now` (deadline ≤ `now`), each at most once,
    /// and reschedules it. Returns the REQUESTs to emit and the changes to
    /// persist (run counts, finished jobs, jobs whose cron never matches
    /// again).
    pub fn fire_due(&mut self, now: DateTime<Utc>) -> (Vec<Fire>, Vec<Change>) {
        let (mut fires, mut changes) = (Vec::new(), Vec::new());
        while let Some(due) = self.next_deadline().filter(|at| *at <= now) {
            let Some(Reverse((_, _, key))) = self.heap.pop() else { break };
            let Some(mut job) = self.jobs.remove(&key) else { continue };
            fires.push(fire_of(&job.def));
            job.runs_left = job.runs_left.map(|n| n.saturating_sub(1));
            if job.runs_left == Some(0) {
                changes.push(Change::Delete(key));
                continue;
            }
            match job.def.next_fire(due, now, self.tz) {
                Ok(next) => {
                    if job.runs_left.is_some() {
                        changes.push(Change::Put(key, job.runs_left));
                    }
                    self.insert(job.def, next, job.runs_left);
                }
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "schedule never fires again; removed");
                    changes.push(Change::Delete(key));
                }
            }
        }
        (fires, changes)
    }

    /// Every job, earliest next fire first.
    pub fn list(&self) -> Vec<JobInfo> {
        let mut rows: Vec<JobInfo> = self
            .jobs
            .values()
            .map(|j| JobInfo {
                key: j.def.key.clone(),
                queue: j.def.queue().to_string(),
                interval_secs: match &j.def.kind {
                    Kind::Interval { secs } => Some(*secs),
                    Kind::Cron { .. } => None,
                },
                cron: match &j.def.kind {
                    Kind::Cron { expr, .. } => Some(expr.clone()),
                    Kind::Interval { .. } => None,
                },
                next_fire: j.next,
                runs_left: j.runs_left,
                body: j.def.request_body.clone(),
            })
            .collect();
        rows.sort_by(|a, b| (a.next_fire, &a.key).cmp(&(b.next_fire, &b.key)));
        rows
    }
}

fn fire_of(def: &Definition) -> Fire {
    Fire { key: def.key.clone(), queue: def.queue().to_string(), body: def.request_body.clone() }
}
