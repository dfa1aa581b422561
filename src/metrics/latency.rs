//! Per-queue latency histograms (HdrHistogram).
//!
//! Three figures per queue, in microseconds:
//! * `queue_wait`: accepted by the broker → dispatched to a worker (or
//!   offered to a text client);
//! * `service`: dispatched → the worker's job-result REPLY (or the text ACK);
//! * `end_to_end`: accepted → REPLY (or ACK).
//!
//! Each shard records into plain histograms it owns ([`ShardLatency`]), so
//! recording is one array increment on the hot path and needs no lock. The
//! reporter and the admin `LATENCY` command ask every shard to hand over
//! what it recorded since the last time and merge it into a
//! [`LatencyStore`] (cumulative since start, plus the current interval).
//! The broker measures from its own vantage point: it cannot see the
//! client → broker and broker → worker network hops that emq-bench includes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::ids::{FastMap, QueueName};
use crate::limits;

/// Which latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Accepted → dispatched or offered.
    QueueWait,
    /// Dispatched → REPLY or ACK.
    Service,
    /// Accepted → REPLY or ACK.
    EndToEnd,
    /// One sync of a shard's write-ahead log (recorded per shard, under the
    /// name `shard-<n>` instead of a queue).
    WalSync,
}

impl Kind {
    /// Every kind, in index order.
    pub const ALL: [Kind; 3] = [Kind::QueueWait, Kind::Service, Kind::EndToEnd];

    /// The JSON key and file-name part.
    pub fn name(self) -> &'static str {
        match self {
            Kind::QueueWait => "queue_wait",
            Kind::Service => "service",
            Kind::EndToEnd => "end_to_end",
            Kind::WalSync => "wal_sync",
        }
    }
}

/// A histogram of microseconds from 1 µs to [`limits::LATENCY_MAX_US`] with
/// two significant digits (1% resolution, ~26 KiB).
pub fn new_histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, limits::LATENCY_MAX_US, 2) {
        Ok(h) => h,
        Err(e) => unreachable!("constant histogram bounds are valid: {e:?}"),
    }
}

/// Histograms recorded by one shard since the last [`ShardLatency::take`].
#[derive(Debug, Default)]
pub struct ShardLatency {
    /// Per queue, one histogram per [`Kind`] (indexed by `Kind as usize`).
    hists: FastMap<QueueName, [Histogram<u64>; 3]>,
    /// Queues forgotten since the last take, for the store to drop too (at
    /// most [`FORGOTTEN_MAX`]; past it `forgot_unlisted` is set instead).
    forgotten: Vec<QueueName>,
    /// More queues were forgotten since the last take than `forgotten`
    /// holds.
    forgot_unlisted: bool,
}

/// Most forgotten queue names a shard keeps for the next take.
pub const FORGOTTEN_MAX: usize = 10_000;

/// The name under which queues past [`limits::LATENCY_MAX_QUEUES_PER_SHARD`]
/// are recorded together.
pub const OTHER_QUEUES: &[u8] = b"*";

/// What a shard hands over: what it recorded, `((queue, kind), histogram)`,
/// and the queues it forgot since (the store drops their figures first).
#[derive(Debug, Default)]
pub struct Taken {
    /// Recorded since the last take.
    pub hists: Vec<((String, Kind), Histogram<u64>)>,
    /// Queues forgotten since the last take.
    pub forgotten: Vec<String>,
    /// More queues were forgotten than `forgotten` lists: the store then
    /// drops every queue of this shard that has nothing in `hists`
    /// (including idle queues still known: their figures start afresh).
    pub forgot_unlisted: bool,
    /// The shard that handed it over and the number of shards (which queues
    /// are this shard's), `(0, 1)` by default.
    pub shard: (usize, usize),
}

impl ShardLatency {
    /// Records `d` for `queue`. Values past the maximum are clamped.
    pub fn record(&mut self, queue: &[u8], kind: Kind, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, limits::LATENCY_MAX_US);
        // Look up before inserting: no allocation per record.
        if let Some(h) = self.hists.get_mut(queue) {
            let _ = h[kind as usize].record(us);
            return;
        }
        // Past the per-shard cap, further queues share one entry, `*`.
        let name = if self.hists.len() < limits::LATENCY_MAX_QUEUES_PER_SHARD { queue } else { OTHER_QUEUES };
        let h = self
            .hists
            .entry(QueueName::from(name))
            .or_insert_with(|| [new_histogram(), new_histogram(), new_histogram()]);
        let _ = h[kind as usize].record(us);
    }

    /// Drops what was recorded for `queue` (a forgotten queue).
    pub fn forget(&mut self, queue: &[u8]) {
        self.hists.remove(queue);
        if self.forgotten.len() < FORGOTTEN_MAX {
            self.forgotten.push(QueueName::from(queue));
        } else {
            self.forgot_unlisted = true;
        }
    }

    /// Hands over everything recorded so far and starts afresh.
    pub fn take(&mut self) -> Taken {
        let kinds = [Kind::QueueWait, Kind::Service, Kind::EndToEnd];
        let forgotten = self.forgotten.drain(..).map(|q| q.to_string()).collect();
        let hists = self
            .hists
            .drain()
            .flat_map(|(q, hs)| {
                let name = q.to_string();
                kinds.into_iter().zip(hs).filter(|(_, h)| !h.is_empty()).map(move |(k, h)| ((name.clone(), k), h))
            })
            .collect();
        let forgot_unlisted = std::mem::take(&mut self.forgot_unlisted);
        Taken { hists, forgotten, forgot_unlisted, shard: (0, 1) }
    }
}

