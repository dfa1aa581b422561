//! The text protocol: the line decoder gives the same commands however its
//! input is cut into reads, each line's result is what `parse_command`
//! says about it, and a parsed command encodes to a line that parses back
//! to it. Server lines parse without panicking.
//!
//! Input: byte 0 picks the line limit, byte 1 seeds the read sizes.
#![no_main]

use emq::protocol::text::{encode_command, parse_command, parse_server_line, LineDecoder};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| common::timed(|| {
    let [limit, cut, rest @ ..] = data else { return };
    let max = if *limit == 0 { 1 << 20 } else { usize::from(*limit) };
    let mut whole = LineDecoder::new(max);
    whole.feed(rest);
    let all: Vec<_> = whole.by_ref().collect();
    // The same bytes in reads of 1 to 16 bytes, taking results between.
    let mut pieces = LineDecoder::new(max);
    let mut got = Vec::new();
    let (mut at, mut seed) = (0, *cut);
    while at < rest.len() {
        seed = seed.wrapping_mul(31).wrapping_add(7);
        let n = (usize::from(seed) % 16 + 1).min(rest.len() - at);
        pieces.feed(&rest[at..at + n]);
        at += n;
        got.extend(pieces.by_ref());
        assert!(pieces.buffered_bytes() <= max + 1 + 16, "a partial line stays within the limit");
    }
    assert_eq!(all, got, "results do not depend on how reads cut the input");
    for line in rest.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let _ = parse_server_line(line);
        if line.len() > max {
            continue;
        }
        if let Some(Ok(cmd)) = parse_command(line) {
            let mut out = Vec::new();
            if encode_command(&mut out, &cmd).is_ok() {
                let again = out.strip_suffix(b"\n").unwrap_or(&out);
                assert_eq!(parse_command(again), Some(Ok(cmd)), "encode then parse");
            }
        }
    }
}));
