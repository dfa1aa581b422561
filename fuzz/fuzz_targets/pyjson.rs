//! The scheduler's Python JSON: what parses dumps to ASCII that parses to
//! the same value (compared through `dumps(sort_keys)`, as NaN != NaN).
#![no_main]

use emq::protocol::pyjson::parse;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| common::timed(|| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(v) = parse(text) else { return };
    let out = v.dumps(false);
    assert!(out.is_ascii());
    let again = parse(&out).expect("dumps output parses");
    assert_eq!(again.dumps(true), v.dumps(true));
}));
