//! INFORM queue lists (docs/emqp.md "INFORM"): a JSON array of `[weight, name]` pairs,
//! e.g. `[[10, "default"], [5, "email"]]`. EventMQ accepts anything and
//! crashes later; this parser validates every element.
//!
//! Rules (emq's; each refusal names the element and the rule):
//! * the list holds 1 to [`MAX_INFORM_QUEUES`] pairs: `[]` would register a
//!   worker that can never get a job (an empty *frame* asks for the
//!   router's default queues instead);
//! * a weight is an integer from 1 to [`MAX_QUEUE_WEIGHT`] (weights are
//!   priority tiers, highest first; 0 and negative weights only sort below
//!   every real tier and are almost always typos);
//! * a name is a non-empty string of at most [`MAX_QUEUE_NAME_BYTES`] bytes
//!   (UTF-8, as JSON strings are), listed once: a second entry for a name
//!   is refused rather than guessed at (EventMQ added a second candidate
//!   entry, doubling the worker's share of that queue).

use crate::limits::{MAX_INFORM_QUEUES, MAX_QUEUE_NAME_BYTES, MAX_QUEUE_WEIGHT};

/// The queue-name rule both protocols share, as users read it.
pub const QUEUE_NAME_RULE: &str = "1 to 255 characters from A-Z a-z 0-9 _ - . :";

/// Checks a queue name a user typed against the rule of both protocols
/// ([`crate::protocol::text::valid_queue_name`]: the text protocol's `@queue`
/// rule, which eMQP names should follow too so that text clients reach them).
///
/// # Errors
/// The name and the rule, e.g. `queue name "bad queue" is not valid: use 1
/// to 255 characters from A-Z a-z 0-9 _ - . :`.
///
/// ```
/// use emq::protocol::queues::check_queue_name;
/// assert!(check_queue_name("email.high-1").is_ok());
/// assert!(check_queue_name("a@b").unwrap_err().contains("A-Z a-z 0-9 _ - . :"));
/// ```
pub fn check_queue_name(name: &str) -> Result<(), String> {
    if crate::protocol::text::valid_queue_name(name.as_bytes()) {
        return Ok(());
    }
    Err(format!("queue name {name:?} is not valid: use {QUEUE_NAME_RULE}"))
}

/// Why a queue list was rejected. The text names the element.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueListError {
    /// Not JSON at all.
    #[error("queue list is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an array of `[int, "name"]` pairs.
    #[error("queue list element {index}: {why}")]
    BadElement {
        /// Zero-based element index.
        index: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The top level is not an array.
    #[error("queue list must be a JSON array of [weight, \"name\"] pairs")]
    NotArray,
    /// `[]`: no queue at all.
    #[error(
        "queue list is empty: a worker must serve at least one queue (send an empty frame for the router's defaults)"
    )]
    Empty,
    /// More than [`MAX_INFORM_QUEUES`] pairs.
    #[error("queue list has {0} entries; at most {MAX_INFORM_QUEUES}")]
    TooMany(usize),
    /// A name listed twice.
    #[error("queue list elements {first} and {again}: queue {name:?} is listed twice")]
    Duplicate {
        /// The name.
        name: String,
        /// Index of its first entry.
        first: usize,
        /// Index of the repeat.
        again: usize,
    },
}

