//! The `json.loads` half of [`super`]: a strict-mode parser that keeps
//! Python's types (int vs float, lone surrogates, `NaN`/`Infinity`).

use std::collections::HashMap;

use super::{PyJson, PyStr};

/// Why [`parse`] rejected the input: the byte offset and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON at byte {offset}: {what}")]
pub struct JsonError {
    /// Byte offset into the input.
    pub offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

/// Parses `text` like CPython's `json.loads` (strict mode).
///
/// # Errors
/// [`JsonError`] with the byte offset of the first problem: bad syntax,
/// raw control characters in strings, trailing data, nesting deeper than
/// [`crate::limits::PYJSON_MAX_DEPTH`].
///
/// # Example
/// ```
/// use emq::protocol::pyjson::{parse, PyJson};
/// assert_eq!(parse("[1, 1.0]").unwrap().dumps(false), "[1, 1.0]");
/// assert!(matches!(parse("1e2").unwrap(), PyJson::Float(_)));
/// ```
pub fn parse(text: &str) -> Result<PyJson, JsonError> {
    let mut p = Parser { s: text.as_bytes(), text, pos: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.pos != p.s.len() {
        return Err(p.err("extra data after the value"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError { offset: self.pos, what }
    }

    fn ws(&mut self) {
        while matches!(self.s.get(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            return true;
        }
        false
    }

    fn value(&mut self, depth: usize) -> Result<PyJson, JsonError> {
        if depth > crate::limits::PYJSON_MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        match self.s.get(self.pos) {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(PyJson::Str(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat("null") => Ok(PyJson::Null),
            _ if self.eat("true") => Ok(PyJson::Bool(true)),
            _ if self.eat("false") => Ok(PyJson::Bool(false)),
            _ if self.eat("NaN") => Ok(PyJson::Float(f64::NAN)),
            _ if self.eat("Infinity") => Ok(PyJson::Float(f64::INFINITY)),
            _ => Err(self.err("expecting value")),
        }
    }

    fn array(&mut self, depth: usize) -> Result<PyJson, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(PyJson::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            if self.eat("]") {
                return Ok(PyJson::Array(items));
            }
            if !self.eat(",") {
                return Err(self.err("expecting ',' delimiter"));
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<PyJson, JsonError> {
        self.pos += 1;
        let mut members: Vec<(PyStr, PyJson)> = Vec::new();
        // Each key's position in `members`: duplicate keys are found in
        // constant time, so an object costs time linear in its text.
        let mut index: HashMap<PyStr, usize> = HashMap::new();
        self.ws();
        if self.eat("}") {
            return Ok(PyJson::Object(members));
        }
        loop {
            self.ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return Err(self.err("expecting property name enclosed in double quotes"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(":") {
                return Err(self.err("expecting ':' delimiter"));
            }
            self.ws();
            let value = self.value(depth + 1)?;
            match index.get(&key) {
                Some(&at) => members[at].1 = value,
                None => {
                    index.insert(key.clone(), members.len());
                    members.push((key, value));
                }
            }
            self.ws();
            if self.eat("}") {
                return Ok(PyJson::Object(members));
            }
            if !self.eat(",") {
                return Err(self.err("expecting ',' delimiter"));
            }
        }
    }

    /// Python's NUMBER_RE: `(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?`.
    fn number(&mut self) -> Result<PyJson, JsonError> {
        let start = self.pos;
        if self.eat("-") && self.eat("Infinity") {
            return Ok(PyJson::Float(f64::NEG_INFINITY));
        }
        let int_digits = self.digits();
        if int_digits == 0 || (int_digits > 1 && self.s[self.pos - int_digits] == b'0') {
            self.pos = start + usize::from(self.s[start] == b'-') + usize::from(int_digits > 0);
            if int_digits == 0 {
                return Err(self.err("expecting value"));
            }
        }
        let int_end = self.pos;
        let mut is_float = false;
        if self.s.get(self.pos) == Some(&b'.') && self.s.get(self.pos + 1).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
            self.digits();
            is_float = true;
        }
        if matches!(self.s.get(self.pos), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            if matches!(self.s.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                self.pos = save;
            } else {
                is_float = true;
            }
        }
        let text = &self.text[start..self.pos];
        if is_float {
            return text.parse::<f64>().map(PyJson::Float).map_err(|_| self.err("bad number"));
        }
        let int = &self.text[start..int_end];
        Ok(PyJson::Int(if int == "-0" { "0".to_string() } else { int.to_string() }))
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn string(&mut self) -> Result<PyStr, JsonError> {
        self.pos += 1;
        let mut out = PyStr::new();
        loop {
            let rest = &self.text[self.pos..];
            let Some(c) = rest.chars().next() else {
                return Err(self.err("unterminated string"));
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\\' => self.escape(&mut out)?,
                c if (c as u32) < 0x20 => return Err(self.err("invalid control character in string")),
                c => {
                    out.push(c as u32);
                    self.pos += c.len_utf8();
                }
            }
        }
    }

    fn escape(&mut self, out: &mut PyStr) -> Result<(), JsonError> {
        let Some(&e) = self.s.get(self.pos + 1) else {
            return Err(self.err("unterminated string"));
        };
        self.pos += 2;
        let simple = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                out.push(self.maybe_pair(unit)?);
                return Ok(());
            }
            _ => return Err(self.err("invalid \\escape")),
        };
        out.push(simple as u32);
        Ok(())
    }

    /// Combines a high surrogate with a following `\uDC00..\uDFFF` escape,
    /// as CPython's scanner does; anything else stays a lone surrogate.
    fn maybe_pair(&mut self, unit: u32) -> Result<u32, JsonError> {
        if (0xd800..=0xdbff).contains(&unit) && self.s[self.pos..].starts_with(b"\\u") {
            let save = self.pos;
            self.pos += 2;
            let low = self.hex4()?;
            if (0xdc00..=0xdfff).contains(&low) {
                return Ok(0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00));
            }
            self.pos = save;
        }
        Ok(unit)
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let hex = self.s.get(self.pos..self.pos + 4).ok_or(self.err("invalid \\uXXXX escape"))?;
        if !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err(self.err("invalid \\uXXXX escape"));
        }
        let text = std::str::from_utf8(hex).map_err(|_| self.err("invalid \\uXXXX escape"))?;
        let unit = u32::from_str_radix(text, 16).map_err(|_| self.err("invalid \\uXXXX escape"))?;
        self.pos += 4;
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(s: &str) -> String {
        parse(s).unwrap().dumps(false)
    }

    #[test]
    fn numbers_keep_python_types() {
        assert_eq!(
            round("[1, 1.0, -0, -0.0, 1E2, 1e400, -1e400, 12345678901234567890123]"),
            "[1, 1.0, 0, -0.0, 100.0, Infinity, -Infinity, 12345678901234567890123]"
        );
        assert_eq!(
            round("[NaN, -Infinity, 1.5e-7, 123456789012345678.0, 0.0001]"),
            "[NaN, -Infinity, 1.5e-07, 1.2345678901234568e+17, 0.0001]"
        );
    }

    #[test]
    fn strings_escape_like_ensure_ascii() {
        assert_eq!(round(r#""é\u007f/\/\b\f\n\r\t\u0001""#), r#""\u00e9\u007f//\b\f\n\r\t\u0001""#);
        assert_eq!(round("\"😀\""), r#""\ud83d\ude00""#);
        assert_eq!(round(r#""\ud83d\ude00 \ud800x \udc00""#), r#""\ud83d\ude00 \ud800x \udc00""#);
    }

    #[test]
    fn rejects_what_python_rejects() {
        for bad in ["", "01", "[1,]", "{\"a\" 1}", "\"a\u{1}\"", "[1] x", "\"\\x\"", "-", "1.", "{1: 2}"] {
            assert!(parse(bad).is_err(), "{bad:?} should fail");
        }
        let deep = "[".repeat(crate::limits::PYJSON_MAX_DEPTH + 2);
        assert!(parse(&deep).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_output_reparses(text in "\\PC{0,40}", json in r#"[\[\]{}",:0-9eE.+\- a-z\\u]{0,40}"#) {
            for input in [&text, &json] {
                if let Ok(v) = parse(input) {
                    let out = v.dumps(false);
                    proptest::prop_assert!(out.is_ascii());
                    proptest::prop_assert_eq!(parse(&out).map(|w| w.dumps(true)), Ok(v.dumps(true)));
                }
            }
        }
    }

    /// 100,000 keys, every one given twice: each keeps its first position
    /// and takes its last value (issue 10: duplicate keys are found with a
    /// hash set, so this is linear; it took 31 s when it was quadratic).
    #[test]
    fn a_hundred_thousand_keys_keep_dict_semantics() {
        const N: usize = 100_000;
        let first = (0..N).map(|i| format!("\"k{i}\": {i}"));
        let again = (0..N).rev().map(|i| format!("\"k{i}\": \"v{i}\""));
        let text = format!("{{{}}}", first.chain(again).collect::<Vec<_>>().join(", "));
        let PyJson::Object(members) = parse(&text).expect("parses") else { panic!("not an object") };
        assert_eq!(members.len(), N);
        for (i, (key, value)) in members.iter().enumerate() {
            assert_eq!(*key, crate::protocol::pyjson::py_str(&format!("k{i}")));
            assert_eq!(*value, PyJson::Str(crate::protocol::pyjson::py_str(&format!("v{i}"))));
        }
        let distinct = format!("{{{}}}", (0..N).map(|i| format!("\"{i}\": [{i}]")).collect::<Vec<_>>().join(","));
        let v = parse(&distinct).expect("parses");
        assert_eq!(v.get("99999"), Some(&PyJson::Array(vec![PyJson::Int("99999".into())])));
        assert_eq!(v.dumps(false), distinct.replace(',', ", "), "json.dumps separators");
    }

    #[test]
    fn duplicate_keys_first_position_last_value() {
        assert_eq!(round(r#"{"b": 1, "a": 2, "b": 3}"#), r#"{"b": 3, "a": 2}"#);
        assert_eq!(
            parse(r#"{"b": 1, "a": {"d": 1, "c": 2}}"#).unwrap().dumps(true),
            r#"{"a": {"c": 2, "d": 1}, "b": 1}"#
        );
    }
}
