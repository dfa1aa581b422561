//! Tables for people, one per admin answer (EventMQ's JSON shapes and
//! emq's keys, docs/emqp.md "Admin"). `--json` prints the answers as they
//! are. Numbers are rounded for reading; columns are separated by two
//! spaces, numbers right-aligned, and no line ends in a space.

use std::collections::BTreeSet;

use emq::broker::counts::QueueCounter;
use emq::program::printable;
use serde_json::{Map, Value};

/// Lines of `rows` under `header`, each column as wide as its widest cell.
/// A column whose cells are all numbers (or `-`) is right-aligned. Cells
/// come from the broker's answers, so from peers (queue names a worker
/// declared, callables, msgids): their control characters are escaped
/// ([`emq::program::printable`]), and a cell never breaks its line or drives the terminal.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|row| row.iter().map(|cell| printable(cell)).collect()).collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|c| !rows.is_empty() && rows.iter().all(|r| r.get(c).is_some_and(|cell| is_number(cell))))
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .zip(&numeric)
            .map(|((cell, w), right)| if *right { format!("{cell:>w$}") } else { format!("{cell:<w$}") })
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    for row in rows {
        out += &line(row);
    }
    out
}

fn is_number(cell: &str) -> bool {
    cell == "-" || cell.parse::<f64>().is_ok()
}

/// An integer cell: the number, `0` when absent.
fn count(v: Option<&Value>) -> String {
    v.and_then(Value::as_u64).unwrap_or(0).to_string()
}

/// Milliseconds for people: three decimals below 1 ms, two below a
/// second, whole above.
pub fn ms(value: f64) -> String {
    match value {
        v if v < 1.0 => format!("{v:.3}"),
        v if v < 1000.0 => format!("{v:.2}"),
        v => format!("{:.0}", v.round()),
    }
}

/// A duration in seconds for people: `42 s`, `3 min 4 s`, `2 h`, `3 d 4 h`
/// (two units at most, a zero second unit left out).
pub fn duration(secs: u64) -> String {
    let (big, unit, small, small_unit) = match secs {
        s if s < 60 => return format!("{s} s"),
        s if s < 3600 => (s / 60, "min", s % 60, "s"),
        s if s < 86_400 => (s / 3600, "h", s % 3600 / 60, "min"),
        s => (s / 86_400, "d", s % 86_400 / 3600, "h"),
    };
    match small {
        0 => format!("{big} {unit}"),
        _ => format!("{big} {unit} {small} {small_unit}"),
    }
}

/// A `seen_secs_ago` figure: `0.4 s ago`; `-` when absent (EventMQ).
fn seen(v: Option<&Value>) -> String {
    v.and_then(Value::as_f64).map_or("-".into(), |s| format!("{s:.1} s ago"))
}

fn object<'a>(v: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    v.get(key).and_then(Value::as_object)
}

/// The figures of STATUS that hold now (not since start) after WAITING and
/// IN-FLIGHT: `(key, column)`. `RETRYING`: jobs waiting out a back-off
/// before their next try; `DEAD`: the dead set now, as `emq-cli dead list`
/// counts it (dead-lettered since start is `DEAD-LETTERED`).
const NOW: [(&str, &str); 2] = [("retrying_messages_by_queue", "RETRYING"), ("dead_messages_by_queue", "DEAD")];

/// STATUS: one row per queue that has a figure or that workers serve or
/// text clients asked for (waiting, in flight over both protocols, waiting
/// for a retry and in the dead set now, the per-queue counters since start
/// with a line saying so, end-to-end p50/p99), then the router's summary.
/// Against an EventMQ router: waiting, in flight and processed.
pub fn status(v: &Value) -> String {
    let mut out = queues(v, v.get("emq").is_some());
    if let Some(emq) = v.get("emq") {
        out += "\n";
        out += &summary(emq);
    }
    out + &wal(v)
}

