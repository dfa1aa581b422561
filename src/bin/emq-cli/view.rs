//! One admin view over several owners (router names, `;` in `--admin`,
//! docs/admin.md): the answers of each owner's serving router put
//! together. Pure functions over the answers' JSON; emq-cli.rs asks.
//!
//! * `status`: counts added up (every integer `*_by_queue` figure, the
//!   `processed_messages_by_worker` counts, `emq.counters`, `emq.text`'s
//!   numbers but `fd_limit` and `buffered_bytes_peak`, `emq.workers`, `emq.shards`, `emq.asks_waiting`); queue
//!   lists (`served_queues`, `asked_queues`) joined; the largest
//!   `max_latency_messages_by_queue`; percentiles left out (they cannot be
//!   added: `emq-cli latency` shows them per router). What stays per
//!   owner (version, uptime, state, the job log, ownership) is in
//!   `owners`.
//! * `workers`, `dead list`: every owner's rows with the router's name.
//! * `latency`: one row per router and queue (no merged percentile).
//!
//! An owner that did not answer is in `owners` with its `error`, and the
//! view is `partial`.

use serde_json::{json, Map, Value};

use super::table;

/// What one owner answered (or why not).
pub struct Owned {
    /// Its index in `--admin` (0 for the first `;`-separated part).
    pub owner: usize,
    /// The address of the router that answered for it (its first
    /// address when none did).
    pub admin: String,
    /// Its router name (STATUS `emq.router_name`, else
    /// `emq.wal.nats.router_name`; `None` when unknown: no answer, or an
    /// EventMQ router).
    pub router: Option<String>,
    /// The command's answer, or the error.
    pub answer: Result<Value, String>,
    /// The serving router's STATUS (the answer itself for `status`).
    pub status: Option<Value>,
}

impl Owned {
    /// The name shown in the ROUTER column: the router name, else the
    /// admin address.
    pub fn label(&self) -> String {
        self.router.clone().unwrap_or_else(|| self.admin.clone())
    }
}

/// The router name a STATUS gives, if any.
pub fn router_name(status: &Value) -> Option<String> {
    let name = status.pointer("/emq/router_name").or_else(|| status.pointer("/emq/wal/nats/router_name"));
    name.and_then(Value::as_str).map(str::to_string)
}

/// `owners` of every view: per owner `owner`, `router`, `admin`, and
/// `error` (null when it answered), with what stays per owner from its
/// STATUS: `version`, `uptime_secs`, `state` (accepting jobs, draining,
/// refusing new jobs (…), standby…).
fn owners(answers: &[Owned]) -> Value {
    let rows = answers.iter().map(|a| {
        let emq = a.status.as_ref().and_then(|s| s.get("emq"));
        json!({
            "owner": a.owner,
            "router": a.router,
            "admin": a.admin,
            "error": a.answer.as_ref().err(),
            "version": emq.and_then(|e| e.get("version")),
            "uptime_secs": emq.and_then(|e| e.get("uptime_secs")),
            "state": emq.map(table::admission),
        })
    });
    Value::Array(rows.collect())
}

/// Whether some owner did not answer.
fn partial(answers: &[Owned]) -> bool {
    answers.iter().any(|a| a.answer.is_err())
}

/// Adds `from`'s integer leaves into `into` (objects recursively);
/// `keep_max` names leaves that take the larger value instead (limits,
/// peaks).
fn add(into: &mut Map<String, Value>, from: &Map<String, Value>, keep_max: &[&str]) {
    for (key, value) in from {
        match value {
            Value::Object(inner) => {
                let slot = into.entry(key.clone()).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(slot) = slot {
                    add(slot, inner, keep_max);
                }
            }
            Value::Number(n) => {
                let Some(n) = n.as_u64() else { continue };
                let was = into.get(key).and_then(Value::as_u64).unwrap_or(0);
                let sum = if keep_max.contains(&key.as_str()) { was.max(n) } else { was.saturating_add(n) };
                into.insert(key.clone(), json!(sum));
            }
            _ => {}
        }
    }
}

