//! Python job bodies (docs/emqp.md "Job bodies"): `["run", {"callable": …, "path": …, "args": …,
//! "kwargs": …, "class_args": …, "class_kwargs": …}]`, the six keys in the
//! order the Python client writes them, written by the crate's one
//! `json.dumps` writer ([`crate::protocol::pyjson`]). The Python scheduler
//! requires all six keys.

use serde_json::{Map, Value};

use crate::protocol::pyjson::{self, py_str, PyJson};

/// One Python call as the EventMQ client addresses it (docs/emqp.md "Job bodies").
#[derive(Debug, Clone, PartialEq)]
pub struct PythonCall {
    /// `callable`: the function or method name, e.g. `add`.
    pub callable: String,
    /// `path`: the module (`pkg.mod`) or `pkg.mod:ClassName` for a method.
    pub path: String,
    /// `args`: positional arguments.
    pub args: Vec<Value>,
    /// `kwargs`: keyword arguments.
    pub kwargs: Map<String, Value>,
    /// `class_args`: positional arguments of the class constructor.
    pub class_args: Vec<Value>,
    /// `class_kwargs`: keyword arguments of the class constructor.
    pub class_kwargs: Map<String, Value>,
}

impl PythonCall {
    /// A call of `callable` in module `path` with no arguments.
    pub fn new(path: &str, callable: &str) -> PythonCall {
        PythonCall {
            callable: callable.to_string(),
            path: path.to_string(),
            args: Vec::new(),
            kwargs: Map::new(),
            class_args: Vec::new(),
            class_kwargs: Map::new(),
        }
    }

    /// Splits a dotted name at its last dot like the Python client
    /// (`"jobs_mod.add"` → path `jobs_mod`, callable `add`). `None` when the
    /// name has no dot or an empty part (the Python client rejects it too).
    pub fn from_dotted(name: &str) -> Option<PythonCall> {
        let (path, callable) = name.rsplit_once('.')?;
        (!path.is_empty() && !callable.is_empty()).then(|| PythonCall::new(path, callable))
    }

    /// Sets the positional arguments.
    pub fn args(mut self, args: Vec<Value>) -> PythonCall {
        self.args = args;
        self
    }

    /// Sets the keyword arguments.
    pub fn kwargs(mut self, kwargs: Map<String, Value>) -> PythonCall {
        self.kwargs = kwargs;
        self
    }

    /// The REQUEST/SCHEDULE body bytes, byte-exact with the Python client.
    ///
    /// ```
    /// use emq::client::body::PythonCall;
    /// let body = PythonCall::new("jobs_mod", "add").args(vec![2.into(), 3.into()]).body();
    /// assert_eq!(
    ///     String::from_utf8(body).unwrap(),
    ///     r#"["run", {"callable": "add", "path": "jobs_mod", "args": [2, 3], "kwargs": {}, "class_args": [], "class_kwargs": {}}]"#
    /// );
    /// ```
    pub fn body(&self) -> Vec<u8> {
        let list = |items: &[Value]| PyJson::Array(items.iter().map(PyJson::from).collect());
        let params = PyJson::Object(vec![
            (py_str("callable"), PyJson::Str(py_str(&self.callable))),
            (py_str("path"), PyJson::Str(py_str(&self.path))),
            (py_str("args"), list(&self.args)),
            (py_str("kwargs"), PyJson::from(&self.kwargs)),
            (py_str("class_args"), list(&self.class_args)),
            (py_str("class_kwargs"), PyJson::from(&self.class_kwargs)),
        ]);
        PyJson::Array(vec![PyJson::Str(py_str("run")), params]).dumps(false).into_bytes()
    }

    /// The call as people write it: `mymod.report`, `pkg.mod:Class.method`.
    ///
    /// ```
    /// use emq::client::body::PythonCall;
    /// assert_eq!(PythonCall::new("pkg.mod:Report", "daily").name(), "pkg.mod:Report.daily");
    /// ```
    pub fn name(&self) -> String {
        format!("{}.{}", self.path, self.callable)
    }

    /// Reads the params object (element 1) of a body; missing optional keys
    /// default to empty like the Python worker. `None` when the body is not
    /// a JSON array of at least 2 elements or lacks `path`/`callable`.
    pub fn parse(body: &[u8]) -> Option<PythonCall> {
        let value: Value = serde_json::from_slice(body).ok()?;
        let params = value.as_array().filter(|a| a.len() >= 2)?[1].as_object()?;
        let text = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_string);
        let list = |k: &str| params.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
        let map = |k: &str| params.get(k).and_then(Value::as_object).cloned().unwrap_or_default();
        Some(PythonCall {
            callable: text("callable")?,
            path: text("path")?,
            args: list("args"),
            kwargs: map("kwargs"),
            class_args: list("class_args"),
            class_kwargs: map("class_kwargs"),
        })
    }
}

/// The job-result REPLY body (docs/emqp.md "Job results"): `{"value": "<text>"}`, with the
/// text as a JSON string (lossy UTF-8), as `json.dumps({"value": X})` writes it.
///
/// ```
/// assert_eq!(emq::client::body::result_json(b"ok\n"), br#"{"value": "ok\n"}"#.to_vec());
/// ```
pub fn result_json(text: &[u8]) -> Vec<u8> {
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str("{\"value\": ");
    pyjson::write_str(&mut out, String::from_utf8_lossy(text).chars().map(u32::from));
    out.push('}');
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_and_parse_round_trip() {
        let call = PythonCall::from_dotted("a.b.c").unwrap().args(vec![1.into()]);
        assert_eq!((call.path.as_str(), call.callable.as_str()), ("a.b", "c"));
        assert_eq!(PythonCall::parse(&call.body()), Some(call));
        assert!(PythonCall::from_dotted("nodot").is_none());
        assert!(PythonCall::parse(b"[\"run\"]").is_none());
        assert!(PythonCall::parse(b"[\"run\", {\"path\": \"x\"}]").is_none());
    }

    #[test]
    fn body_and_result_escape_like_python() {
        // Expected texts from CPython 3.11's json.dumps.
        let kwargs: Value = serde_json::from_str(r#"{"a": "é\"", "b": [1, 2.5, null, true]}"#).unwrap();
        let call = PythonCall::new("m", "f").args(vec![1e16.into(), 1e-5.into(), "\u{7f}😀".into()]);
        let call = call.kwargs(kwargs.as_object().unwrap().clone());
        assert_eq!(
            String::from_utf8(call.body()).unwrap(),
            r#"["run", {"callable": "f", "path": "m", "args": [1e+16, 1e-05, "\u007f\ud83d\ude00"], "kwargs": {"a": "\u00e9\"", "b": [1, 2.5, null, true]}, "class_args": [], "class_kwargs": {}}]"#
        );
        assert_eq!(result_json("é\n\u{7f}".as_bytes()), br#"{"value": "\u00e9\n\u007f"}"#.to_vec());
        assert_eq!(result_json(b"\xff"), br#"{"value": "\ufffd"}"#.to_vec());
    }
}
