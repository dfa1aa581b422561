//! Output of a bench invocation: a summary table, a JSON record (machine,
//! git revision, date, settings, results), one `.hgrm` file per run
//! (HdrHistogram's classic percentile-distribution text) and an SVG plot.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::run::RunResult;
use super::{ioerr, plot, BenchError};

/// Where and when a run happened.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Host name (`/proc/sys/kernel/hostname`), or "unknown".
    pub host: String,
    /// Cores available to this process.
    pub cores: usize,
    /// CPU model from `/proc/cpuinfo`, or "unknown".
    pub cpu: String,
    /// `git rev-parse --short HEAD` in the working directory, or "unknown".
    pub git_revision: String,
    /// Start of the invocation, RFC 3339, UTC.
    pub date: String,
}

/// Reads the machine description (never fails: unknown parts say "unknown").
pub fn machine() -> Machine {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string());
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
    });
    Machine {
        host: host.unwrap_or_else(|_| "unknown".into()),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cpu: cpu.unwrap_or_else(|| "unknown".into()),
        git_revision: git_revision(),
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }
}

/// The short git revision of the current directory's checkout, or "unknown".
pub fn git_revision() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The JSON record of one invocation.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// Always `emq-bench`.
    pub tool: &'static str,
    /// The mode (`emqp`, `baseline`, `text`, `idle`).
    pub mode: &'a str,
    /// Where and when.
    pub machine: Machine,
    /// Every setting of the run, as given or defaulted.
    pub settings: serde_json::Value,
    /// One entry per run, in order.
    pub results: &'a [RunResult],
    /// Throughput ratios between runs (e.g. `emq/baseline`).
    pub ratios: serde_json::Map<String, serde_json::Value>,
}

/// The summary table: one row per run.
pub fn table(results: &[RunResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<10} {:>8} {:>8} {:>5} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "target", "sent", "recvd", "lost", "jobs/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for r in results {
        let l = &r.latency_ms;
        let _ = writeln!(
            s,
            "{:<10} {:>8} {:>8} {:>5} {:>11.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            r.target, r.sent, r.received, r.lost, r.throughput_per_s, l.p50, l.p90, l.p99, l.p999, l.max
        );
    }
    s
}

/// HdrHistogram's classic percentile distribution of `h` (values recorded
/// in µs, written in ms): `Value Percentile TotalCount 1/(1-Percentile)`,
/// five ticks per half-distance, then the `#[Mean …]` footer.
pub fn hgrm(h: &Histogram<u64>) -> String {
    let mut s = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0;
        if q < 1.0 {
            let _ = writeln!(s, "{value:12.3} {q:2.12} {total:10} {:14.2}", 1.0 / (1.0 - q));
        } else {
            let _ = writeln!(s, "{value:12.3} {q:2.12} {total:10}");
        }
    }
    let _ = writeln!(s, "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]", h.mean() / 1000.0, h.stdev() / 1000.0);
    let _ = writeln!(s, "#[Max     = {:12.3}, Total count    = {:12}]", h.max() as f64 / 1000.0, h.len());
    // HdrHistogram's sub-bucket count: 2^ceil(log2(2 * 10^digits)).
    let sub_buckets = (2 * 10u64.pow(u32::from(h.sigfig()))).next_power_of_two();
    let _ = writeln!(s, "#[Buckets = {:12}, SubBuckets     = {:12}]", h.buckets(), sub_buckets);
    s
}

/// Writes `<dir>/<name>.json`, `<dir>/<name>-<target>.hgrm` per run, and
/// `<dir>/<name>.svg` (all runs overlaid). Returns the paths written.
///
/// # Errors
/// [`BenchError::Io`] naming the path that could not be written.
pub fn write(dir: &Path, name: &str, record: &Record) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(ioerr(format!("create {}", dir.display())))?;
    let mut written = Vec::new();
    let json = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(record).map_err(|e| BenchError::Invalid(e.to_string()))?;
    std::fs::write(&json, text + "\n").map_err(ioerr(format!("write {}", json.display())))?;
    written.push(json);
    let mut series = Vec::new();
    for r in record.results.iter().filter(|r| !r.histogram.is_empty()) {
        let path = dir.join(format!("{name}-{}.hgrm", r.target));
        std::fs::write(&path, hgrm(&r.histogram)).map_err(ioerr(format!("write {}", path.display())))?;
        series.push(plot::Series::from_histogram(&r.target, &r.histogram));
        written.push(path);
    }
    if !series.is_empty() {
        let svg = dir.join(format!("{name}.svg"));
        plot::svg(&series, &format!("{name}: latency by percentile"), &svg)?;
        written.push(svg);
    }
    Ok(written)
}