/// Merged histograms: cumulative since start and the current interval, for
/// at most [`limits::LATENCY_MAX_QUEUES`] queues each (past it the queues
/// with the fewest jobs recorded are dropped).
#[derive(Debug, Default)]
pub struct LatencyStore {
    cumulative: BTreeMap<(String, Kind), Histogram<u64>>,
    interval: BTreeMap<(String, Kind), Histogram<u64>>,
}

impl LatencyStore {
    /// Drops the figures of queues the shard forgot, then adds what it
    /// handed over.
    pub fn merge(&mut self, taken: Taken) {
        if taken.forgot_unlisted {
            // Too many forgotten to list (a burst of one-off names): keep only
            // this shard's queues recorded now, so none of them stays stale.
            let (index, shards) = taken.shard;
            let fresh: std::collections::BTreeSet<&str> = taken.hists.iter().map(|((q, _), _)| q.as_str()).collect();
            let other = std::str::from_utf8(OTHER_QUEUES).unwrap_or("*");
            for map in [&mut self.cumulative, &mut self.interval] {
                map.retain(|(q, _), _| {
                    fresh.contains(q.as_str()) || q == other || crate::ids::shard_of(q.as_bytes(), shards) != index
                });
            }
        }
        for mut queue in taken.forgotten {
            for kind in [Kind::QueueWait, Kind::Service, Kind::EndToEnd] {
                let key = (queue, kind);
                self.cumulative.remove(&key);
                self.interval.remove(&key);
                queue = key.0;
            }
        }
        for (key, h) in taken.hists {
            for map in [&mut self.cumulative, &mut self.interval] {
                let _ = map.entry(key.clone()).or_insert_with(new_histogram).add(&h);
            }
        }
        for map in [&mut self.cumulative, &mut self.interval] {
            keep_busiest(map, limits::LATENCY_MAX_QUEUES);
        }
    }

    /// Takes the interval histograms (for the periodic report).
    pub fn take_interval(&mut self) -> BTreeMap<(String, Kind), Histogram<u64>> {
        std::mem::take(&mut self.interval)
    }

    /// Every histogram since start, by queue and kind.
    pub fn cumulative(&self) -> &BTreeMap<(String, Kind), Histogram<u64>> {
        &self.cumulative
    }

    /// Per queue, the cumulative end-to-end p50 and p99 in milliseconds.
    pub fn end_to_end_ms(&self) -> BTreeMap<String, (f64, f64)> {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        self.cumulative
            .iter()
            .filter(|((_, kind), _)| *kind == Kind::EndToEnd)
            .map(|((queue, _), h)| (queue.clone(), (ms(h, 0.5), ms(h, 0.99))))
            .collect()
    }

    /// Cumulative percentiles as JSON: `{"queues": {q: {kind: {count,
    /// mean_us, p50_us, p90_us, p99_us, p999_us, max_us}}}, "wal_sync":
    /// {"shard-<n>": {…}}, "unit": "us"}`.
    pub fn to_json(&self) -> Value {
        let mut queues: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
        let mut wal_sync = Map::new();
        for ((q, k), h) in &self.cumulative {
            if *k == Kind::WalSync {
                wal_sync.insert(q.clone(), summary(h));
            } else {
                queues.entry(q.clone()).or_default().insert(k.name().into(), summary(h));
            }
        }
        json!({ "unit": "us", "queues": queues, "wal_sync": wal_sync })
    }
}

/// Drops the queues with the fewest jobs recorded until `map` holds at most
/// `max` queues.
fn keep_busiest(map: &mut BTreeMap<(String, Kind), Histogram<u64>>, max: usize) {
    let mut jobs: BTreeMap<&str, u64> = BTreeMap::new();
    for ((q, _), h) in map.iter() {
        *jobs.entry(q.as_str()).or_default() += h.len();
    }
    if jobs.len() <= max {
        return;
    }
    let mut by_jobs: Vec<(u64, String)> = jobs.into_iter().map(|(q, n)| (n, q.to_string())).collect();
    by_jobs.sort_unstable();
    let excess = by_jobs.len() - max;
    let fewest: std::collections::HashSet<String> = by_jobs.into_iter().take(excess).map(|(_, q)| q).collect();
    map.retain(|(q, _), _| !fewest.contains(q));
}

/// Count, mean and percentiles of `h` as JSON (microseconds).
pub fn summary(h: &Histogram<u64>) -> Value {
    json!({
        "count": h.len(),
        "mean_us": (h.mean() * 10.0).round() / 10.0,
        "p50_us": h.value_at_quantile(0.5),
        "p90_us": h.value_at_quantile(0.9),
        "p99_us": h.value_at_quantile(0.99),
        "p999_us": h.value_at_quantile(0.999),
        "max_us": h.max(),
    })
}

