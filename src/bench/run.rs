//! One measured run: drive a load, show progress, turn the tally into a
//! [`RunResult`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::body::Tally;
use super::LoadSettings;

/// Latency percentiles of one run, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// From a histogram in microseconds.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// The outcome of one run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Label of the target (`emq`, `baseline`, `python`, `text`, …).
    pub target: String,
    /// Measured jobs sent (after warm-up).
    pub sent: u64,
    /// Measured jobs received by a worker or consumer.
    pub received: u64,
    /// Measured jobs never received (sent − received).
    pub lost: u64,
    /// Jobs received more than once (should be 0).
    pub duplicates: u64,
    /// Acceptance REPLYs counted (eMQP; warm-up included).
    pub accepted: u64,
    /// ERRORs or `ERR` lines (warm-up included).
    pub errors: u64,
    /// Warm-up jobs sent (not measured).
    pub warmup_sent: u64,
    /// Seconds from the first measured send to the last measured receipt.
    pub elapsed_s: f64,
    /// Measured jobs received per second over `elapsed_s`.
    pub throughput_per_s: f64,
    /// Send → receipt by the worker/consumer.
    pub latency_ms: Percentiles,
    /// Send → acceptance REPLY (absent when the target sent none).
    pub ack_latency_ms: Option<Percentiles>,
    /// Extra figures of the mode (e.g. broker CPU for idle runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
    /// The latency histogram (µs), written to the `.hgrm` file.
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

impl RunResult {
    /// Builds the result of target `name` from the merged tally.
    pub fn from_tally(name: &str, t: &Tally) -> RunResult {
        let start = t.first_send_ns.unwrap_or(0);
        let elapsed_s = t.last_receipt_ns.saturating_sub(start) as f64 / 1e9;
        RunResult {
            target: name.to_string(),
            sent: t.sent,
            received: t.received,
            lost: t.sent.saturating_sub(t.received),
            duplicates: t.duplicates,
            accepted: t.accepted,
            errors: t.errors,
            warmup_sent: t.warmup_sent,
            elapsed_s,
            throughput_per_s: if elapsed_s > 0.0 { t.received as f64 / elapsed_s } else { 0.0 },
            latency_ms: Percentiles::of(&t.latency),
            ack_latency_ms: (!t.ack_latency.is_empty()).then(|| Percentiles::of(&t.ack_latency)),
            extra: None,
            histogram: t.latency.clone(),
        }
    }
}

/// Runs `load` with a progress bar fed by the counter `load` is given. The
/// bar appears after 2 s (short runs stay quiet), on stderr, only when it
/// is a terminal, and never with `--no-progress`.
pub fn with_progress<T>(name: &str, settings: &LoadSettings, load: impl FnOnce(Arc<AtomicU64>) -> T) -> T {
    with_progress_to(name, settings.no_progress, settings.request_bound(), load)
}

/// [`with_progress`] for a load counted up to `bound` (a spinner when
/// `None`); `hidden` is `--no-progress`.
pub fn with_progress_to<T>(name: &str, hidden: bool, bound: Option<u64>, load: impl FnOnce(Arc<AtomicU64>) -> T) -> T {
    let counter = Arc::new(AtomicU64::new(0));
    if hidden || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return load(counter);
    }
    let bar = match bound {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(name.to_string());
    let done = Arc::new(AtomicBool::new(false));
    let (c, d, b) = (counter.clone(), done.clone(), bar.clone());
    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    let ticker = std::thread::spawn(move || {
        let shown_at = std::time::Instant::now() + Duration::from_secs(2);
        let mut shown = false;
        while !d.load(Ordering::Acquire) {
            if !shown && std::time::Instant::now() >= shown_at {
                b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                shown = true;
            }
            b.set_position(c.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let out = load(counter);
    done.store(true, Ordering::Release);
    let _ = ticker.join();
    bar.finish_and_clear();
    out
}