/// Parses an INFORM queue list into `(weight, name)` pairs in INFORM order,
/// by the rules in the module docs.
///
/// Weights are integers (JSON floats with an integral value are accepted, as
/// Python would sort them alike). Time and memory are linear in the list's
/// size.
///
/// # Errors
/// [`QueueListError`] naming the first bad element.
///
/// # Example
/// ```
/// use emq::protocol::queues::parse_queue_list;
/// let q = parse_queue_list(br#"[[10, "default"], [5, "email"]]"#).unwrap();
/// assert_eq!(q, vec![(10, "default".to_string()), (5, "email".to_string())]);
/// assert!(parse_queue_list(br#"[["default", 10]]"#).is_err());
/// assert!(parse_queue_list(b"[]").is_err());
/// assert!(parse_queue_list(br#"[[-5, "q"]]"#).is_err());
/// ```
pub fn parse_queue_list(json: &[u8]) -> Result<Vec<(i64, String)>, QueueListError> {
    let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| QueueListError::NotJson(e.to_string()))?;
    let items = value.as_array().ok_or(QueueListError::NotArray)?;
    match items.len() {
        0 => return Err(QueueListError::Empty),
        n if n > MAX_INFORM_QUEUES => return Err(QueueListError::TooMany(n)),
        _ => {}
    }
    let mut out: Vec<(i64, String)> = Vec::with_capacity(items.len());
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let bad = |why| QueueListError::BadElement { index, why };
        let pair = item.as_array().filter(|p| p.len() == 2).ok_or(bad("expected a [weight, \"name\"] pair"))?;
        let weight = match &pair[0] {
            serde_json::Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15).map(|f| f as i64))
                .ok_or(bad("weight must be an integer"))?,
            _ => return Err(bad("weight must be an integer")),
        };
        if !(1..=MAX_QUEUE_WEIGHT).contains(&weight) {
            return Err(bad(WEIGHT_RANGE));
        }
        let name = pair[1].as_str().ok_or(bad("name must be a string"))?;
        if name.is_empty() {
            return Err(bad("name must not be empty"));
        }
        if name.len() > MAX_QUEUE_NAME_BYTES {
            return Err(bad(NAME_LENGTH));
        }
        if let Some(&first) = seen.get(name) {
            return Err(QueueListError::Duplicate { name: name.to_string(), first, again: index });
        }
        seen.insert(name, index);
        out.push((weight, name.to_string()));
    }
    Ok(out)
}

/// The weight rule as the refusal states it.
const WEIGHT_RANGE: &str = "weight must be from 1 to 1000000";
/// The name length rule as the refusal states it.
const NAME_LENGTH: &str = "name must be at most 255 bytes";

/// Encodes `(weight, name)` pairs the way Python's `json.dumps` does
/// (`", "` separators), as a jobmanager's INFORM carries them.
pub fn encode_queue_list(queues: &[(i64, String)]) -> String {
    let items: Vec<String> =
        queues.iter().map(|(w, n)| format!("[{}, {}]", w, serde_json::Value::String(n.clone()))).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage() {
        for bad in [&b"x"[..], b"{}", b"[1]", b"[[1]]", b"[[\"a\", 1]]", b"[[1, \"\"]]", b"[[1.5, \"a\"]]"] {
            assert!(parse_queue_list(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn refusals_name_the_rule() {
        let err = |json: &str| parse_queue_list(json.as_bytes()).unwrap_err().to_string();
        assert!(err("[]").contains("empty"));
        assert_eq!(err(r#"[[10, "a"], [-5, "q"]]"#), "queue list element 1: weight must be from 1 to 1000000");
        assert_eq!(err(r#"[[0, "q"]]"#), "queue list element 0: weight must be from 1 to 1000000");
        assert!(err(r#"[[1000001, "q"]]"#).contains("from 1 to"));
        assert_eq!(
            err(r#"[[10, "a"], [5, "b"], [1, "a"]]"#),
            r#"queue list elements 0 and 2: queue "a" is listed twice"#
        );
        assert!(err(&format!(r#"[[1, "{}"]]"#, "x".repeat(256))).contains("at most 255 bytes"));
        let many: Vec<String> = (0..=MAX_INFORM_QUEUES).map(|i| format!(r#"[1, "q{i}"]"#)).collect();
        assert!(err(&format!("[{}]", many.join(","))).contains("at most 1024"));
        assert_eq!(parse_queue_list(br#"[[1000000, "q"], [1, "r"]]"#).unwrap().len(), 2);
    }

    #[test]
    fn stated_limits_match_the_constants() {
        assert_eq!(WEIGHT_RANGE, format!("weight must be from 1 to {MAX_QUEUE_WEIGHT}"));
        assert_eq!(NAME_LENGTH, format!("name must be at most {MAX_QUEUE_NAME_BYTES} bytes"));
    }

    #[test]
    fn encode_matches_python() {
        let q = vec![(10, "default".to_string()), (5, "email".to_string())];
        assert_eq!(encode_queue_list(&q), r#"[[10, "default"], [5, "email"]]"#);
    }
}
