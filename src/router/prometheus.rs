//! `/metrics`: a [`Scrape`] in the Prometheus text exposition format
//! (0.0.4), written by the `prometheus-client` crate's encoder. Names follow
//! Prometheus conventions (`emq_` prefix, units in names, `_total` on
//! counters). Every series carries `router="<router_name>"` first (one
//! value per router: several router names' series stay apart when one
//! Prometheus scrapes them all, docs/admin.md); the other labels are
//! `queue` (at most `metrics_max_queues` values plus `_other`), `reason`,
//! `state`, `kind`, `event` and `code`, each from a fixed set, so the
//! series count is bounded. The metrics are
//! listed in the README ("Metrics and the status page").

use std::borrow::Cow;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::scrape::{latencies, QueueRow, Scrape};
use crate::broker::counts::QueueCounter;
use crate::limits;
use crate::metrics::latency::Kind;

/// The `Content-Type` of the answer.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The exposition text of `scrape`.
pub fn render(scrape: Scrape) -> String {
    let router = [(Cow::Borrowed("router"), Cow::Owned(scrape.router_name.clone()))];
    let mut registry = Registry::with_labels(router.into_iter());
    registry.register_collector(Box::new(Exposition(scrape)));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::warn!(error = %e, "cannot encode the metrics");
    }
    out
}

/// A [`Scrape`] as a collector: encoded once, on the scrape that made it.
#[derive(Debug)]
struct Exposition(Scrape);

/// The per-queue counters: `(metric name without _total, help, counter)`.
const QUEUE_COUNTERS: &[(&str, &str, QueueCounter)] = &[
    ("emq_jobs_accepted", "Jobs the queue accepted (REQUEST or SCHED admitted).", QueueCounter::Accepted),
    (
        "emq_jobs_dispatched",
        "Jobs handed to an eMQP worker or offered to a text consumer (again after a requeue).",
        QueueCounter::Dispatched,
    ),
    (
        "emq_jobs_completed",
        "Jobs whose worker reported a result, or that a text consumer ACKed.",
        QueueCounter::Completed,
    ),
    ("emq_jobs_failed", "Jobs reported failed by an emq worker, or DELeted by a text consumer.", QueueCounter::Failed),
    (
        "emq_jobs_retried",
        "Jobs set back for another try after a back-off (a failed result, a deadline), counted when the back-off begins.",
        QueueCounter::Retried,
    ),
    ("emq_jobs_dead_lettered", "Jobs moved to the dead set, out of retries.", QueueCounter::DeadLettered),
];

/// Refusals by reason: `(reason label, broker counter)`.
const REFUSALS: &[(&str, &str)] = &[
    ("queue_full", "rejected_queue_full"),
    ("shutting_down", "rejected_shutting_down"),
    ("store_full", "rejected_store_full"),
    ("store_failed", "rejected_store_failed"),
    ("no_scheduler", "rejected_no_scheduler"),
    ("bad_request", "rejected_bad_request"),
    ("queue_limit", "rejected_queue_limit"),
    ("too_big", "rejected_too_big"),
];

type Res = Result<(), std::fmt::Error>;