/// STATUS figures that are percentiles: never added.
fn is_percentile(key: &str) -> bool {
    key.contains("_p50_") || key.contains("_p99_") || key == "latency_messages_by_queue"
}

/// The summed STATUS (module docs): STATUS's shape for what is added
/// up, plus `owners`, `partial` and `routers_answered`.
pub fn status(answers: &[Owned]) -> Value {
    let mut sum = Map::new();
    let mut lists: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut emq = Map::new();
    for v in answers.iter().filter_map(|a| a.answer.as_ref().ok()) {
        for (key, value) in v.as_object().into_iter().flatten() {
            match (key.as_str(), value) {
                (k, Value::Object(m)) if k.ends_with("_by_queue") || k.ends_with("_by_worker") => {
                    if is_percentile(k) {
                        continue;
                    }
                    let slot = sum.entry(key.clone()).or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(slot) = slot {
                        let max = if k == "max_latency_messages_by_queue" {
                            m.keys().map(String::as_str).collect()
                        } else {
                            Vec::new()
                        };
                        add(slot, m, &max);
                    }
                }
                ("served_queues" | "asked_queues", Value::Array(names)) => {
                    let list = &mut lists[usize::from(key == "asked_queues")];
                    list.extend(names.iter().filter_map(Value::as_str).map(str::to_string));
                }
                _ => {}
            }
        }
        let Some(e) = v.get("emq").and_then(Value::as_object) else { continue };
        let mut picked = Map::new();
        for key in ["counters", "text", "workers", "shards", "asks_waiting"] {
            if let Some(x) = e.get(key) {
                picked.insert(key.to_string(), x.clone());
            }
        }
        if let Some(Value::Object(text)) = picked.get_mut("text") {
            // Limits and peaks of one process: no sum.
            text.remove("fd_limit");
            text.remove("buffered_bytes_peak");
        }
        add(&mut emq, &picked, &[]);
    }
    for (key, mut list) in ["served_queues", "asked_queues"].into_iter().zip(lists) {
        list.sort();
        list.dedup();
        sum.insert(key.into(), json!(list));
    }
    let answered = answers.iter().filter(|a| a.answer.is_ok()).count();
    emq.insert("routers_answered".into(), json!(answered));
    sum.insert("emq".into(), Value::Object(emq));
    sum.insert("owners".into(), owners(answers));
    sum.insert("partial".into(), json!(partial(answers)));
    Value::Object(sum)
}

/// The lines above every merged table: which routers it covers, and
/// which did not answer.
fn heading(v: &Value, what: &str) -> String {
    let owners = v.get("owners").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let label = |o: &Value| {
        let admin = o.get("admin").and_then(Value::as_str).unwrap_or("?");
        match o.get("router").and_then(Value::as_str) {
            Some(name) => format!("{name} ({admin})"),
            None => admin.to_string(),
        }
    };
    let ok: Vec<String> = owners.iter().filter(|o| o["error"].is_null()).map(label).collect();
    let mut out = format!("{what} of {} of {} router name(s): {}\n", ok.len(), owners.len(), ok.join(", "));
    for o in owners.iter().filter(|o| !o["error"].is_null()) {
        let why = o["error"].as_str().unwrap_or("?");
        out += &format!("PARTIAL: owner {} {} did not answer: {why}\n", o["owner"], label(o));
    }
    out
}

