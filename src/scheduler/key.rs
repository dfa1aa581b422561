//! The schedule key ("schedule hash", EventMQ 0.3.13, docs/emqp.md "The scheduler"): the
//! lowercase hex SHA-1 of `json.dumps(obj, sort_keys=True)` where `obj` holds
//! the six call fields of element 1 of the job body. Queue, interval, cron
//! and headers are not part of it (kept for compatibility: a Python
//! scheduler sharing the Redis store computes the same key).

use std::fmt;

use sha1::{Digest, Sha1};

use crate::protocol::pyjson::{self, PyJson};

/// The six body fields the key covers, all required (docs/emqp.md "Job bodies").
pub const KEY_FIELDS: [&str; 6] = ["args", "kwargs", "class_args", "class_kwargs", "path", "callable"];

/// A schedule key: 40 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScheduleKey(String);

impl ScheduleKey {
    /// The key text (40 lowercase hex digits).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Accepts stored key text if it is 40 lowercase hex digits.
    pub fn from_hex(text: &str) -> Option<ScheduleKey> {
        let ok = text.len() == 40 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| ScheduleKey(text.to_string()))
    }
}

impl fmt::Display for ScheduleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a job body cannot be keyed (each case killed the Python scheduler).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The body frame is not UTF-8 (Python decodes every frame strictly).
    #[error("job body is not valid UTF-8")]
    NotUtf8,
    /// The body is not JSON.
    #[error("job body: {0}")]
    Json(#[from] pyjson::JsonError),
    /// The body is not an array whose element 1 is an object.
    #[error("job body must be a JSON array [subcommand, {{params}}]")]
    Shape,
    /// Element 1 lacks one of [`KEY_FIELDS`].
    #[error("job body params lack the key {0:?}")]
    MissingField(&'static str),
}

/// A parsed job body with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedBody {
    /// The schedule key.
    pub key: ScheduleKey,
    /// The canonical text that was hashed (for logs and tests).
    pub canonical: String,
    /// `json.dumps(json.loads(body))`: the body as the Python scheduler
    /// writes it into emitted REQUESTs (docs/emqp.md "The scheduler").
    pub request_body: String,
}

/// Parses a SCHEDULE/UNSCHEDULE body frame (frame 7) and computes its key.
///
/// # Errors
/// [`KeyError`] when the frame is not UTF-8, not JSON, not `[x, {...}]`, or
/// lacks one of the six fields.
///
/// # Example
/// ```
/// use emq::scheduler::key::key_body;
/// let body = br#"["run", {"callable": "add", "path": "jobs_mod", "args": [1, 2], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#;
/// assert_eq!(key_body(body).unwrap().key.as_str(), "9e1e59012f7f704b21daedd11ff7b4900b19e107");
/// ```
pub fn key_body(body: &[u8]) -> Result<KeyedBody, KeyError> {
    let text = std::str::from_utf8(body).map_err(|_| KeyError::NotUtf8)?;
    let value = pyjson::parse(text)?;
    let params = match &value {
        PyJson::Array(items) if items.len() >= 2 => &items[1],
        _ => return Err(KeyError::Shape),
    };
    if !matches!(params, PyJson::Object(_)) {
        return Err(KeyError::Shape);
    }
    let mut members = Vec::with_capacity(KEY_FIELDS.len());
    for field in KEY_FIELDS {
        let v = params.get(field).ok_or(KeyError::MissingField(field))?;
        members.push((pyjson::py_str(field), v.clone()));
    }
    let canonical = PyJson::Object(members).dumps(true);
    Ok(KeyedBody { key: hash(&canonical), canonical, request_body: value.dumps(false) })
}

fn hash(canonical: &str) -> ScheduleKey {
    ScheduleKey(hex::encode(Sha1::digest(canonical.as_bytes())))
}
