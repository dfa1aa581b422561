//! REQUEST headers (docs/emqp.md "Headers"): a comma-separated string such as
//! `reply-requested,timeout:30`. EventMQ matches them by substring;
//! emq matches whole tokens.

use std::time::Duration;

/// The header that makes a worker answer with a job-result REPLY.
pub const REPLY_REQUESTED: &[u8] = b"reply-requested";

/// Whether the CSV `headers` hold exactly the token `name`.
pub fn has(headers: &[u8], name: &[u8]) -> bool {
    tokens(headers).any(|t| t == name)
}

/// The value of the first `name:value` token, e.g. `value(b"timeout:30", b"timeout")`
/// is `Some(b"30")`.
pub fn value<'a>(headers: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    tokens(headers).find_map(|t| t.strip_prefix(name).and_then(|rest| rest.strip_prefix(b":")))
}

/// The value of the first `name:N` token as a whole number, when it is one
/// (ASCII digits, spaces around them ignored); a number too large for a
/// `u64` counts as `u64::MAX`, so that callers cap it rather than ignore it.
/// `None` when absent or not digits (`-1`, `1.5`, `x`, empty).
pub fn whole_number(headers: &[u8], name: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value(headers, name)?).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().unwrap_or(u64::MAX))
}

/// The headers with `reply-requested` first, added if absent. The broker
/// forwards these so every worker reports completion (docs/emqp.md "Job results").
///
/// ```
/// use emq::protocol::headers::with_reply_requested;
/// assert_eq!(with_reply_requested(b""), b"reply-requested");
/// assert_eq!(with_reply_requested(b"timeout:30"), b"reply-requested,timeout:30");
/// assert_eq!(with_reply_requested(b"reply-requested,guarantee"), b"reply-requested,guarantee");
/// ```
pub fn with_reply_requested(headers: &[u8]) -> Vec<u8> {
    if has(headers, REPLY_REQUESTED) {
        return headers.to_vec();
    }
    let mut out = REPLY_REQUESTED.to_vec();
    if !headers.is_empty() {
        out.push(b',');
        out.extend_from_slice(headers);
    }
    out
}

fn tokens(headers: &[u8]) -> impl Iterator<Item = &[u8]> {
    headers.split(|&b| b == b',').map(|t| t.trim_ascii()).filter(|t| !t.is_empty())
}

/// A job's `timeout:N` header (whole seconds; the header EventMQ 0.3.13's
/// workers read), as the router and `emq-worker` both take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderTimeout {
    /// No header, or a value that is not a whole number of seconds: the
    /// queue's `job_timeouts` entry or `job_timeout` applies.
    Absent,
    /// `timeout:0`: no limit at all, as for EventMQ's workers.
    NoLimit,
    /// `timeout:N`, N > 0, capped at [`crate::limits::JOB_TIMEOUT_MAX_SECS`].
    Limit(Duration),
}

/// The `timeout:N` header of `headers` (README "Deadlines").
pub fn header_timeout(headers: &[u8]) -> HeaderTimeout {
    match whole_number(headers, b"timeout") {
        None => HeaderTimeout::Absent,
        Some(0) => HeaderTimeout::NoLimit,
        Some(secs) => HeaderTimeout::Limit(Duration::from_secs(secs.min(crate::limits::JOB_TIMEOUT_MAX_SECS))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_tokens_only() {
        assert!(!has(b"no-reply-requested", REPLY_REQUESTED));
        assert!(has(b"guarantee, reply-requested", REPLY_REQUESTED));
        assert_eq!(value(b"reply-requested,timeout:30", b"timeout"), Some(&b"30"[..]));
        assert_eq!(value(b"run_count:3,nohaste", b"run_count"), Some(&b"3"[..]));
    }

    #[test]
    fn the_timeout_header_is_whole_seconds_and_0_is_no_limit() {
        let limit = |s| HeaderTimeout::Limit(Duration::from_secs(s));
        assert_eq!(header_timeout(b"reply-requested,timeout:30"), limit(30));
        assert_eq!(header_timeout(b"timeout: 5 ,guarantee"), limit(5));
        assert_eq!(header_timeout(b"reply-requested,timeout:0"), HeaderTimeout::NoLimit);
        for absent in [&b""[..], b"timeout:-1", b"timeout:+5", b"timeout:1.5", b"timeout:x", b"timeouts:3", b"timeout"]
        {
            assert_eq!(header_timeout(absent), HeaderTimeout::Absent, "{:?}", String::from_utf8_lossy(absent));
        }
        for huge in [&b"timeout:99999999999999999"[..], b"timeout:999999999999999999999999"] {
            assert_eq!(header_timeout(huge), limit(crate::limits::JOB_TIMEOUT_MAX_SECS));
        }
    }
}
