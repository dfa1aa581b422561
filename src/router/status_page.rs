//! The status page (`GET /` of the HTTP server): one self-contained HTML
//! page of a [`Scrape`] (no script, no external asset: style inline, the
//! latency plot inline SVG). It reloads itself every
//! [`limits::STATUS_PAGE_REFRESH`] and is read-only.
//!
//! Sections: the router (version, uptime, state), queues (counts, rates
//! since the page's previous load, end-to-end percentiles), the end-to-end
//! latency of each queue by percentile as SVG (the plot of `emq-bench
//! plot`, [`crate::bench::plot`]), workers, and the dead set.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Instant;

use super::scrape::{QueueRow, Scrape};
use crate::bench::plot::{self, Series};
use crate::broker::counts::QueueCounter;
use crate::limits;
use crate::metrics::latency::Kind;

/// Totals of the previous load, to show rates: `(when, queue → (accepted,
/// completed, failed))`.
#[derive(Debug, Default)]
pub struct Rates {
    last: Option<(Instant, HashMap<String, [u64; 3]>)>,
}

impl Rates {
    /// Per queue `[accepted, completed, failed]` per second since the last
    /// call (`None` on the first), and remembers `scrape` for the next.
    fn per_second(&mut self, scrape: &Scrape, now: Instant) -> HashMap<String, [f64; 3]> {
        let totals: HashMap<String, [u64; 3]> = scrape
            .queues
            .iter()
            .map(|q| {
                let c = |k| q.counts.get(k);
                (q.name.clone(), [c(QueueCounter::Accepted), c(QueueCounter::Completed), c(QueueCounter::Failed)])
            })
            .collect();
        let mut out = HashMap::new();
        if let Some((then, before)) = &self.last {
            let secs = now.saturating_duration_since(*then).as_secs_f64();
            if secs > 0.0 {
                for (q, now_n) in &totals {
                    let was = before.get(q).copied().unwrap_or_default();
                    let r = |i: usize| now_n[i].saturating_sub(was[i]) as f64 / secs;
                    out.insert(q.clone(), [r(0), r(1), r(2)]);
                }
            }
        }
        self.last = Some((now, totals));
        out
    }
}