/// STATUS's queue table ([`status`] without the router's summary): `emq`
/// says whether the answer is emq's (no PROCESSED column) or EventMQ's.
pub fn queues(v: &Value, emq: bool) -> String {
    let mut queues: BTreeSet<String> = BTreeSet::new();
    for (key, value) in v.as_object().into_iter().flatten() {
        if key.ends_with("_by_queue") {
            queues.extend(value.as_object().into_iter().flat_map(|m| m.keys().cloned()));
        }
    }
    for key in ["served_queues", "asked_queues"] {
        let names = v.get(key).and_then(Value::as_array).into_iter().flatten();
        queues.extend(names.filter_map(|q| q.as_str().map(str::to_string)));
    }
    let mut header = vec!["QUEUE", "WAITING", "IN-FLIGHT"];
    let now: Vec<(&str, &str)> = NOW.into_iter().filter(|(key, _)| v.get(key).is_some()).collect();
    header.extend(now.iter().map(|(_, h)| *h));
    let counters: Vec<QueueCounter> =
        QueueCounter::ALL.iter().copied().filter(|c| v.get(c.status_key()).is_some()).collect();
    header.extend(counters.iter().map(|c| c.header()));
    if !emq {
        header.push("PROCESSED");
    }
    let latency = [("end_to_end_p50_ms_by_queue", "P50-MS"), ("end_to_end_p99_ms_by_queue", "P99-MS")];
    let latency: Vec<_> = latency.into_iter().filter(|(key, _)| v.get(key).is_some()).collect();
    header.extend(latency.iter().map(|(_, h)| *h));
    let by = |key: &str, q: &str| v.get(key).and_then(|m| m.get(q)).and_then(Value::as_u64).unwrap_or(0);
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let inflight = by("inflight_messages_by_queue", q) + by("offered_messages_by_queue", q);
            let mut row = vec![q.clone(), by("waiting_messages_by_queue", q).to_string(), inflight.to_string()];
            row.extend(now.iter().map(|(key, _)| by(key, q).to_string()));
            row.extend(counters.iter().map(|c| count(v.get(c.status_key()).and_then(|m| m.get(q)))));
            if !emq {
                row.push(by("processed_messages_by_queue", q).to_string());
            }
            for (key, _) in &latency {
                row.push(v.get(key).and_then(|m| m.get(q)).and_then(Value::as_f64).map_or("-".into(), ms));
            }
            row
        })
        .collect();
    let mut out = render(&header, &rows);
    // Which columns count since the router started (the others are now).
    if let (Some(first), Some(last)) = (counters.first(), counters.last()) {
        let what =
            if first == last { first.header().to_string() } else { format!("{} to {}", first.header(), last.header()) };
        out += &format!("({what}: since the router started; the other counts: now)\n");
    }
    out
}

/// Whether the router takes new jobs: `draining`, `accepting jobs`, or
/// `refusing new jobs` with the refusal producers get and the shards'
/// log states behind it (`store_full`: a full disk or free space below
/// `disk_free_limit`; `store_failed`: a log that cannot write).
pub fn admission(emq: &Value) -> String {
    if emq.get("draining").and_then(Value::as_bool) == Some(true) {
        return "draining".into();
    }
    // A standby's own STATUS (it serves nothing yet), or a fenced owner.
    match emq.get("role").and_then(Value::as_str) {
        Some("standby") => return "standby: serves nothing until the owner's lease expires".into(),
        Some("replaying") => return "took the name: replaying its streams, serving soon".into(),
        _ => {}
    }
    if emq.pointer("/wal/nats/role").and_then(Value::as_str) == Some("fenced") {
        return "fenced: refusing new jobs (store_failed: another router took the name)".into();
    }
    let shards = emq.pointer("/wal/shards").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut why: Vec<(&str, String)> = Vec::new();
    for sh in shards {
        let state = sh.get("state").and_then(Value::as_str).unwrap_or("?");
        if state == "ok" {
            continue;
        }
        let code = if matches!(state, "full" | "disk_alarm") { "store_full" } else { "store_failed" };
        let n = sh.get("shard").and_then(Value::as_u64).unwrap_or(0);
        why.push((code, format!("shard {n} {}", printable(state))));
    }
    if why.is_empty() {
        return "accepting jobs".into();
    }
    let mut codes: Vec<&str> = why.iter().map(|(c, _)| *c).collect();
    codes.sort_unstable();
    codes.dedup();
    let shards: Vec<String> = why.into_iter().map(|(_, s)| s).collect();
    format!("refusing new jobs ({}: {})", codes.join(", "), shards.join(", "))
}