/// The summed STATUS as tables: the heading, the queue table, then per
/// owner its state and the summed counters.
pub fn status_table(v: &Value) -> String {
    let mut out = heading(v, "summed STATUS");
    out += &table::queues(v, true);
    out += "(percentiles are not summed: emq-cli latency shows them per router)\n\n";
    let owners = v.get("owners").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = owners
        .iter()
        .map(|o| {
            let text = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
            let up = o.get("uptime_secs").and_then(Value::as_u64).map_or("-".into(), table::duration);
            let state = if o["error"].is_null() { text("state") } else { "no answer".into() };
            vec![text("router"), text("admin"), text("version"), up, state]
        })
        .collect();
    out += &table::render(&["ROUTER", "ADMIN", "VERSION", "UP", "STATE"], &rows);
    if let Some(emq) = v.get("emq") {
        let mut figures = Vec::new();
        for key in ["workers", "shards", "asks_waiting"] {
            figures.push(format!("{key}={}", emq.get(key).and_then(Value::as_u64).unwrap_or(0)));
        }
        out += &format!("summed: {}\n", figures.join(" "));
        for key in ["counters", "text"] {
            let mut figures = Vec::new();
            table::nonzero(emq.get(key).unwrap_or(&Value::Null), "", &mut figures);
            if !figures.is_empty() {
                out += &emq::program::printable(&format!("{key} (summed): {}", figures.join(" ")));
                out += "\n";
            }
        }
    }
    out
}

/// Every owner's workers: `{"owners", "partial", "workers": [{"router",
/// "id", …ROUTER_SHOW_WORKERS's fields}]}`.
pub fn workers(answers: &[Owned]) -> Value {
    let mut rows = Vec::new();
    for a in answers {
        let Ok(v) = &a.answer else { continue };
        for (id, w) in v.get("connected_workers").and_then(Value::as_object).into_iter().flatten() {
            let mut row = w.as_object().cloned().unwrap_or_default();
            row.insert("router".into(), json!(a.label()));
            row.insert("id".into(), json!(id));
            rows.push(Value::Object(row));
        }
    }
    json!({"owners": owners(answers), "partial": partial(answers), "workers": rows})
}

/// [`workers`] as a table: ROUTER, then `emq-cli workers`'s columns.
pub fn workers_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v
        .get("workers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|w| {
            let mut row = vec![w.get("router").and_then(Value::as_str).unwrap_or("-").to_string()];
            row.extend(table::worker_row(w.get("id").and_then(Value::as_str).unwrap_or("-"), w));
            row
        })
        .collect();
    let mut header = vec!["ROUTER"];
    header.extend(table::WORKERS_HEADER);
    heading(v, "workers") + &table::render(&header, &rows)
}

/// Every owner's dead jobs, oldest first: `{"owners", "partial", "jobs":
/// [{"router", …DEAD_LIST's job}], "total"}` (`total`: the owners'
/// totals added; each lists its oldest 1,000).
pub fn dead_list(answers: &[Owned]) -> Value {
    let mut jobs = Vec::new();
    let mut total = 0u64;
    for a in answers {
        let Ok(v) = &a.answer else { continue };
        total += v.get("total").and_then(Value::as_u64).unwrap_or(0);
        for j in v.get("jobs").and_then(Value::as_array).into_iter().flatten() {
            let mut row = j.as_object().cloned().unwrap_or_default();
            row.insert("router".into(), json!(a.label()));
            jobs.push(Value::Object(row));
        }
    }
    let at = |j: &Value| j.get("dead_at").and_then(Value::as_f64).unwrap_or(0.0);
    jobs.sort_by(|a, b| at(a).total_cmp(&at(b)));
    json!({"owners": owners(answers), "partial": partial(answers), "jobs": jobs, "total": total})
}

/// [`dead_list`] as a table: ROUTER, then `emq-cli dead list`'s columns,
/// and the total.
pub fn dead_list_table(v: &Value) -> String {
    let jobs = v.get("jobs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let mut row = vec![j.get("router").and_then(Value::as_str).unwrap_or("-").to_string()];
            row.extend(table::dead_row(j));
            row
        })
        .collect();
    let mut header = vec!["ROUTER"];
    header.extend(table::DEAD_HEADER);
    let mut out = heading(v, "dead jobs") + &table::render(&header, &rows);
    let total = v.get("total").and_then(Value::as_u64).unwrap_or(0);
    let n = |n: u64| if n == 1 { "1 dead job".to_string() } else { format!("{n} dead jobs") };
    match total > rows.len() as u64 {
        true => out += &format!("({} of {} listed, the oldest of each router)\n", rows.len(), n(total)),
        false => out += &format!("({})\n", n(total)),
    }
    out
}

