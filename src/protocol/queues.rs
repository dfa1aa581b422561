//! INFORM queue lists (docs/emqp.md "INFORM"): a JSON array of `[weight, name]` pairs,
//! e.g. `[[10, "default"], [5, "email"]]`. EventMQ accepts anything and
//! crashes later; this parser validates every element.

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
}

/// Parses an INFORM queue list into `(weight, name)` pairs in INFORM order.
///
/// Weights are integers (JSON floats with an integral value are accepted, as
/// Python would sort them alike); names are non-empty strings. A name listed
/// twice keeps its first weight.
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
/// ```
pub fn parse_queue_list(json: &[u8]) -> Result<Vec<(i64, String)>, QueueListError> {
    let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| QueueListError::NotJson(e.to_string()))?;
    let items = value.as_array().ok_or(QueueListError::NotArray)?;
    let mut out: Vec<(i64, String)> = Vec::with_capacity(items.len());
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
        let name = pair[1].as_str().ok_or(bad("name must be a string"))?;
        if name.is_empty() {
            return Err(bad("name must not be empty"));
        }
        if !out.iter().any(|(_, n)| n == name) {
            out.push((weight, name.to_string()));
        }
    }
    Ok(out)
}

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
        assert_eq!(parse_queue_list(b"[]").unwrap(), vec![]);
    }

    #[test]
    fn encode_matches_python() {
        let q = vec![(10, "default".to_string()), (5, "email".to_string())];
        assert_eq!(encode_queue_list(&q), r#"[[10, "default"], [5, "email"]]"#);
    }
}
