//! Human-readable tables for admin JSON (spec §3.10 shapes; unknown keys
//! are shown as JSON so new broker fields are never hidden).

use serde_json::Value;

fn num(v: Option<&Value>) -> String {
    match v {
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => other.to_string(),
        None => "-".into(),
    }
}

fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out += &line(row.clone());
    }
    out
}

/// STATUS: one row per queue, then per-worker processed counts, then any other keys.
pub fn status(v: &Value) -> String {
    let sections = [
        ("waiting_messages_by_queue", "WAITING"),
        ("inflight_messages_by_queue", "IN-FLIGHT"),
        ("processed_messages_by_queue", "PROCESSED"),
        ("latency_messages_by_queue", "LATENCY-MS"),
        ("max_latency_messages_by_queue", "MAX-LATENCY-MS"),
    ];
    let mut queues: Vec<String> = Vec::new();
    for (key, _) in sections {
        for q in v.get(key).and_then(Value::as_object).into_iter().flat_map(|m| m.keys()) {
            if !queues.contains(q) {
                queues.push(q.clone());
            }
        }
    }
    queues.sort();
    let mut header = vec!["QUEUE"];
    header.extend(sections.iter().map(|(_, h)| *h));
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            let mut row = vec![q.clone()];
            row.extend(sections.iter().map(|(k, _)| num(v.get(k).and_then(|m| m.get(q)))));
            row
        })
        .collect();
    let mut out = render(&header, &rows);
    if let Some(by_worker) = v.get("processed_messages_by_worker").and_then(Value::as_object) {
        let rows: Vec<Vec<String>> = by_worker.iter().map(|(w, n)| vec![w.clone(), num(Some(n))]).collect();
        out += "\n";
        out += &render(&["WORKER", "PROCESSED"], &rows);
    }
    out += &wal(v);
    out + &extra(v, &[&sections.map(|(k, _)| k)[..], &["processed_messages_by_worker"]].concat())
}

/// STATUS's write-ahead log figures (`emq.wal`): one row per shard.
fn wal(v: &Value) -> String {
    let Some(w) = v.pointer("/emq/wal") else { return String::new() };
    let durability = w.get("durability").and_then(Value::as_str).unwrap_or("-");
    let dir = w.get("data_dir").and_then(Value::as_str).unwrap_or("-");
    let mut out = format!("\ndurability {durability}, data dir {dir}\n");
    let shards = w.get("shards").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if shards.is_empty() {
        return out;
    }
    let keys = ["shard", "log_bytes", "segments", "live_jobs", "last_sync_us", "syncs", "jobs_recovered"];
    let header = ["SHARD", "LOG-BYTES", "SEGMENTS", "LIVE-JOBS", "LAST-SYNC-US", "SYNCS", "RECOVERED"];
    let rows: Vec<Vec<String>> = shards.iter().map(|s| keys.iter().map(|k| num(s.get(*k))).collect()).collect();
    out += &render(&header, &rows);
    out
}

/// ROUTER_SHOW_WORKERS: one row per worker.
pub fn workers(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .get("connected_workers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(id, w)| {
            let queues: Vec<String> = w
                .get("queues")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|p| format!("{}:{}", p.get(1).and_then(Value::as_str).unwrap_or("?"), num(p.get(0))))
                .collect();
            vec![id.clone(), num(w.get("available_slots")), queues.join(",")]
        })
        .collect();
    render(&["WORKER", "SLOTS", "QUEUES (name:weight)"], &rows) + &extra(v, &["connected_workers", "connected_queues"])
}

/// ROUTER_SHOW_SCHEDULERS: one row per scheduler.
pub fn schedulers(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .get("connected_schedulers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(id, s)| vec![id.clone(), num(s.get("hb"))])
        .collect();
    render(&["SCHEDULER", "LAST-HEARTBEAT"], &rows) + &extra(v, &["connected_schedulers"])
}

/// Anything else: an object of objects as a table, otherwise pretty JSON.
pub fn generic(v: &Value) -> String {
    let Some(map) = v.as_object().filter(|m| !m.is_empty() && m.values().all(Value::is_object)) else {
        return serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    };
    let mut cols: Vec<String> = Vec::new();
    for inner in map.values().filter_map(Value::as_object) {
        for k in inner.keys() {
            if !cols.contains(k) {
                cols.push(k.clone());
            }
        }
    }
    let rows: Vec<Vec<String>> = map
        .iter()
        .map(|(name, inner)| {
            let mut row = vec![name.clone()];
            row.extend(cols.iter().map(|c| num(inner.get(c))));
            row
        })
        .collect();
    let upper: Vec<String> = cols.iter().map(|c| c.to_uppercase()).collect();
    let mut header = vec!["NAME"];
    header.extend(upper.iter().map(String::as_str));
    render(&header, &rows)
}

fn extra(v: &Value, known: &[&str]) -> String {
    let Some(map) = v.as_object() else { return String::new() };
    map.iter().filter(|(k, _)| !known.contains(&k.as_str())).map(|(k, val)| format!("{k}: {val}\n")).collect()
}
