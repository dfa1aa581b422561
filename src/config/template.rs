//! A program's commented default config file, used as a template: printed
//! with the resolved values by `--print-config`, and checked against the
//! program's settings table by a unit test.
//!
//! A template line that sets a key reads `key = value  # comment`; a setting
//! with no default is written commented out, `# key = example  # comment`.
//! Each such line names the setting's environment variable in its comment.

use super::table::Settings;
use super::ConfigError;

/// `template` with the values `settings` were given (by flag, variable or
/// file) in place of the defaults, comments kept; unset settings keep their
/// template line. When anything was given, a first line lists what.
///
/// # Errors
/// [`ConfigError::Invalid`] for a value TOML cannot hold.
pub fn resolved<S: Settings>(settings: &S, template: &str) -> Result<String, ConfigError> {
    let mut values = settings.set_values()?;
    if values.is_empty() {
        return Ok(template.to_string());
    }
    let given: Vec<&str> = values.iter().map(|(key, _)| *key).collect();
    let mut out = format!("# Resolved: {} given by flag, EMQ_* variable or --config.\n", given.join(", "));
    for line in template.lines() {
        let set = key_line(line).and_then(|(_, key, rest)| {
            let at = values.iter().position(|(k, _)| *k == key)?;
            Some((values.remove(at), rest))
        });
        match set {
            Some(((key, value), rest)) => out.push_str(&set_line(line, key, &value, rest)),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    for (key, value) in values {
        out.push_str(&format!("{key} = {value}\n"));
    }
    Ok(out)
}

/// `line` rewritten as `key = value`, its comment kept at the same column.
fn set_line(line: &str, key: &str, value: &toml::Value, rest: &str) -> String {
    let comment = split_comment(rest).1;
    let head = format!("{key} = {value}");
    if comment.is_empty() {
        return head;
    }
    let column = line.chars().count() - comment.chars().count();
    let pad = column.saturating_sub(head.chars().count()).max(2);
    format!("{head}{}{comment}", " ".repeat(pad))
}

/// A line that sets a key, or a commented-out one: `(commented, key,
/// text after the '=')`.
fn key_line(line: &str) -> Option<(bool, &str, &str)> {
    let (commented, body) = match line.strip_prefix('#') {
        Some(body) => (true, body.trim_start()),
        None => (false, line),
    };
    let end = body.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(body.len());
    let (key, rest) = body.split_at(end);
    if !key.starts_with(|c: char| c.is_ascii_lowercase()) {
        return None;
    }
    let rest = rest.trim_start().strip_prefix('=')?;
    (!rest.starts_with('=')).then_some((commented, key, rest))
}

/// Splits the text after `key =` into the value and the trailing comment
/// (from its `#`): the comment starts at the first `#` before which the
/// text is a whole TOML value, so a `#` inside a string stays in the value.
fn split_comment(rest: &str) -> (&str, &str) {
    for (at, _) in rest.match_indices('#') {
        let value = rest[..at].trim();
        if toml::from_str::<toml::Table>(&format!("v = {value}")).is_ok() {
            return (value, &rest[at..]);
        }
    }
    (rest.trim(), "")
}

/// What is wrong with `template` as the commented defaults of `S`: a setting
/// missing, set to something other than its default, or without its
/// variable in the comment; a key the table lacks; a deprecated name.
#[cfg(test)]
pub(crate) fn problems<S: Settings>(template: &str) -> Vec<String> {
    let parsed: S = match toml::from_str(template) {
        Ok(parsed) => parsed,
        Err(e) => return vec![format!("does not parse: {e}")],
    };
    let mut problems: Vec<String> = Vec::new();
    let lines: Vec<(bool, &str, &str)> = template.lines().filter_map(key_line).collect();
    let defaulted: Vec<&str> = match S::defaults().set_values() {
        Ok(values) => values.into_iter().map(|(key, _)| key).collect(),
        Err(e) => return vec![e.to_string()],
    };
    for super::table::Names { key, env, was } in S::NAMES {
        let has_default = defaulted.contains(key);
        match lines.iter().find(|(_, k, _)| k == key) {
            None => problems.push(format!("{key}: missing")),
            Some((commented, _, _)) if *commented == has_default => {
                problems.push(format!("{key}: write a setting commented out if and only if it has no default"))
            }
            Some((_, _, rest)) if !split_comment(rest).1.contains(env) => {
                problems.push(format!("{key}: comment lacks {env}"))
            }
            Some((_, _, rest)) if !rest.contains("  #") => {
                problems.push(format!("{key}: put two spaces or more before the comment"))
            }
            Some(_) => {}
        }
        let old_lines = was.iter().filter(|(old, _)| lines.iter().any(|(_, k, _)| k == old));
        problems.extend(old_lines.map(|(old, _)| format!("{old}: deprecated name of {key}")));
    }
    let known = |key: &str| S::NAMES.iter().any(|n| n.key == key || n.was.iter().any(|(old, _)| *old == key));
    problems.extend(lines.iter().filter(|(_, key, _)| !known(key)).map(|(_, key, _)| format!("{key}: not a setting")));
    problems.extend(parsed.differing_keys(&S::default()).into_iter().map(|key| format!("{key}: not the default")));
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lines_and_comments() {
        assert_eq!(key_line(r#"a_b = "x"  # c"#), Some((false, "a_b", r#" "x"  # c"#)));
        assert_eq!(key_line("# dir = 1"), Some((true, "dir", " 1")));
        assert_eq!(key_line("# Shards: threads. 0 = one per core"), None);
        assert_eq!(key_line("# a == b"), None);
        assert_eq!(split_comment(r#" "a # b"   # why"#), (r#""a # b""#, "# why"));
        assert_eq!(split_comment(" 3"), ("3", ""));
    }

    #[test]
    fn set_lines_keep_the_comment_column() {
        let line = r#"text_addr = "127.0.0.1:47294"             # (EMQ_TEXT_ADDR)"#;
        let (_, key, rest) = key_line(line).unwrap();
        let out = set_line(line, key, &toml::Value::String("off".into()), rest);
        assert_eq!(out, r#"text_addr = "off"                         # (EMQ_TEXT_ADDR)"#);
        let out = set_line("# d = 1  # c", "d", &toml::Value::Integer(123456), " 1  # c");
        assert_eq!(out, "d = 123456  # c");
    }
}