/// Writes `h` in HdrHistogram's classic percentile-distribution text format
/// (`Value Percentile TotalCount 1/(1-Percentile)`), values in
/// milliseconds, as `.hgrm` files that the usual plotters read.
///
/// # Errors
/// The I/O error of writing `out`.
pub fn write_hgrm(h: &Histogram<u64>, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "{:>12} {:>14} {:>10} {:>14}\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)")?;
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let p = v.quantile_iterated_to();
        let value_ms = v.value_iterated_to() as f64 / 1000.0;
        if p < 1.0 {
            writeln!(out, "{value_ms:>12.3} {p:>14.12} {total:>10} {:>14.2}", 1.0 / (1.0 - p))?;
        } else {
            writeln!(out, "{value_ms:>12.3} {p:>14.12} {total:>10}")?;
        }
    }
    let ms = |us: f64| us / 1000.0;
    writeln!(out, "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]", ms(h.mean()), ms(h.stdev()))?;
    writeln!(out, "#[Max     = {:>12.3}, Total count    = {:>12}]", ms(h.max() as f64), h.len())?;
    writeln!(out, "#[Buckets = {:>12}, SubBuckets     = {:>12}]", h.buckets(), h.distinct_values())
}

/// Writes one `.hgrm` file per histogram into `dir` as
/// `<unix-seconds>-<queue>-<kind>.hgrm` (queue names sanitised).
///
/// # Errors
/// The first I/O error.
pub fn write_interval_files(dir: &Path, hists: &BTreeMap<(String, Kind), Histogram<u64>>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    for ((q, k), h) in hists {
        let safe: String =
            q.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
        let mut f = std::fs::File::create(dir.join(format!("{stamp}-{safe}-{}.hgrm", k.name())))?;
        write_hgrm(h, &mut f)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_busiest_queues() {
        let mut s = ShardLatency::default();
        for (q, jobs) in [("a", 3), ("b", 1), ("c", 2)] {
            for _ in 0..jobs {
                s.record(q.as_bytes(), Kind::EndToEnd, Duration::from_millis(1));
            }
        }
        let mut map = BTreeMap::new();
        for (key, h) in s.take().hists {
            map.insert(key, h);
        }
        keep_busiest(&mut map, 2);
        let names: Vec<&str> = map.keys().map(|(q, _)| q.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
    }

    #[test]
    fn a_forgotten_queue_leaves_the_store_at_the_next_take() {
        let mut s = ShardLatency::default();
        s.record(b"gone", Kind::EndToEnd, Duration::from_millis(1));
        s.record(b"kept", Kind::EndToEnd, Duration::from_millis(1));
        let mut store = LatencyStore::default();
        store.merge(s.take());
        s.forget(b"gone");
        store.merge(s.take());
        assert_eq!(store.end_to_end_ms().keys().collect::<Vec<_>>(), ["kept"]);
        assert!(store.take_interval().keys().all(|(q, _)| q == "kept"));
    }

    #[test]
    fn past_forgotten_max_the_store_keeps_only_what_the_shard_recorded_since() {
        let mut s = ShardLatency::default();
        for q in ["stale", "busy"] {
            s.record(q.as_bytes(), Kind::EndToEnd, Duration::from_millis(1));
        }
        let mut store = LatencyStore::default();
        store.merge(s.take());
        for i in 0..FORGOTTEN_MAX {
            s.forget(format!("one-off-{i}").as_bytes());
        }
        s.forget(b"stale");
        s.record(b"busy", Kind::EndToEnd, Duration::from_millis(1));
        let taken = s.take();
        assert!(taken.forgot_unlisted && !taken.forgotten.iter().any(|q| q == "stale"));
        store.merge(taken);
        assert_eq!(store.end_to_end_ms().keys().collect::<Vec<_>>(), ["busy"]);
        assert!(!s.take().forgot_unlisted, "once per overflow");
    }

    #[test]
    fn record_take_merge() {
        let mut s = ShardLatency::default();
        let q = QueueName::named("default");
        for ms in 1..=100 {
            s.record(&q.0, Kind::EndToEnd, Duration::from_millis(ms));
        }
        let mut store = LatencyStore::default();
        store.merge(s.take());
        assert!(s.take().hists.is_empty());
        let (p50_ms, _) = store.end_to_end_ms()["default"];
        assert!((49.0..=51.0).contains(&p50_ms), "{p50_ms}");
        let j = store.to_json();
        let e = &j["queues"]["default"]["end_to_end"];
        assert_eq!(e["count"], 100);
        let p50 = e["p50_us"].as_u64().unwrap();
        assert!((49_000..=51_000).contains(&p50), "{p50}");
        let mut out = Vec::new();
        write_hgrm(&store.take_interval()[&("default".into(), Kind::EndToEnd)], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Total count    =          100"), "{text}");
    }
}