/// The `emq` object of STATUS: version, shards, uptime, whether it drains,
/// then every counter that is not zero, one line per group (the job log's
/// figures apart).
fn summary(emq: &Value) -> String {
    let shards = emq.get("shards").and_then(Value::as_u64).unwrap_or(0);
    let mut out = format!(
        "emq {}, {shards} shard{}, up {}, {}\n",
        printable(emq.get("version").and_then(Value::as_str).unwrap_or("?")),
        if shards == 1 { "" } else { "s" },
        duration(emq.get("uptime_secs").and_then(Value::as_u64).unwrap_or(0)),
        admission(emq),
    );
    // `wal` has a table of its own (see `wal`).
    let groups = emq.as_object().into_iter().flatten().filter(|(k, v)| v.is_object() && *k != "wal");
    for (key, value) in groups {
        let mut figures = Vec::new();
        nonzero(value, "", &mut figures);
        if !figures.is_empty() {
            out += &printable(&format!("{key}: {}", figures.join(" ")));
            out += "\n";
        }
    }
    out
}

/// `name=value` for every non-zero number under `v`, nested names dotted.
pub fn nonzero(v: &Value, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in v.as_object().into_iter().flatten() {
        let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            Value::Object(_) => nonzero(value, &name, out),
            Value::Number(n) if n.as_f64() != Some(0.0) => out.push(format!("{name}={n}")),
            _ => {}
        }
    }
}

/// The router name's ownership (`emq.wal.nats.ownership`): `, role owner
/// (epoch 7, took over from …, replayed in 812 ms), lease renewed 1.2 s
/// ago`, or a standby's `, role standby, owner …, its lease renewed … ago`.
fn ownership(o: &Value) -> String {
    let role = o.get("role").and_then(Value::as_str).unwrap_or("-");
    let holder = o.get("holder").and_then(Value::as_str).unwrap_or("unknown");
    let age = o.get("lease_age_ms").and_then(Value::as_u64).map(|a| format!("{:.1} s", a as f64 / 1000.0));
    let mut out = format!(", role {}", printable(role));
    match role {
        "owner" | "replaying" => {
            let mut facts = vec![format!("epoch {}", o.get("epoch").and_then(Value::as_u64).unwrap_or(0))];
            if let Some(from) = o.get("took_over_from").and_then(Value::as_str) {
                facts.push(format!("took over from {}", printable(from)));
            }
            if let Some(ms) = o.pointer("/replay/took_ms").and_then(Value::as_u64) {
                facts.push(format!("replayed in {ms} ms"));
            } else {
                let read = o.pointer("/replay/streams_read").and_then(Value::as_u64).unwrap_or(0);
                let all = o.pointer("/replay/streams").and_then(Value::as_u64).unwrap_or(0);
                facts.push(format!("replaying: {read} of {all} streams read"));
            }
            out += &format!(" ({})", facts.join(", "));
            if let Some(age) = age {
                out += &format!(", lease renewed {age} ago");
            }
        }
        _ => {
            out += &format!(", owner {}", printable(holder));
            if let Some(age) = age {
                out += &format!(", its lease renewed {age} ago");
            }
        }
    }
    out
}

