//! JSON values with CPython `json` semantics, for byte-exact reproduction of
//! `json.loads` followed by `json.dumps` (EventMQ 0.3.13, docs/emqp.md "The scheduler").
//!
//! serde_json cannot be used here without changing the whole crate's
//! behaviour: Python keeps `1` and `1.0` apart, keeps lone surrogates from
//! `\ud800` escapes, writes floats with `repr` (`1e+16`, `1e-05`, `-0.0`) and
//! accepts `NaN`/`Infinity`. This module does exactly that and nothing more.
//!
//! * [`parse`] mirrors `json.loads` (strict mode): the same grammar, the same
//!   number split (a fraction or exponent makes a float), `\uXXXX` surrogate
//!   pairs combined, lone surrogates kept, duplicate object keys resolved as
//!   a Python dict does (first position, last value).
//! * [`PyJson::dumps`] mirrors `json.dumps(v)` and, with `sort_keys`,
//!   `json.dumps(v, sort_keys=True)`: separators `", "` / `": "`,
//!   `ensure_ascii=True`.
//!
//! The one Python-style JSON writer of the crate: the scheduler uses it for
//! the schedule key and the REQUEST bodies it re-emits (docs/emqp.md "The scheduler");
//! the client uses it for job bodies and job results through
//! [`PyJson::from`] a `serde_json::Value` (docs/emqp.md "Job bodies") and
//! [`write_str`].

use std::fmt::Write as _;

use serde_json::{Map, Value};

mod parse;

pub use parse::{parse, JsonError};

/// A string as Python holds it: a sequence of code points, which may include
/// lone surrogates (U+D800..U+DFFF) from `\u` escapes.
pub type PyStr = Vec<u32>;

/// A JSON value as CPython's `json.loads` builds it.
#[derive(Debug, Clone, PartialEq)]
pub enum PyJson {
    /// `null` (Python `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer (no fraction, no exponent), kept as normalized decimal text
    /// because Python ints are unbounded.
    Int(String),
    /// A float: the number had a fraction or an exponent, or was `NaN`,
    /// `Infinity` or `-Infinity`.
    Float(f64),
    /// A string.
    Str(PyStr),
    /// An array.
    Array(Vec<PyJson>),
    /// An object, in insertion order (a Python dict).
    Object(Vec<(PyStr, PyJson)>),
}

impl PyJson {
    /// The text of `json.dumps(self)` (or `json.dumps(self, sort_keys=True)`
    /// when `sort_keys`): ASCII only, separators `", "` and `": "`.
    pub fn dumps(&self, sort_keys: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, sort_keys);
        out
    }

    fn write(&self, out: &mut String, sort_keys: bool) {
        match self {
            PyJson::Null => out.push_str("null"),
            PyJson::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            PyJson::Int(i) => out.push_str(i),
            PyJson::Float(f) => out.push_str(&float_repr(*f)),
            PyJson::Str(s) => write_str(out, s.iter().copied()),
            PyJson::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write(out, sort_keys);
                }
                out.push(']');
            }
            PyJson::Object(members) => {
                let mut refs: Vec<&(PyStr, PyJson)> = members.iter().collect();
                if sort_keys {
                    refs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (k, v)) in refs.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_str(out, k.iter().copied());
                    out.push_str(": ");
                    v.write(out, sort_keys);
                }
                out.push('}');
            }
        }
    }

    /// The member `name` of an object, if this is an object that has it.
    pub fn get(&self, name: &str) -> Option<&PyJson> {
        let PyJson::Object(members) = self else { return None };
        let key = py_str(name);
        members.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// A serde_json value as Python's `json.loads` would have built it from
/// serde_json's text: integers stay ints, other numbers become floats, and
/// object members keep their order.
///
/// ```
/// use emq::protocol::pyjson::PyJson;
/// let v: serde_json::Value = serde_json::from_str(r#"{"a": "é", "b": [1, 2.5, 1e16, null, true]}"#).unwrap();
/// assert_eq!(PyJson::from(&v).dumps(false), r#"{"a": "\u00e9", "b": [1, 2.5, 1e+16, null, true]}"#);
/// ```
impl From<&Value> for PyJson {
    fn from(value: &Value) -> PyJson {
        match value {
            Value::Null => PyJson::Null,
            Value::Bool(b) => PyJson::Bool(*b),
            Value::Number(n) if n.is_i64() || n.is_u64() => PyJson::Int(n.to_string()),
            Value::Number(n) => PyJson::Float(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => PyJson::Str(py_str(s)),
            Value::Array(items) => PyJson::Array(items.iter().map(PyJson::from).collect()),
            Value::Object(map) => PyJson::from(map),
        }
    }
}

/// A serde_json object as a Python dict (member order kept).
impl From<&Map<String, Value>> for PyJson {
    fn from(map: &Map<String, Value>) -> PyJson {
        PyJson::Object(map.iter().map(|(k, v)| (py_str(k), PyJson::from(v))).collect())
    }
}

/// Builds a [`PyStr`] from Rust text.
pub fn py_str(s: &str) -> PyStr {
    s.chars().map(|c| c as u32).collect()
}

/// Writes the code points `s` as a JSON string literal with Python's
/// `ensure_ascii` escaping (a [`PyStr`] as `s.iter().copied()`, Rust text
/// as `text.chars().map(u32::from)`).
///
/// ```
/// let mut out = String::new();
/// emq::protocol::pyjson::write_str(&mut out, "é\"\u{7f}😀".chars().map(u32::from));
/// assert_eq!(out, r#""\u00e9\"\u007f\ud83d\ude00""#);
/// ```
pub fn write_str(out: &mut String, s: impl IntoIterator<Item = u32>) {
    out.push('"');
    for cp in s {
        match cp {
            0x22 => out.push_str("\\\""),
            0x5c => out.push_str("\\\\"),
            0x0a => out.push_str("\\n"),
            0x0d => out.push_str("\\r"),
            0x09 => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            0x20..=0x7e => out.push(char::from(cp as u8)),
            0x10000.. => {
                let v = cp - 0x10000;
                let _ = write!(out, "\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            }
            _ => {
                let _ = write!(out, "\\u{cp:04x}");
            }
        }
    }
    out.push('"');
}

/// Python's `float.__repr__` as `json.dumps` writes it: the shortest
/// round-trip digits, exponent form when the exponent is below −4 or at
/// least 16 (`1e+16`, `1e-05`), `.0` on integral values, `NaN`,
/// `Infinity`, `-Infinity`, and `-0.0`.
///
/// ```
/// use emq::protocol::pyjson::float_repr;
/// assert_eq!(float_repr(1e16), "1e+16");
/// assert_eq!(float_repr(1e15), "1000000000000000.0");
/// assert_eq!(float_repr(0.00001), "1e-05");
/// assert_eq!(float_repr(-0.0), "-0.0");
/// assert_eq!(float_repr(0.1), "0.1");
/// ```
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits, e.g. "1.2345e-7".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    let body = if !(-4 < decpt && decpt <= 16) {
        let rest = &digits[1..];
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{}{frac}e{esign}{:02}", &digits[..1], exp.abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else if decpt as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
    } else {
        let (a, b) = digits.split_at(decpt as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}