/// `text` with the HTML special characters escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse;font-size:.9em}th,td{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}\
.note{color:#666;font-size:.9em}.bad{color:#b00}";

/// Milliseconds of a histogram in µs at quantile `q`, as text.
fn ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> String {
    format!("{:.2}", h.value_at_quantile(q) as f64 / 1000.0)
}

fn end_to_end(row: &QueueRow) -> Option<&hdrhistogram::Histogram<u64>> {
    row.latency[Kind::EndToEnd as usize].as_ref().filter(|h| !h.is_empty())
}

/// The page of `scrape`; `rates` holds the previous load's totals.
pub fn render(scrape: &Scrape, rates: &mut Rates) -> String {
    let per_second = rates.per_second(scrape, Instant::now());
    let mut o = String::with_capacity(limits::STATUS_PAGE_MAX_ROWS * 256);
    let refresh = limits::STATUS_PAGE_REFRESH.as_secs();
    let _ = write!(
        o,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{refresh}\"><title>emq status</title><style>{STYLE}</style></head><body>"
    );
    let mut refusals: Vec<String> = scrape
        .logs
        .iter()
        .filter_map(|l| match l.state {
            crate::joblog::LogState::Ok => None,
            crate::joblog::LogState::Alarm => Some(crate::joblog::StoreFault::Full),
            crate::joblog::LogState::Faulty(kind) => Some(kind.refusal()),
        })
        .map(|r| r.code().to_ascii_lowercase())
        .collect();
    refusals.sort_unstable();
    refusals.dedup();
    let state = if scrape.draining {
        "<span class=\"bad\">draining</span>".to_string()
    } else if refusals.is_empty() {
        "accepting jobs".to_string()
    } else {
        format!("<span class=\"bad\">refusing new jobs ({})</span>", refusals.join(", "))
    };
    let _ = write!(
        o,
        "<h1>emq {}</h1><p id=\"router\">{} shard(s), up {:.0} s, {state}; {} worker(s), {} scheduler(s){}. \
         <span class=\"note\">Reloads every {refresh} s; <a href=\"/metrics\">/metrics</a>.</span></p>",
        env!("CARGO_PKG_VERSION"),
        scrape.shards,
        scrape.uptime_secs,
        scrape.workers.len(),
        scrape.schedulers.len(),
        scrape.text.as_ref().map_or(String::new(), |t| format!(", {} text connection(s)", t.connections_open)),
    );
    if let Some(t) =
        scrape.text.as_ref().filter(|t| t.tls_connections_total + t.auth_ok + t.auth_failed + t.auth_noauth > 0)
    {
        let _ = write!(
            o,
            "<p id=\"text-security\">Text TLS: {} connection(s), {} handshake(s), {} failed; AUTH: {} ok, {} failed, {} without AUTH.</p>",
            t.tls_connections_total, t.tls_handshakes, t.tls_handshake_failures, t.auth_ok, t.auth_failed, t.auth_noauth,
        );
    }
    if scrape.shards_silent > 0 {
        let _ = write!(o, "<p class=\"bad\">{} shard(s) did not answer in time.</p>", scrape.shards_silent);
    }
    http_access(&mut o, scrape);
    curve(&mut o, scrape);
    log(&mut o, scrape);
    ownership(&mut o, scrape);
    routers(&mut o, scrape);
    queues(&mut o, scrape, &per_second);
    latency_plot(&mut o, scrape);
    workers(&mut o, scrape);
    dead(&mut o, scrape);
    o.push_str("</body></html>\n");
    o
}

/// The router name's line (`durability = "replicated"`): its role, the
/// lease's age, names taken (docs/replicated.md "Watching a take-over").
fn ownership(o: &mut String, scrape: &Scrape) {
    let Some(f) = &scrape.ownership else { return };
    let role = f.role.as_str();
    let class = if f.role == crate::jslog::ownership::Role::Owner { "" } else { " class=\"bad\"" };
    let age = f.lease_age.map_or("unknown".to_string(), |a| format!("{:.1} s", a.as_secs_f64()));
    let _ = write!(
        o,
        "<p id=\"ownership\">Router name: <span{class}>{role}</span>, epoch {}, lease renewed {age} ago, \
         {} take-over(s) by this process.</p>",
        f.epoch, f.takeovers
    );
}

/// The router's name and the other router names of its stream prefix
/// (`durability = "replicated"`), each linked to its status page when its
/// lease record gives one ([`crate::jslog::peers`]): one admin view over
/// several owners, docs/admin.md.
fn routers(o: &mut String, scrape: &Scrape) {
    if scrape.router_name.is_empty() {
        return;
    }
    let _ = write!(o, "<p id=\"routers\">Router name {}", escape(&scrape.router_name));
    if scrape.peers.is_empty() {
        o.push_str(".</p>");
        return;
    }
    let others: Vec<String> = scrape
        .peers
        .iter()
        .map(|p| {
            let name = escape(&p.name);
            let shown = match p.status_page() {
                Some(url) => format!("<a href=\"{}\">{name}</a>", escape(url)),
                None => name,
            };
            let state = match (p.live, &p.holder) {
                (false, _) => "<span class=\"bad\">no lease: stopped or down</span>".to_string(),
                (true, Some(h)) => format!("live on {}", escape(h.host.as_deref().unwrap_or("?"))),
                (true, None) => "live".to_string(),
            };
            format!("{shown} ({state})")
        })
        .collect();
    let _ = write!(o, "; other routers on its NATS cluster: {}.</p>", others.join(", "));
}

/// The CURVE endpoints' line, when the router has any: per socket the
/// handshakes that succeeded and those refused (every other outcome).
fn curve(o: &mut String, scrape: &Scrape) {
    let Some(c) = &scrape.curve else { return };
    let sockets: Vec<String> = c
        .handshakes
        .iter()
        .map(|(socket, outcomes)| {
            let ok: u64 = outcomes.iter().filter(|(r, _)| *r == "ok").map(|(_, n)| n).sum();
            let refused: u64 = outcomes.iter().filter(|(r, _)| *r != "ok").map(|(_, n)| n).sum();
            format!("{socket} {ok} ok, {refused} refused")
        })
        .collect();
    let _ = write!(
        o,
        "<p id=\"curve\">CURVE handshakes: {}; {} key reload(s).</p>",
        escape(&sockets.join("; ")),
        c.reloads
    );
}

/// The HTTP server's access line, when it is not open: how it admits
/// clients and how many it refused (`http_auth_failures`,
/// `http_auth_throttled`).
fn http_access(o: &mut String, scrape: &Scrape) {
    let Some(access) = &scrape.http_access else { return };
    let _ = write!(
        o,
        "<p id=\"http\">HTTP access: {}; {} failed password check(s), {} refused unchecked after too many (429).</p>",
        escape(access),
        scrape.counter("http_auth_failures"),
        scrape.counter("http_auth_throttled"),
    );
}

/// The job log's line: its bytes, free space against `disk_free_limit`,
/// and the state of each shard's log that is not ok (new jobs refused).
fn log(o: &mut String, scrape: &Scrape) {
    if scrape.logs.is_empty() {
        return;
    }
    let bytes: u64 = scrape.logs.iter().map(|l| l.bytes).sum();
    let stores: Vec<&crate::joblog::StoreFigures> = scrape.logs.iter().filter_map(|l| l.store.as_ref()).collect();
    if stores.is_empty() {
        let free = scrape.disk_free().map_or("-".to_string(), |f| f.to_string());
        let limit = scrape.disk_free_limit.unwrap_or(0);
        let _ = write!(o, "<p id=\"log\">Job log: {bytes} byte(s); {free} byte(s) free on disk (limit {limit}).");
    } else {
        let mut ack = crate::metrics::latency::new_histogram();
        for h in stores.iter().filter_map(|s| s.ack_us.as_ref()) {
            let _ = ack.add(h);
        }
        let ms = |q: f64| format!("{:.1}", ack.value_at_quantile(q) as f64 / 1000.0);
        let unconfirmed: u64 = stores.iter().map(|s| s.unconfirmed_batches).sum();
        let (retries, refused): (u64, u64) =
            stores.iter().fold((0, 0), |(a, b), s| (a + s.retries, b + s.refused_jobs));
        let _ = write!(
            o,
            "<p id=\"log\">Job log: replicated on NATS JetStream, {bytes} byte(s) in its streams; \
             {unconfirmed} batch(es) awaiting confirmation; PubAck p50 {} ms, p99 {} ms; \
             {retries} publish(es) retried, {refused} job(s) refused unconfirmed.",
            ms(0.5),
            ms(0.99)
        );
    }
    let bad: Vec<String> = scrape
        .logs
        .iter()
        .enumerate()
        .filter(|(_, l)| l.state != crate::joblog::LogState::Ok)
        .map(|(i, l)| format!("shard {i}: {}", l.state.as_str()))
        .collect();
    if !bad.is_empty() {
        let _ = write!(
            o,
            " <span class=\"bad\">New jobs refused ({}); jobs held are still served. \
             See docs/durability.md.</span>",
            escape(&bad.join(", "))
        );
    }
    o.push_str("</p>");
}

fn queues(o: &mut String, scrape: &Scrape, per_second: &HashMap<String, [f64; 3]>) {
    o.push_str(
        "<h2>Queues</h2><table id=\"queues\"><tr><th>queue</th><th>waiting</th><th>in flight</th>\
         <th>retrying</th><th>dead now</th>\
         <th>accepted</th><th>completed</th><th>failed</th><th>dead-lettered</th>\
         <th>accepted/s</th><th>completed/s</th><th>failed/s</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th></tr>",
    );
    for q in &scrape.queues {
        let c = |k| q.counts.get(k);
        let r =
            per_second.get(&q.name).map_or(["-".to_string(), "-".into(), "-".into()], |r| r.map(|x| format!("{x:.1}")));
        let p =
            end_to_end(q).map_or(["-".to_string(), "-".into(), "-".into()], |h| [ms(h, 0.5), ms(h, 0.9), ms(h, 0.99)]);
        let _ = write!(
            o,
            "<tr class=\"queue\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&q.name),
            q.waiting,
            q.in_flight,
            q.retrying,
            q.dead,
            c(QueueCounter::Accepted),
            c(QueueCounter::Completed),
            c(QueueCounter::Failed),
            c(QueueCounter::DeadLettered),
            r[0],
            r[1],
            r[2],
            p[0],
            p[1],
            p[2],
        );
    }
    o.push_str(
        "</table><p class=\"note\">Waiting, in flight, retrying (waiting out a back-off before the next try) and \
         dead now (the dead set, as <code>emq-cli dead list</code> counts it) are now; accepted, completed, failed \
         and dead-lettered (moved to the dead set) count since the router started.</p>",
    );
    if scrape.folded > 0 {
        let _ =
            write!(o, "<p class=\"note\">{} more queue(s) summed as _other (metrics_max_queues).</p>", scrape.folded);
    }
}

/// End-to-end latency by percentile, one line per queue (the busiest
/// [`limits::STATUS_PAGE_MAX_SERIES`]), as inline SVG.
fn latency_plot(o: &mut String, scrape: &Scrape) {
    o.push_str("<h2>End-to-end latency by percentile</h2>");
    let mut rows: Vec<(&QueueRow, &hdrhistogram::Histogram<u64>)> =
        scrape.queues.iter().filter_map(|q| end_to_end(q).map(|h| (q, h))).collect();
    rows.sort_by_key(|(_, h)| std::cmp::Reverse(h.len()));
    rows.truncate(limits::STATUS_PAGE_MAX_SERIES);
    let series: Vec<Series> = rows.iter().map(|(q, h)| Series::from_histogram(&q.name, h)).collect();
    if series.is_empty() {
        o.push_str("<p class=\"note\">No job has completed yet.</p>");
        return;
    }
    match plot::svg_string(&series, "end to end, since start", (900, 420)) {
        Ok(svg) => {
            o.push_str("<figure id=\"latency\">");
            // The XML declaration plotters writes is not allowed inside HTML.
            o.push_str(svg.find("<svg").map_or(svg.as_str(), |at| &svg[at..]));
            o.push_str("</figure>");
        }
        Err(e) => {
            let _ = write!(o, "<p class=\"bad\">latency plot: {}</p>", escape(&e.to_string()));
        }
    }
}

fn workers(o: &mut String, scrape: &Scrape) {
    o.push_str(
        "<h2>Workers</h2><table id=\"workers\"><tr><th>worker</th><th>state</th><th>free slots</th>\
         <th>in flight</th><th>jobs taken</th><th>last heard</th><th>queues</th></tr>",
    );
    for w in scrape.workers.iter().take(limits::STATUS_PAGE_MAX_ROWS) {
        let queues: Vec<String> = w.queues.iter().map(|(wt, q)| format!("{}:{wt}", escape(q))).collect();
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1} s ago</td><td>{}</td></tr>",
            escape(&w.id),
            w.state,
            w.slots,
            w.inflight.len(),
            w.processed,
            (scrape.uptime_secs - w.hb).max(0.0),
            queues.join(", "),
        );
    }
    o.push_str("</table>");
    if scrape.workers.len() > limits::STATUS_PAGE_MAX_ROWS {
        let more = scrape.workers.len() - limits::STATUS_PAGE_MAX_ROWS;
        let _ = write!(o, "<p class=\"note\">{more} more worker(s) not shown.</p>");
    }
}