/// STATUS's write-ahead log figures (`emq.wal`): one row per shard.
fn wal(v: &Value) -> String {
    let Some(w) = v.pointer("/emq/wal") else { return String::new() };
    let durability = w.get("durability").and_then(Value::as_str).unwrap_or("-");
    let dir = w.get("data_dir").and_then(Value::as_str).unwrap_or("-");
    let mut out = match w.get("nats").filter(|n| n.is_object()) {
        Some(n) => {
            let name = n.get("router_name").and_then(Value::as_str).unwrap_or("-");
            let to = n.get("connected_to").and_then(Value::as_str).unwrap_or("not connected");
            let head = format!(
                "\ndurability {}, router name {}, NATS {}",
                printable(durability),
                printable(name),
                printable(to)
            );
            head + &n.get("ownership").filter(|o| o.is_object()).map(ownership).unwrap_or_default()
        }
        None => format!("\ndurability {}, data dir {}", printable(durability), printable(dir)),
    };
    let shards = w.get("shards").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let free = shards.iter().filter_map(|s| s.get("free_bytes").and_then(Value::as_u64)).min();
    if let (Some(free), Some(limit)) = (free, w.get("disk_free_limit").and_then(Value::as_u64)) {
        out += &format!(", {free} bytes free (limit {limit})");
    }
    out.push('\n');
    if shards.is_empty() {
        return out;
    }
    let (keys, header) = if durability == "replicated" {
        (
            [
                "shard",
                "state",
                "stream_bytes",
                "live_jobs",
                "unconfirmed_batches",
                "ack_p50_us",
                "ack_p99_us",
                "retries",
                "refused_jobs",
                "purges",
                "jobs_recovered",
            ]
            .as_slice(),
            [
                "SHARD",
                "STATE",
                "STREAM-BYTES",
                "LIVE-JOBS",
                "UNCONFIRMED",
                "ACK-P50-US",
                "ACK-P99-US",
                "RETRIES",
                "REFUSED",
                "PURGES",
                "RECOVERED",
            ]
            .as_slice(),
        )
    } else {
        (
            ["shard", "state", "log_bytes", "segments", "live_jobs", "last_sync_us", "syncs", "jobs_recovered"]
                .as_slice(),
            ["SHARD", "STATE", "LOG-BYTES", "SEGMENTS", "LIVE-JOBS", "LAST-SYNC-US", "SYNCS", "RECOVERED"].as_slice(),
        )
    };
    let cell = |v: Option<&Value>| match v {
        Some(Value::String(s)) => printable(s),
        other => count(other),
    };
    let rows: Vec<Vec<String>> = shards.iter().map(|s| keys.iter().map(|k| cell(s.get(*k))).collect()).collect();
    out += &render(header, &rows);
    out
}

/// ROUTER_SHOW_WORKERS: one row per worker.
pub fn workers(v: &Value) -> String {
    let rows: Vec<Vec<String>> =
        object(v, "connected_workers").into_iter().flatten().map(|(id, w)| worker_row(id, w)).collect();
    render(&WORKERS_HEADER, &rows)
}

/// The columns of [`workers`].
pub const WORKERS_HEADER: [&str; 6] = ["WORKER", "STATE", "SLOTS", "IN-FLIGHT", "LAST-HEARD", "QUEUES"];

/// One worker's cells in [`WORKERS_HEADER`]'s order.
pub fn worker_row(id: &str, w: &Value) -> Vec<String> {
    let queues: Vec<String> = w
        .get("queues")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| format!("{}:{}", p.get(1).and_then(Value::as_str).unwrap_or("?"), count(p.get(0))))
        .collect();
    let state = w.get("state").and_then(Value::as_str).unwrap_or("-").to_string();
    let inflight = w.get("inflight").map_or("-".into(), |n| count(Some(n)));
    let slots = w.get("available_slots").and_then(Value::as_i64).unwrap_or(0).to_string();
    vec![id.to_string(), state, slots, inflight, seen(w.get("seen_secs_ago")), queues.join(",")]
}

/// ROUTER_SHOW_SCHEDULERS: one row per scheduler.
pub fn schedulers(v: &Value) -> String {
    let rows: Vec<Vec<String>> = object(v, "connected_schedulers")
        .into_iter()
        .flatten()
        .map(|(id, s)| {
            let scheduled = s.get("scheduled").map_or("-".into(), |n| count(Some(n)));
            vec![id.clone(), seen(s.get("seen_secs_ago")), scheduled]
        })
        .collect();
    render(&["SCHEDULER", "LAST-HEARD", "SCHEDULED"], &rows)
}

/// LATENCY: one row per queue and figure, in milliseconds.
pub fn latency(v: &Value) -> String {
    render(&LATENCY_HEADER, &latency_rows(v))
}

/// The columns of [`latency`].
pub const LATENCY_HEADER: [&str; 9] =
    ["QUEUE", "FIGURE", "JOBS", "MEAN-MS", "P50-MS", "P90-MS", "P99-MS", "P99.9-MS", "MAX-MS"];