/// Every owner's LATENCY, kept apart (percentiles cannot be added):
/// `{"owners", "partial", "unit": "us", "routers": [{"router", "admin",
/// "queues"}]}`.
pub fn latency(answers: &[Owned]) -> Value {
    let routers: Vec<Value> = answers
        .iter()
        .filter_map(|a| {
            let v = a.answer.as_ref().ok()?;
            Some(
                json!({"router": a.label(), "admin": a.admin, "queues": v.get("queues").cloned().unwrap_or(json!({}))}),
            )
        })
        .collect();
    json!({"owners": owners(answers), "partial": partial(answers), "unit": "us", "routers": routers})
}

/// [`latency`] as a table: ROUTER, then `emq-cli latency`'s columns.
pub fn latency_table(v: &Value) -> String {
    let mut rows = Vec::new();
    for r in v.get("routers").and_then(Value::as_array).into_iter().flatten() {
        let name = r.get("router").and_then(Value::as_str).unwrap_or("-").to_string();
        for row in table::latency_rows(r) {
            rows.push(std::iter::once(name.clone()).chain(row).collect::<Vec<_>>());
        }
    }
    let mut header = vec!["ROUTER"];
    header.extend(table::LATENCY_HEADER);
    let mut out = heading(v, "latency") + &table::render(&header, &rows);
    out += "(one row per router and queue: percentiles of several routers cannot be added)\n";
    out
}

