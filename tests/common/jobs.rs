//! Reading the file the interop job functions append to
//! (`tests/interop/emq_interop_jobs.py`): one line per event,
//! `<event> <tag> <pid> <jobmanager label> <unix time>`.

use std::collections::BTreeMap;
use std::path::Path;

/// One line of the jobs file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    /// `run` (quick job), `start` or `done` (slow job).
    pub event: String,
    /// The job's tag.
    pub tag: String,
    /// The worker process that ran it.
    pub pid: u32,
    /// The jobmanager's label (`INTEROP_JM`).
    pub jobmanager: String,
    /// When the job wrote the line: Unix time in seconds (`time.time()`).
    pub time: f64,
}

/// Every complete line of the jobs file (none if it does not exist yet).
/// A line being written concurrently is skipped (it has no newline yet).
pub fn read(path: &Path) -> Vec<JobEvent> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() != 5 {
                return None;
            }
            Some(JobEvent {
                event: f[0].into(),
                tag: f[1].into(),
                pid: f[2].parse().ok()?,
                jobmanager: f[3].into(),
                time: f[4].parse().ok()?,
            })
        })
        .collect()
}

/// tag → the jobmanager labels of its `event` lines, in file order.
pub fn by_tag(events: &[JobEvent], event: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event == event) {
        map.entry(e.tag.clone()).or_default().push(e.jobmanager.clone());
    }
    map
}

/// The `event` lines of `tag`, in file order (= time order for one job
/// that runs one at a time, e.g. a scheduled job).
pub fn of_tag<'a>(events: &'a [JobEvent], event: &str, tag: &str) -> Vec<&'a JobEvent> {
    events.iter().filter(|e| e.event == event && e.tag == tag).collect()
}