/// LATENCY's rows in [`LATENCY_HEADER`]'s order: per queue and figure.
pub fn latency_rows(v: &Value) -> Vec<Vec<String>> {
    let figures = ["mean_us", "p50_us", "p90_us", "p99_us", "p999_us", "max_us"];
    let mut rows = Vec::new();
    for (queue, kinds) in object(v, "queues").into_iter().flatten() {
        for kind in ["queue_wait", "service", "end_to_end"] {
            let Some(k) = kinds.get(kind) else { continue };
            let mut row = vec![queue.clone(), kind.replace('_', " "), count(k.get("count"))];
            row.extend(
                figures.iter().map(|f| k.get(*f).and_then(Value::as_f64).map_or("-".into(), |us| ms(us / 1000.0))),
            );
            rows.push(row);
        }
    }
    rows
}

/// SCHEDULES (the scheduler's admin socket): one row per schedule, earliest
/// next fire first; `now` (Unix seconds) gives the "in …" of the next fire.
pub fn schedules(v: &Value, now: i64) -> String {
    let rows: Vec<Vec<String>> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
            let when = match s.get("interval_secs").and_then(Value::as_u64) {
                Some(secs) => format!("every {}", duration(secs)),
                None => text("cron"),
            };
            let runs = s.get("runs_left").and_then(Value::as_u64).map_or("-".into(), |n| n.to_string());
            let key: String = text("key").chars().take(8).collect();
            vec![text("queue"), text("kind"), when, next_fire(&text("next_fire"), now), runs, text("callable"), key]
        })
        .collect();
    render(&["QUEUE", "KIND", "WHEN", "NEXT-FIRE (UTC)", "RUNS-LEFT", "CALLABLE", "KEY"], &rows)
}

/// DEAD_LIST: one row per dead job, oldest first, then always the total:
/// `(3 dead jobs)`, or `(1000 of 4711 dead jobs listed, the oldest)` when
/// the list is cut. An answer without a total (a router older than it)
/// says how many are listed.
pub fn dead_list(v: &Value) -> String {
    let jobs = v.get("jobs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = jobs.iter().map(|j| dead_row(j).to_vec()).collect();
    let mut out = render(&DEAD_HEADER, &rows);
    let total = v.get("total").and_then(Value::as_u64).unwrap_or(rows.len() as u64);
    let jobs = |n: u64| if n == 1 { "1 dead job".to_string() } else { format!("{n} dead jobs") };
    if total > rows.len() as u64 {
        out.push_str(&format!("({} of {} listed, the oldest)\n", rows.len(), jobs(total)));
    } else {
        out.push_str(&format!("({})\n", jobs(total)));
    }
    out
}

/// DEAD_SHOW: the listed fields one per line, then headers and body.
pub fn dead_show(v: &Value) -> String {
    let job = &v["job"];
    let names = ["id", "queue", "reason", "failures", "dead at (UTC)", "bytes", "msgid"];
    let mut out = String::new();
    for (name, value) in names.iter().zip(dead_row(job)) {
        out.push_str(&format!("{name:<14}{}\n", printable(&value)));
    }
    let text = |k: &str| printable(job.get(k).and_then(Value::as_str).unwrap_or(""));
    out.push_str(&format!("{:<14}{}\n{:<14}{}\n", "headers", text("headers"), "body", text("body")));
    out
}

/// The columns of [`dead_list`].
pub const DEAD_HEADER: [&str; 7] = ["ID", "QUEUE", "REASON", "FAILURES", "DEAD-AT (UTC)", "BYTES", "MSGID"];

/// A dead job's cells in [`DEAD_HEADER`]'s order.
pub fn dead_row(j: &Value) -> [String; 7] {
    let text = |k: &str| j.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let when = j
        .get("dead_at")
        .and_then(Value::as_f64)
        .and_then(|secs| chrono::DateTime::from_timestamp(secs as i64, 0))
        .map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string());
    [text("id"), text("queue"), text("reason"), count(j.get("failures")), when, count(j.get("bytes")), text("msgid")]
}