/// `--per-router`: each owner's answer as it is, `{"routers": [{"owner",
/// "router", "admin", "answer"} or {"owner", "router", "admin",
/// "error"}]}`, and as tables under `== router <name> (<admin>)` lines.
pub fn per_router(answers: &[Owned], one: impl Fn(&Value) -> String) -> (Value, String) {
    let mut text = String::new();
    let rows: Vec<Value> = answers
        .iter()
        .map(|a| {
            let head = format!("== router {} ({})\n", a.router.as_deref().unwrap_or("?"), a.admin);
            match &a.answer {
                Ok(v) => {
                    text += &format!("{head}{}\n", one(v));
                    json!({"owner": a.owner, "router": a.router, "admin": a.admin, "answer": v})
                }
                Err(e) => {
                    text += &format!("{head}no answer: {e}\n\n");
                    json!({"owner": a.owner, "router": a.router, "admin": a.admin, "error": e})
                }
            }
        })
        .collect();
    (json!({ "routers": rows }), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(owner: usize, router: &str, answer: Result<Value, String>) -> Owned {
        let status = answer.as_ref().ok().cloned();
        Owned { owner, admin: format!("tcp://h:{owner}"), router: Some(router.into()), answer, status }
    }

    #[test]
    fn status_adds_counts_joins_queues_and_leaves_percentiles_out() {
        let a = json!({"waiting_messages_by_queue": {"q": 2, "x": 1}, "accepted_messages_by_queue": {"q": 3},
            "end_to_end_p50_ms_by_queue": {"q": 1.5}, "max_latency_messages_by_queue": {"q": 9},
            "served_queues": ["q"], "asked_queues": [],
            "emq": {"version": "0.1.0", "uptime_secs": 5, "draining": false, "workers": 2, "shards": 1, "asks_waiting": 0,
                    "counters": {"accepted_jobs": 3}, "text": {"fd_limit": 100, "errors_by_code": {"BUSY": 1}}}});
        let b = json!({"waiting_messages_by_queue": {"q": 5}, "accepted_messages_by_queue": {"q": 1, "y": 4},
            "max_latency_messages_by_queue": {"q": 4},
            "served_queues": ["y", "q"], "asked_queues": ["z"],
            "emq": {"version": "0.1.0", "uptime_secs": 7, "draining": true, "workers": 1, "shards": 2, "asks_waiting": 1,
                    "counters": {"accepted_jobs": 5}, "text": {"fd_limit": 50, "errors_by_code": {"BUSY": 2}}}});
        let all = [owned(0, "a", Ok(a)), owned(1, "b", Ok(b)), owned(2, "c", Err("no answer within 3s".into()))];
        let v = status(&all);
        assert_eq!(v["waiting_messages_by_queue"], json!({"q": 7, "x": 1}));
        assert_eq!(v["accepted_messages_by_queue"], json!({"q": 4, "y": 4}));
        assert_eq!(v["max_latency_messages_by_queue"], json!({"q": 9}));
        assert!(v.get("end_to_end_p50_ms_by_queue").is_none(), "{v}");
        assert_eq!((v["served_queues"].clone(), v["asked_queues"].clone()), (json!(["q", "y"]), json!(["z"])));
        let emq = &v["emq"];
        assert_eq!(
            (emq["workers"].as_u64(), emq["shards"].as_u64(), emq["asks_waiting"].as_u64()),
            (Some(3), Some(3), Some(1))
        );
        assert_eq!(emq["counters"]["accepted_jobs"], 8);
        assert_eq!((emq["text"].get("fd_limit"), emq["text"]["errors_by_code"]["BUSY"].as_u64()), (None, Some(3)));
        assert_eq!((v["partial"].as_bool(), emq["routers_answered"].as_u64()), (Some(true), Some(2)));
        assert_eq!(v["owners"][1]["state"], "draining");
        assert_eq!(v["owners"][2]["error"], "no answer within 3s");
        let t = status_table(&v);
        assert!(
            t.starts_with(
                "summed STATUS of 2 of 3 router name(s): a (tcp://h:0), b (tcp://h:1)\n\
            PARTIAL: owner 2 c (tcp://h:2) did not answer: no answer within 3s\n\
            QUEUE  WAITING  IN-FLIGHT"
            ),
            "{t}"
        );
        assert!(t.contains("\nq            7          0"), "{t}");
        assert!(t.contains("b       tcp://h:1  0.1.0    7 s  draining\n"), "{t}");
        assert!(t.contains("summed: workers=3 shards=3 asks_waiting=1\ncounters (summed): accepted_jobs=8\n"), "{t}");
    }

    #[test]
    fn workers_dead_jobs_and_latency_carry_the_router() {
        let w = |id: &str| json!({"connected_workers": {id: {"queues": [[1, "q"]], "available_slots": 2, "state": "live"}}});
        let all = [owned(0, "a", Ok(w("w1"))), owned(1, "b", Ok(w("w1")))];
        let t = workers_table(&workers(&all));
        assert!(
            t.ends_with(
                "ROUTER  WORKER  STATE  SLOTS  IN-FLIGHT  LAST-HEARD  QUEUES\n\
            a       w1      live       2          -           -  q:1\n\
            b       w1      live       2          -           -  q:1\n"
            ),
            "{t}"
        );
        let d = |id: &str, at: f64| json!({"jobs": [{"id": id, "queue": "q", "dead_at": at}], "total": 3});
        let v = dead_list(&[owned(0, "a", Ok(d("0-1", 20.0))), owned(1, "b", Ok(d("0-1", 10.0)))]);
        assert_eq!((v["jobs"][0]["router"].as_str(), v["total"].as_u64()), (Some("b"), Some(6)), "oldest first: {v}");
        let t = dead_list_table(&v);
        assert!(t.ends_with("(2 of 6 dead jobs listed, the oldest of each router)\n"), "{t}");
        let l = json!({"unit": "us", "queues": {"q": {"end_to_end": {"count": 1, "p50_us": 1000}}}});
        let t = latency_table(&latency(&[owned(0, "a", Ok(l.clone())), owned(1, "b", Ok(l))]));
        assert_eq!(t.lines().filter(|l| l.contains("end to end")).count(), 2, "{t}");
        let (json, text) = per_router(&[owned(0, "a", Err("down".into()))], table::workers);
        assert_eq!(json["routers"][0]["error"], "down");
        assert_eq!(text, "== router a (tcp://h:0)\nno answer: down\n\n");
    }
}