fn dead(o: &mut String, scrape: &Scrape) {
    o.push_str(
        "<h2>Retries and the dead set</h2><table id=\"dead\"><tr><th>queue</th><th>retrying</th><th>retried</th>\
         <th>dead now</th><th>dead-lettered</th></tr>",
    );
    let shown = || {
        scrape.queues.iter().filter(|q| {
            q.retrying + q.dead + q.counts.get(QueueCounter::Retried) + q.counts.get(QueueCounter::DeadLettered) > 0
        })
    };
    for q in shown() {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&q.name),
            q.retrying,
            q.counts.get(QueueCounter::Retried),
            q.dead,
            q.counts.get(QueueCounter::DeadLettered)
        );
    }
    o.push_str("</table>");
    match shown().next() {
        None => o.push_str("<p class=\"note\">No job has been retried or dead-lettered.</p>"),
        Some(_) => {
            let _ = write!(
                o,
                "<p class=\"note\">{} byte(s) in the dead set. <code>emq-cli dead list</code> lists the jobs; \
                 <code>emq-cli dead retry</code> and <code>delete</code> act on them.</p>",
                scrape.dead_bytes
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::latency::new_histogram;

    #[test]
    fn page_lists_queues_escaped_with_the_plot_and_rates() {
        let mut h = new_histogram();
        for us in [1_000u64, 2_000, 40_000] {
            h.record(us).unwrap();
        }
        let mut row = QueueRow { name: "mail<x>".into(), waiting: 2, retrying: 3, dead: 1, ..QueueRow::default() };
        row.counts.add(QueueCounter::Accepted, 4);
        row.counts.add(QueueCounter::DeadLettered, 5);
        row.latency[Kind::EndToEnd as usize] = Some(h);
        let mut scrape = Scrape { queues: vec![row], shards: 1, ..Scrape::default() };
        let mut rates = Rates::default();
        let page = render(&scrape, &mut rates);
        // waiting, in flight, retrying, dead now, accepted, completed, failed, dead-lettered
        let row =
            "<td>mail&lt;x&gt;</td><td>2</td><td>0</td><td>3</td><td>1</td><td>4</td><td>0</td><td>0</td><td>5</td>";
        assert!(page.contains(row), "{page}");
        assert!(page.contains("<th>retrying</th><th>dead now</th>") && page.contains("<th>dead-lettered</th>"));
        assert!(page.contains("<figure id=\"latency\"><svg"), "{page}");
        assert!(!page.contains("<?xml"));
        scrape.queues[0].counts.add(QueueCounter::Accepted, 1000);
        let page = render(&scrape, &mut rates);
        assert!(!page.contains("<td>-</td><td>-</td><td>-</td><td>"), "a second load shows rates: {page}");
    }

    #[test]
    fn page_says_the_router_names_role() {
        use crate::jslog::ownership::{OwnershipFigures, Role};
        let ownership = Some(OwnershipFigures { role: Role::Fenced, lease_age: None, takeovers: 1, epoch: 9 });
        let page = render(&Scrape { ownership, ..Scrape::default() }, &mut Rates::default());
        assert!(
            page.contains(
                "Router name: <span class=\"bad\">fenced</span>, epoch 9, lease renewed unknown ago, 1 take-over(s)"
            ),
            "{page}"
        );
    }

    #[test]
    fn page_names_the_router_and_links_the_others() {
        use crate::jslog::peers::{Holder, PeerRouter};
        let holder =
            |page: &str| Holder { host: Some("h<1>".into()), status_page: Some(page.into()), ..Holder::default() };
        let peers = vec![
            PeerRouter {
                name: "b".into(),
                live: true,
                holder: Some(holder("http://h1:9/")),
                unreadable: false,
                lease_age: None,
            },
            PeerRouter {
                name: "c\"".into(),
                live: true,
                holder: Some(holder("javascript:x")),
                unreadable: false,
                lease_age: None,
            },
            PeerRouter { name: "d".into(), live: false, holder: None, unreadable: false, lease_age: None },
        ];
        let page = render(&Scrape { router_name: "a".into(), peers, ..Scrape::default() }, &mut Rates::default());
        assert!(
            page.contains(
                "<p id=\"routers\">Router name a; other routers on its NATS cluster: <a href=\"http://h1:9/\">b</a> \
                 (live on h&lt;1&gt;), c&quot; (live on h&lt;1&gt;), d (<span class=\"bad\">no lease: stopped or down</span>).</p>"
            ),
            "{page}"
        );
        let alone = render(&Scrape { router_name: "a".into(), ..Scrape::default() }, &mut Rates::default());
        assert!(alone.contains("<p id=\"routers\">Router name a.</p>"), "{alone}");
    }

    #[test]
    fn page_counts_curve_handshakes_per_socket() {
        let curve = crate::router::curve::CurveFigures {
            handshakes: vec![("backend", vec![("ok", 2), ("unknown_key", 3), ("no_detail", 1)])],
            zap: vec![],
            reloads: 1,
        };
        let page = render(&Scrape { curve: Some(curve), ..Scrape::default() }, &mut Rates::default());
        assert!(
            page.contains("<p id=\"curve\">CURVE handshakes: backend 2 ok, 4 refused; 1 key reload(s).</p>"),
            "{page}"
        );
        assert!(!render(&Scrape::default(), &mut Rates::default()).contains("id=\"curve\""));
    }

    #[test]
    fn page_says_when_the_job_log_refuses_new_jobs() {
        use crate::joblog::{FaultKind, LogFigures, LogState};
        let ok = LogFigures { bytes: 10, free_bytes: Some(7000), ..LogFigures::default() };
        let full = LogFigures { state: LogState::Alarm, free_bytes: Some(6000), ..LogFigures::default() };
        let gone = LogFigures { state: LogState::Faulty(FaultKind::Gone), ..LogFigures::default() };
        let scrape = Scrape { shards: 3, logs: vec![ok, full, gone], disk_free_limit: Some(9000), ..Scrape::default() };
        let page = render(&scrape, &mut Rates::default());
        assert!(page.contains("Job log: 10 byte(s); 6000 byte(s) free on disk (limit 9000)."), "{page}");
        assert!(page.contains("New jobs refused (shard 1: disk_alarm, shard 2: gone)"), "{page}");
        assert!(
            page.contains("up 0 s, <span class=\"bad\">refusing new jobs (store_failed, store_full)</span>;"),
            "{page}"
        );
        let memory = render(&Scrape { shards: 1, ..Scrape::default() }, &mut Rates::default());
        assert!(!memory.contains("id=\"log\""), "no log line without a log");
    }
}