/// `2026-12-01 00:31:05 (in 42 s)` from an RFC 3339 time.
fn next_fire(rfc3339: &str, now: i64) -> String {
    match chrono::DateTime::parse_from_rfc3339(rfc3339) {
        Ok(t) => {
            let left = u64::try_from(t.timestamp() - now).unwrap_or(0);
            format!("{} (in {})", t.format("%Y-%m-%d %H:%M:%S"), duration(left))
        }
        Err(_) => rfc3339.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn dead_jobs_list_and_show() {
        let job = json!({"id": "0-7", "queue": "email", "msgid": "m1", "headers": "retry:2", "reason": "failed",
            "failures": 3, "dead_at": 1_764_547_200.5, "bytes": 120, "body": "{}", "body_utf8": true});
        let list = dead_list(&json!({"jobs": [job.clone()], "total": 4}));
        assert_eq!(list.lines().next(), Some("ID   QUEUE  REASON  FAILURES  DEAD-AT (UTC)        BYTES  MSGID"));
        assert_eq!(list.lines().nth(1), Some("0-7  email  failed         3  2025-12-01 00:00:00    120  m1"));
        assert_eq!(list.lines().nth(2), Some("(1 of 4 dead jobs listed, the oldest)"));
        // The total is always shown, the list cut or not.
        let all = dead_list(&json!({"jobs": [job.clone()], "total": 1}));
        assert_eq!(all.lines().nth(2), Some("(1 dead job)"), "{all}");
        let none = dead_list(&json!({"jobs": [], "total": 0}));
        assert_eq!(none, "ID  QUEUE  REASON  FAILURES  DEAD-AT (UTC)  BYTES  MSGID\n(0 dead jobs)\n");
        let shown = dead_show(&json!({ "job": job }));
        let hostile = dead_show(&json!({ "job": {"body": "a\u{1b}[31mred\r"} }));
        assert!(hostile.ends_with("body          a\\u{1b}[31mred\\r\n"), "{hostile}");
        // Every field a peer chose (the queue and msgid come over eMQP).
        let job = json!({"queue": "q\u{1b}]0;owned\u{7}", "msgid": "m\u{202e}x"});
        let hostile = dead_show(&json!({ "job": job }));
        assert!(hostile.contains("queue         q\\u{1b}]0;owned\\u{7}\n"), "{hostile}");
        assert!(hostile.contains("msgid         m\\u{202e}x\n"), "{hostile}");
        assert!(shown.contains("reason        failed\n") && shown.ends_with("body          {}\n"), "{shown}");
    }

    #[test]
    fn tables_align_and_never_end_in_spaces() {
        let out = render(
            &["NAME", "N", "NOTE"],
            &[vec!["a".into(), "10".into(), "".into()], vec!["bb".into(), "2".into(), "x".into()]],
        );
        assert_eq!(out, "NAME   N  NOTE\na     10\nbb     2  x\n");
    }

    #[test]
    fn status_of_a_standby_an_owner_and_a_fenced_router() {
        let standby = json!({"emq": {"version": "0.1.0", "role": "standby", "shards": 0, "uptime_secs": 0,
            "wal": {"durability": "replicated", "shards": [], "nats": {"role": "standby", "router_name": "r1",
                "ownership": {"role": "standby", "holder": "{\"host\":\"a\"}", "lease_age_ms": 2300, "epoch": 0,
                    "took_over_from": null, "takeovers": 0,
                    "replay": {"streams_read": 0, "streams": 0, "messages_read": 0, "took_ms": null}}}}}});
        assert_eq!(
            status(&standby),
            "QUEUE  WAITING  IN-FLIGHT\n\nemq 0.1.0, 0 shards, up 0 s, standby: serves nothing until the owner's \
             lease expires\n\ndurability replicated, router name r1, NATS not connected, role standby, owner \
             {\"host\":\"a\"}, its lease renewed 2.3 s ago\n"
        );
        let mut owner = standby.clone();
        owner["emq"]["role"] = json!(null);
        owner["emq"]["wal"]["nats"]["role"] = json!("owner");
        owner["emq"]["wal"]["nats"]["ownership"] = json!({"role": "owner", "holder": "me", "lease_age_ms": 1200,
            "epoch": 7, "took_over_from": "old", "takeovers": 1,
            "replay": {"streams_read": 2, "streams": 2, "messages_read": 9, "took_ms": 812}});
        assert!(
            status(&owner).ends_with(
                "up 0 s, accepting jobs\n\ndurability replicated, router name r1, NATS not connected, role owner \
                 (epoch 7, took over from old, replayed in 812 ms), lease renewed 1.2 s ago\n"
            ),
            "{}",
            status(&owner)
        );
        owner["emq"]["wal"]["nats"]["role"] = json!("fenced");
        assert!(
            status(&owner).contains("up 0 s, fenced: refusing new jobs (store_failed: another router took the name)\n"),
            "{}",
            status(&owner)
        );
    }

    #[test]
    fn status_of_emq_and_of_eventmq() {
        let emq = json!({
            "inflight_messages_by_queue": {"q": 1}, "waiting_messages_by_queue": {"q": 2},
            "offered_messages_by_queue": {"t": 1}, "processed_messages_by_queue": {"q": 3},
            "dispatched_messages_by_queue": {"q": 3, "t": 1}, "completed_messages_by_queue": {"q": 2},
            "failed_messages_by_queue": {}, "end_to_end_p50_ms_by_queue": {"q": 1.234}, "end_to_end_p99_ms_by_queue": {"q": 1234.5},
            "served_queues": ["default", "q"], "asked_queues": ["a", "t"],
            "emq": {"version": "0.1.0", "shards": 1, "uptime_secs": 75, "draining": false,
                    "counters": {"accepted_jobs": 4, "malformed_admin": 0}, "text": {"errors_by_code": {"BAD_FORMAT": 1, "BUSY": 0}},
                    "wal": {"durability": "sync", "data_dir": "/var/lib/emq", "disk_free_limit": 268_435_456, "shards": [
                        {"shard": 0, "state": "ok", "free_bytes": 1_000_000_000, "log_bytes": 1_048_576, "segments": 2, "live_jobs": 3, "live_bytes": 300, "last_sync_us": 850,
                         "syncs": 41, "jobs_recovered": 3, "recovery_ms": 1, "relocated_jobs": 0, "deleted_segments": 0},
                        {"shard": 1, "state": "full", "free_bytes": 999_999_999, "log_bytes": 4096, "segments": 1, "live_jobs": 0, "live_bytes": 0, "last_sync_us": 1_234_567,
                         "syncs": 123_456, "jobs_recovered": 0, "recovery_ms": 0, "relocated_jobs": 0, "deleted_segments": 2}]}}
        });
        let mut emq = emq;
        emq["dead_lettered_messages_by_queue"] = json!({"t": 3});
        emq["retrying_messages_by_queue"] = json!({"q": 1});
        emq["dead_messages_by_queue"] = json!({"t": 2});
        assert_eq!(
            status(&emq),
            "QUEUE    WAITING  IN-FLIGHT  RETRYING  DEAD  DISPATCHED  COMPLETED  FAILED  DEAD-LETTERED  P50-MS  P99-MS\n\
             a              0          0         0     0           0          0       0              0       -       -\n\
             default        0          0         0     0           0          0       0              0       -       -\n\
             q              2          1         1     0           3          2       0              0    1.23    1235\n\
             t              0          1         0     2           1          0       0              3       -       -\n\
             (DISPATCHED to DEAD-LETTERED: since the router started; the other counts: now)\n\
             \n\
             emq 0.1.0, 1 shard, up 1 min 15 s, refusing new jobs (store_full: shard 1 full)\n\
             counters: accepted_jobs=4\n\
             text: errors_by_code.BAD_FORMAT=1\n\
             \n\
             durability sync, data dir /var/lib/emq, 999999999 bytes free (limit 268435456)\n\
             SHARD  STATE  LOG-BYTES  SEGMENTS  LIVE-JOBS  LAST-SYNC-US   SYNCS  RECOVERED\n    \
             0  ok       1048576         2          3           850      41          3\n    \
             1  full        4096         1          0       1234567  123456          0\n"
        );
        let mut failed = emq.clone();
        failed["emq"]["wal"]["shards"][0]["state"] = json!("read_only");
        assert!(
            status(&failed).contains(
                "up 1 min 15 s, refusing new jobs (store_failed, store_full: shard 0 read_only, shard 1 full)\n"
            ),
            "{}",
            status(&failed)
        );
        failed["emq"]["wal"]["shards"][1]["state"] = json!("ok");
        failed["emq"]["wal"]["shards"][0]["state"] = json!("ok");
        assert!(status(&failed).contains("up 1 min 15 s, accepting jobs\n"));
        // A router without a log (durability memory) has no shard rows.
        let memory = json!({"emq": {"version": "0.1.0", "shards": 2, "uptime_secs": 5, "draining": true,
            "wal": {"durability": "memory", "data_dir": null, "shards": []}}});
        assert_eq!(
            status(&memory),
            "QUEUE  WAITING  IN-FLIGHT\n\nemq 0.1.0, 2 shards, up 5 s, draining\n\ndurability memory, data dir -\n"
        );
        let eventmq = json!({"inflight_messages_by_queue": {"email": 1}, "latency_messages_by_queue": {"email": 628},
            "max_latency_messages_by_queue": {"email": 628}, "waiting_messages_by_queue": {},
            "processed_messages_by_queue": {"default": 1}, "processed_messages_by_worker": {"w": 1}});
        assert_eq!(status(&eventmq), "QUEUE    WAITING  IN-FLIGHT  PROCESSED\ndefault        0          0          1\nemail          0          1          0\n");
    }

    #[test]
    fn names_from_peers_never_drive_the_terminal_or_break_a_line() {
        // A worker may declare any queue name over eMQP (EventMQ does); the
        // tables escape what a terminal would act on.
        let w = json!({"connected_workers": {"w1": {"queues": [[10, "\u{1b}[31mRED\u{1b}[0m"], [1, "a\nb"]], "available_slots": 1, "state": "live"}}});
        let out = workers(&w);
        assert!(!out.contains('\u{1b}') && out.lines().count() == 2, "{out:?}");
        assert!(out.contains("\\u{1b}[31mRED\\u{1b}[0m:10,a\\nb:1"), "{out:?}");
        let st = json!({"served_queues": ["\u{1b}]0;title\u{7}", "ok"], "emq": {"version": "1\r", "counters": {"x\u{1b}": 1}}});
        let out = status(&st);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    }

    #[test]
    fn workers_schedulers_latency_and_schedules() {
        let w = json!({"connected_workers": {"w1": {"queues": [[10, "email"], [1, "default"]], "hb": 3.5, "available_slots": 4, "inflight": 0, "state": "live", "seen_secs_ago": 0.44}}});
        assert_eq!(workers(&w), "WORKER  STATE  SLOTS  IN-FLIGHT  LAST-HEARD  QUEUES\nw1      live       4          0  0.4 s ago   email:10,default:1\n");
        let s = json!({"connected_schedulers": {"s1": {"hb": 1.0, "scheduled": 2, "seen_secs_ago": 1.25}}});
        assert_eq!(schedulers(&s), "SCHEDULER  LAST-HEARD  SCHEDULED\ns1         1.2 s ago           2\n");
        let l = json!({"unit": "us", "queues": {"q": {"end_to_end": {"count": 2, "mean_us": 1500.0, "p50_us": 1000, "p90_us": 2000, "p99_us": 2000, "p999_us": 2000, "max_us": 2000}}}});
        assert_eq!(latency(&l), "QUEUE  FIGURE      JOBS  MEAN-MS  P50-MS  P90-MS  P99-MS  P99.9-MS  MAX-MS\nq      end to end     2     1.50    1.00    2.00    2.00      2.00    2.00\n");
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T00:30:00Z").unwrap().timestamp();
        let sch = json!([{"key": "9e1e59012f7f704b21daedd11ff7b4900b19e107", "queue": "default", "kind": "interval", "interval_secs": 60,
            "next_fire": "2026-12-01T00:31:00Z", "runs_left": null, "callable": "mymod.report"},
            {"key": "4658982cab9d32bf1ef9113a9d8bdec01775e2bc", "queue": "email", "kind": "cron", "cron": "*/5 * * * *",
            "next_fire": "2026-12-01T00:35:00Z", "runs_left": 3, "callable": "m.f"}]);
        assert_eq!(
            schedules(&sch, now),
            "QUEUE    KIND      WHEN         NEXT-FIRE (UTC)                 RUNS-LEFT  CALLABLE      KEY\n\
             default  interval  every 1 min  2026-12-01 00:31:00 (in 1 min)          -  mymod.report  9e1e5901\n\
             email    cron      */5 * * * *  2026-12-01 00:35:00 (in 5 min)          3  m.f           4658982c\n"
        );
    }
}