fn gauge<V: EncodeGaugeValue + std::fmt::Debug + Send + Sync>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: V,
) -> Res {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Res {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A family of one label: `(label value, value)` rows.
fn family<V: Copy>(
    enc: &mut DescriptorEncoder,
    (name, help, ty): (&str, &str, MetricType),
    label: &str,
    rows: impl Iterator<Item = (String, V)>,
    write: impl Fn(V, prometheus_client::encoding::MetricEncoder) -> Res,
) -> Res {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (value, v) in rows {
        let labels = [(label, value.as_str())];
        write(v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn per_queue(
    enc: &mut DescriptorEncoder,
    head: (&str, &str, MetricType),
    queues: &[QueueRow],
    pick: impl Fn(&QueueRow) -> u64,
) -> Res {
    let rows = queues.iter().map(|q| (q.name.clone(), pick(q)));
    match head.2 {
        MetricType::Counter => family(enc, head, "queue", rows, |v, m| ConstCounter::new(v).encode(m)),
        _ => family(enc, head, "queue", rows, |v, m| ConstGauge::new(v as i64).encode(m)),
    }
}

/// Prometheus buckets (cumulative counts at each bound in seconds) of a
/// histogram in microseconds, its sum in seconds and its count.
///
/// The encoder takes each bucket's own count (it adds them up), so the
/// counts handed over are per bucket.
fn buckets(h: &hdrhistogram::Histogram<u64>) -> (Vec<(f64, u64)>, f64, u64) {
    let mut out = Vec::with_capacity(limits::METRICS_LATENCY_BUCKETS_SECS.len() + 1);
    let mut below = 0;
    for &bound in limits::METRICS_LATENCY_BUCKETS_SECS {
        let upto = h.count_between(0, (bound * 1e6) as u64);
        out.push((bound, upto.saturating_sub(below)));
        below = upto;
    }
    out.push((f64::INFINITY, h.len().saturating_sub(below)));
    (out, h.mean() * h.len() as f64 / 1e6, h.len())
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> Res {
        let s = &self.0;
        let e = &mut enc;
        gauge(e, "emq_up", "1 while the router runs.", None, 1i64)?;
        gauge(e, "emq_uptime", "Time since the router started.", Some(&Unit::Seconds), s.uptime_secs)?;
        gauge(e, "emq_draining", "1 while the router drains (refuses new work).", None, i64::from(s.draining))?;
        gauge(e, "emq_shards", "Dispatcher shards.", None, s.shards as i64)?;
        gauge(e, "emq_shards_silent", "Shards that did not answer this scrape in time.", None, s.shards_silent as i64)?;
        let info = [("version", env!("CARGO_PKG_VERSION"))];
        e.encode_descriptor("emq_build", "The router's version.", None, MetricType::Info)?.encode_info(&info)?;

        let q = &s.queues;
        per_queue(e, ("emq_jobs_waiting", "Jobs waiting in the queue.", MetricType::Gauge), q, |r| r.waiting)?;
        let in_flight = "Jobs held by eMQP workers or offered to text consumers.";
        per_queue(e, ("emq_jobs_in_flight", in_flight, MetricType::Gauge), q, |r| r.in_flight)?;
        let retrying = "Jobs waiting out a back-off before their next try.";
        per_queue(e, ("emq_jobs_retrying", retrying, MetricType::Gauge), q, |r| r.retrying)?;
        per_queue(e, ("emq_jobs_dead", "Jobs in the dead set.", MetricType::Gauge), q, |r| r.dead)?;
        let dead_bytes = "Bytes of the jobs in the dead set (bounded by dead_max_bytes).";
        gauge(e, "emq_dead_set", dead_bytes, Some(&Unit::Bytes), s.dead_bytes as i64)?;
        for &(name, help, c) in QUEUE_COUNTERS {
            per_queue(e, (name, help, MetricType::Counter), q, |r| r.counts.get(c))?;
        }
        let refused = REFUSALS.iter().map(|(reason, c)| (reason.to_string(), s.counter(c)));
        let head = ("emq_jobs_refused", "Jobs (and ASKs: queue_limit) refused, by reason.", MetricType::Counter);
        family(e, head, "reason", refused, |v, m| ConstCounter::new(v).encode(m))?;
        counter(e, "emq_jobs_requeued", "Jobs put back at the front of their queue.", s.counter("requeued_jobs"))?;
        let folded = "Queues past metrics_max_queues, summed under queue=\"_other\".";
        gauge(e, "emq_metrics_queues_folded", folded, None, s.folded as i64)?;

        for kind in Kind::ALL {
            let (name, help) = match kind {
                Kind::QueueWait => ("emq_job_queue_wait", "Accepted to dispatched (or offered)."),
                Kind::Service => ("emq_job_service", "Dispatched to the worker's result (or the text ACK)."),
                Kind::EndToEnd => ("emq_job_end_to_end", "Accepted to the worker's result (or the text ACK)."),
                // Per shard, not per queue: not a queue family.
                Kind::WalSync => continue,
            };
            let mut m = e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
            for row in q {
                if let Some((_, h)) = latencies(row).find(|(k, _)| *k == kind) {
                    let (b, sum, count) = buckets(h);
                    let labels = [("queue", row.name.as_str())];
                    m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum, count, &b, None)?;
                }
            }
        }

        let states =
            ["live", "draining"].map(|st| (st.to_string(), s.workers.iter().filter(|w| w.state == st).count()));
        let head = ("emq_workers", "Registered eMQP workers, by state.", MetricType::Gauge);
        family(e, head, "state", states.into_iter(), |v, m| ConstGauge::new(v as i64).encode(m))?;
        let slots: i64 = s.workers.iter().map(|w| w.slots.max(0)).sum();
        gauge(e, "emq_worker_free_slots", "Free job slots (READY credits) over every worker.", None, slots)?;
        gauge(e, "emq_schedulers", "Registered schedulers.", None, s.schedulers.len() as i64)?;
        if let Some(t) = &s.text {
            gauge(e, "emq_text_connections", "Open text protocol connections.", None, t.connections_open as i64)?;
            let total = "Text protocol connections accepted (BUSY refusals included).";
            counter(e, "emq_text_connections_accepted", total, t.connections_total)?;
            gauge(e, "emq_text_offers_held", "Text offers unanswered.", None, t.offers_held as i64)?;
            let errors = t.errors.iter().map(|(code, n)| (code.to_string(), *n));
            let head = ("emq_text_errors", "ERR replies to text clients, by code.", MetricType::Counter);
            family(e, head, "code", errors, |v, m| ConstCounter::new(v).encode(m))?;
            let barriers = "Barrier lines (ASK !sync) answered BAD_FORMAT on purpose, not in emq_text_errors.";
            counter(e, "emq_text_barriers", barriers, t.barriers)?;
            let tls = "Connections accepted on the text TLS listener (text_tls).";
            counter(e, "emq_text_tls_connections_accepted", tls, t.tls_connections_total)?;
            counter(e, "emq_text_tls_handshakes", "Text TLS handshakes finished.", t.tls_handshakes)?;
            let failed = "Text TLS connections closed before their handshake finished (not TLS, refused client \
                          certificate, peer closed, text_tls_handshake_timeout).";
            counter(e, "emq_text_tls_handshake_failures", failed, t.tls_handshake_failures)?;
            let auth = [("ok", t.auth_ok), ("failed", t.auth_failed), ("noauth", t.auth_noauth)];
            let head = ("emq_text_auth", "Text AUTH outcomes (text_auth_tokens_file), by result.", MetricType::Counter);
            let rows = auth.into_iter().map(|(r, n)| (r.to_string(), n));
            family(e, head, "result", rows, |v, m| ConstCounter::new(v).encode(m))?;
        }
        if let Some(c) = &s.curve {
            curve_families(e, c)?;
        }
        if !s.logs.is_empty() {
            log_families(e, s)?;
        }
        if let Some(o) = &s.ownership {
            ownership_families(e, o)?;
        }
        let events = s.counters.iter().map(|(k, v)| (k.clone(), *v));
        let head = ("emq_events", "The router's event counters (STATUS emq.counters), by name.", MetricType::Counter);
        family(e, head, "event", events, |v, m| ConstCounter::new(v).encode(m))
    }
}

/// The CURVE endpoints' families (docs/security.md "CURVE", "Counters"):
/// handshakes per socket by outcome, ZAP requests per domain by status,
/// key reloads.
fn curve_families(e: &mut DescriptorEncoder, c: &super::curve::CurveFigures) -> Res {
    let help = "CURVE handshakes on the router's *_curve endpoints, by socket and result \
                (ok, unknown_key, bad_server_key_or_protocol, mechanism_mismatch, no_detail).";
    let mut m = e.encode_descriptor("emq_curve_handshakes", help, None, MetricType::Counter)?;
    for (socket, outcomes) in &c.handshakes {
        for (result, n) in outcomes {
            let labels = [("socket", *socket), ("result", *result)];
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        }
    }
    let help = "ZAP requests answered by the router's handler, by domain and status (200 allowed, 400 refused, \
                500 malformed).";
    let mut m = e.encode_descriptor("emq_zap_requests", help, None, MetricType::Counter)?;
    for (domain, status, n) in &c.zap {
        let status = status.to_string();
        let labels = [("domain", domain.as_str()), ("status", status.as_str())];
        ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
    }
    counter(e, "emq_curve_key_reloads", "RELOAD_KEYS commands that succeeded.", c.reloads)
}

/// The job logs' families (docs/durability.md "Watching it"): bytes and
/// state per shard, the data directory's free space against
/// `disk_free_limit`, errors by kind and repairs.
fn log_families(e: &mut DescriptorEncoder, s: &Scrape) -> Res {
    let shards = || s.logs.iter().enumerate().map(|(i, l)| (i.to_string(), l));
    let head = ("emq_log_bytes", "Bytes of each shard's job log on disk.", MetricType::Gauge);
    family(e, head, "shard", shards().map(|(i, l)| (i, l.bytes)), |v, m| ConstGauge::new(v as i64).encode(m))?;
    let head = ("emq_log_live_jobs", "Jobs each shard's job log holds.", MetricType::Gauge);
    family(e, head, "shard", shards().map(|(i, l)| (i, l.live_jobs)), |v, m| ConstGauge::new(v as i64).encode(m))?;
    let help = "1 for each shard's job log state: ok, disk_alarm, or the kind of its fault (new jobs refused).";
    let mut m = e.encode_descriptor("emq_log_state", help, None, MetricType::Gauge)?;
    for (i, l) in shards() {
        let labels = [("shard", i.as_str()), ("state", l.state.as_str())];
        ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
    }
    if let Some(free) = s.disk_free() {
        let help = "Free bytes of the data directory's file system.";
        gauge(e, "emq_disk_free", help, Some(&Unit::Bytes), free as i64)?;
    }
    if let Some(limit) = s.disk_free_limit {
        let help = "disk_free_limit: below it new jobs are refused (STORE_FULL).";
        gauge(e, "emq_disk_free_limit", help, Some(&Unit::Bytes), limit as i64)?;
    }
    let alarm =
        "1 while new jobs are refused for lack of disk space (below disk_free_limit, or a write found it full).";
    gauge(e, "emq_disk_alarm", alarm, None, i64::from(s.disk_alarm()))?;
    let errors = crate::joblog::FaultKind::ALL
        .iter()
        .map(|k| (k.as_str().to_string(), s.logs.iter().map(|l| l.errors[k.index()]).sum::<u64>()));
    let head = ("emq_log_errors", "Job log faults (a failed write, sync or check), by kind.", MetricType::Counter);
    family(e, head, "kind", errors, |v, m| ConstCounter::new(v).encode(m))?;
    let repairs = s.logs.iter().map(|l| l.repairs).sum();
    counter(e, "emq_log_repairs", "Faulty job logs repaired (written again or rebuilt from memory).", repairs)?;
    store_families(e, s)
}

/// The replicated store's families (`durability = "replicated"`,
/// docs/replicated.md "Watching it"), summed over the shards.
fn store_families(e: &mut DescriptorEncoder, s: &Scrape) -> Res {
    let stores: Vec<&crate::joblog::StoreFigures> = s.logs.iter().filter_map(|l| l.store.as_ref()).collect();
    if stores.is_empty() {
        return Ok(());
    }
    let sum = |f: fn(&crate::joblog::StoreFigures) -> u64| stores.iter().map(|s| f(s)).sum::<u64>();
    counter(e, "emq_store_published", "Messages (batches of records) published to JetStream.", sum(|s| s.published))?;
    counter(
        e,
        "emq_store_retries",
        "Publishes retried (timeout, no responders, lost connection).",
        sum(|s| s.retries),
    )?;
    counter(e, "emq_store_give_ups", "Publishes not confirmed within nats_give_up.", sum(|s| s.give_ups))?;
    let refused = "Jobs refused (STORE_FAILED) because the store did not confirm their batch.";
    counter(e, "emq_store_refused_jobs", refused, sum(|s| s.refused_jobs))?;
    let unconfirmed = "Batches handed to JetStream and not yet confirmed.";
    gauge(e, "emq_store_unconfirmed_batches", unconfirmed, None, sum(|s| s.unconfirmed_batches) as i64)?;
    counter(e, "emq_store_purges", "Purges of done records sent to the streams.", sum(|s| s.purges))?;
    let last = stores.iter().map(|s| s.last_purge_unix_ms).max().unwrap_or(0) as f64 / 1000.0;
    let help = "When the last purge of done records was sent (Unix time; 0: never).";
    gauge(e, "emq_store_last_purge_timestamp", help, Some(&Unit::Seconds), last)?;
    let mut ack = crate::metrics::latency::new_histogram();
    for h in stores.iter().filter_map(|s| s.ack_us.as_ref()) {
        let _ = ack.add(h);
    }
    let help = "Publish to PubAck, retries included (what an acknowledgement waits for).";
    let mut m = e.encode_descriptor("emq_store_ack", help, Some(&Unit::Seconds), MetricType::Histogram)?;
    let (b, total, count) = buckets(&ack);
    m.encode_histogram::<NoLabelSet>(total, count, &b, None)?;
    Ok(())
}

/// The router name's ownership (docs/replicated.md "Watching a
/// take-over"): one `emq_router_role` gauge per role, 1 for the current
/// one; the lease's age; names taken.
fn ownership_families(e: &mut DescriptorEncoder, o: &crate::jslog::ownership::OwnershipFigures) -> Res {
    use crate::jslog::ownership::Role;
    let help = "1 for this router's role for its name (starting, standby, replaying, owner, fenced), 0 for the others.";
    let rows = Role::ALL.into_iter().map(|r| (r.as_str().to_string(), i64::from(o.role == r)));
    family(e, ("emq_router_role", help, MetricType::Gauge), "role", rows, |v, m| ConstGauge::new(v).encode(m))?;
    if let Some(age) = o.lease_age {
        let help = "Time since the name's lease was last renewed by its holder (this router's own while it owns it).";
        gauge(e, "emq_router_lease_age", help, Some(&Unit::Seconds), age.as_secs_f64())?;
    }
    counter(
        e,
        "emq_router_takeovers",
        "Router names taken by this process (a free name taken at start counts).",
        o.takeovers,
    )?;
    gauge(
        e,
        "emq_router_epoch",
        "The lease revision this router took its name at (0: not taken).",
        None,
        o.epoch as i64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::latency::new_histogram;

    #[test]
    fn names_labels_and_histogram_buckets() {
        let mut h = new_histogram();
        for ms in [2u64, 20, 200] {
            h.record(ms * 1000).unwrap();
        }
        let mut row = QueueRow { name: "mail".into(), waiting: 3, in_flight: 1, dead: 2, ..QueueRow::default() };
        row.counts.add(QueueCounter::Accepted, 7);
        row.latency[Kind::EndToEnd as usize] = Some(h);
        let scrape = Scrape {
            router_name: "r1".into(),
            queues: vec![row],
            counters: vec![("rejected_queue_full".into(), 2)],
            dead_bytes: 300,
            ..Scrape::default()
        };
        let text = render(scrape);
        for line in [
            "emq_jobs_accepted_total{router=\"r1\",queue=\"mail\"} 7",
            "emq_jobs_waiting{router=\"r1\",queue=\"mail\"} 3",
            "emq_jobs_in_flight{router=\"r1\",queue=\"mail\"} 1",
            "emq_jobs_dead{router=\"r1\",queue=\"mail\"} 2",
            "emq_dead_set_bytes{router=\"r1\"} 300",
            "emq_jobs_refused_total{router=\"r1\",reason=\"queue_full\"} 2",
            "# TYPE emq_job_end_to_end_seconds histogram",
            "emq_job_end_to_end_seconds_bucket{router=\"r1\",queue=\"mail\",le=\"0.001\"} 0",
            "emq_job_end_to_end_seconds_bucket{router=\"r1\",queue=\"mail\",le=\"0.0025\"} 1",
            "emq_job_end_to_end_seconds_bucket{router=\"r1\",queue=\"mail\",le=\"0.25\"} 3",
            "emq_job_end_to_end_seconds_bucket{router=\"r1\",queue=\"mail\",le=\"+Inf\"} 3",
            "emq_job_end_to_end_seconds_count{router=\"r1\",queue=\"mail\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        // Every series names the router, first.
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
        assert!(series.len() > 20, "{text}");
        for l in series {
            let name_end = l.find('{').unwrap_or(l.len());
            assert!(l[name_end..].starts_with("{router=\"r1\""), "{l}");
        }
    }

    #[test]
    fn curve_handshakes_and_zap_requests_by_label() {
        let curve = crate::router::curve::CurveFigures {
            handshakes: vec![("backend", vec![("ok", 2), ("unknown_key", 3)])],
            zap: vec![("backend".into(), 400, 3), ("backend".into(), 200, 2)],
            reloads: 1,
        };
        let text = render(Scrape { curve: Some(curve), router_name: "r1".into(), ..Scrape::default() });
        for line in [
            "emq_curve_handshakes_total{router=\"r1\",socket=\"backend\",result=\"ok\"} 2",
            "emq_curve_handshakes_total{router=\"r1\",socket=\"backend\",result=\"unknown_key\"} 3",
            "emq_zap_requests_total{router=\"r1\",domain=\"backend\",status=\"400\"} 3",
            "emq_zap_requests_total{router=\"r1\",domain=\"backend\",status=\"200\"} 2",
            "emq_curve_key_reloads_total{router=\"r1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!render(Scrape::default()).contains("emq_curve"));
    }

    #[test]
    fn the_router_names_ownership() {
        use crate::jslog::ownership::{OwnershipFigures, Role};
        let ownership = Some(OwnershipFigures {
            role: Role::Standby,
            lease_age: Some(std::time::Duration::from_millis(2500)),
            takeovers: 0,
            epoch: 0,
        });
        let text = render(Scrape { ownership, router_name: "r1".into(), ..Scrape::default() });
        for line in [
            "emq_router_role{router=\"r1\",role=\"standby\"} 1",
            "emq_router_role{router=\"r1\",role=\"owner\"} 0",
            "emq_router_role{router=\"r1\",role=\"fenced\"} 0",
            "emq_router_lease_age_seconds{router=\"r1\"} 2.5",
            "emq_router_takeovers_total{router=\"r1\"} 0",
            "emq_router_epoch{router=\"r1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(!render(Scrape::default()).contains("emq_router_role"), "no name, no ownership families");
    }

    #[test]
    fn the_job_logs_state_free_space_and_errors() {
        use crate::joblog::{FaultKind, LogFigures, LogState};
        let mut errors = [0; FaultKind::ALL.len()];
        errors[FaultKind::Full.index()] = 3;
        let logs = vec![
            LogFigures { bytes: 4096, live_jobs: 2, free_bytes: Some(1000), ..LogFigures::default() },
            LogFigures {
                bytes: 100,
                state: LogState::Faulty(FaultKind::Full),
                errors,
                free_bytes: Some(900),
                repairs: 1,
                ..LogFigures::default()
            },
        ];
        let text = render(Scrape { logs, disk_free_limit: Some(5000), router_name: "r1".into(), ..Scrape::default() });
        for line in [
            "emq_log_bytes{router=\"r1\",shard=\"0\"} 4096",
            "emq_log_live_jobs{router=\"r1\",shard=\"0\"} 2",
            "emq_log_state{router=\"r1\",shard=\"0\",state=\"ok\"} 1",
            "emq_log_state{router=\"r1\",shard=\"1\",state=\"full\"} 1",
            "emq_disk_free_bytes{router=\"r1\"} 900",
            "emq_disk_free_limit_bytes{router=\"r1\"} 5000",
            "emq_disk_alarm{router=\"r1\"} 1",
            "emq_log_errors_total{router=\"r1\",kind=\"full\"} 3",
            "emq_log_errors_total{router=\"r1\",kind=\"gone\"} 0",
            "emq_log_repairs_total{router=\"r1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let memory = render(Scrape::default());
        assert!(!memory.contains("emq_log_") && !memory.contains("emq_disk_"), "no log, no log families");
    }
}
