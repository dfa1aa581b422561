use proptest::prelude::*;

use super::*;
use crate::protocol::text::ErrorCode;

fn all(d: &mut LineDecoder) -> Vec<Result<TextCommand, TextError>> {
    d.by_ref().collect()
}

fn decode(max: usize, input: &[u8]) -> Vec<Result<TextCommand, TextError>> {
    let mut d = LineDecoder::new(max);
    d.feed(input);
    all(&mut d)
}

/// The model: split complete lines on LF, drop one CR before it, check the
/// length, parse. An unfinished last line yields nothing unless it is
/// already known to be too long.
fn model(max: usize, input: &[u8]) -> Vec<Result<TextCommand, TextError>> {
    let mut out = Vec::new();
    let mut parts: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let last = parts.pop().unwrap_or(&[]);
    for line in parts {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > max {
            out.push(Err(TextError::TooBig { max_line_bytes: max }));
        } else if let Some(r) = parse_command(line) {
            out.push(r);
        }
    }
    let known_too_long = last.len() > max + 1 || (last.len() == max + 1 && last.last() != Some(&b'\r'));
    if known_too_long {
        out.push(Err(TextError::TooBig { max_line_bytes: max }));
    }
    out
}

fn sched(data: &[u8], queue: &str) -> Result<TextCommand, TextError> {
    Ok(TextCommand::Sched { data: data.to_vec(), queue: queue.to_string() })
}

#[test]
fn lf_and_crlf() {
    let got = decode(100, b"SCHED a\nSCHED b\r\nSCHED c\r\r\nACK\r\n");
    assert_eq!(
        got,
        vec![sched(b"a", "default"), sched(b"b", "default"), sched(b"c\r", "default"), Ok(TextCommand::Ack)]
    );
}

#[test]
fn blank_lines_are_ignored() {
    assert_eq!(decode(100, b"\n\r\n  \t \nEND\n"), vec![Ok(TextCommand::End)]);
}

#[test]
fn example_session_client_lines() {
    let input = b"SCHED { email: \"test@test.de\", message: \"test message\" }@EMAILSERVICE\nASK EMAILSERVICE\nACK\n\
                  ASK EMAILSERVICE\nACK\nEND\n";
    let got = decode(1 << 20, input);
    let ask = Ok(TextCommand::Ask { queue: "EMAILSERVICE".into() });
    let want = vec![
        sched(b"{ email: \"test@test.de\", message: \"test message\" }", "EMAILSERVICE"),
        ask.clone(),
        Ok(TextCommand::Ack),
        ask,
        Ok(TextCommand::Ack),
        Ok(TextCommand::End),
    ];
    assert_eq!(got, want);
}

#[test]
fn line_length_limit_counts_neither_lf_nor_cr() {
    let max = 16;
    let exact = [b"SCHED ".to_vec(), vec![b'x'; max - 6]].concat();
    for end in [&b"\n"[..], b"\r\n"] {
        let got = decode(max, &[exact.as_slice(), end].concat());
        assert_eq!(got, vec![sched(&exact[6..], "default")]);
    }
    let over = [exact.as_slice(), b"y\nACK\n"].concat();
    let got = decode(max, &over);
    assert_eq!(got, vec![Err(TextError::TooBig { max_line_bytes: max }), Ok(TextCommand::Ack)]);
}

#[test]
fn too_big_is_reported_before_the_lf_and_the_rest_discarded() {
    let max = 8;
    let mut d = LineDecoder::new(max);
    d.feed(b"SCHED ab");
    assert_eq!(d.next(), None);
    d.feed(b"\r");
    assert_eq!(d.next(), None, "max + a CR may still be a valid line");
    assert_eq!(d.buffered_bytes(), max + 1);
    d.feed(b"d");
    assert_eq!(d.next().map(|r| r.map_err(|e| e.code())), Some(Err(ErrorCode::TooBig)));
    assert_eq!(d.buffered_bytes(), 0);
    assert!(d.has_partial_line());
    d.feed(&[b'z'; 1000]);
    d.feed(b"zz\nDE");
    assert_eq!(d.next(), None);
    d.feed(b"L\n");
    assert_eq!(all(&mut d), vec![Ok(TextCommand::Del)]);
    assert!(!d.has_partial_line());
}

#[test]
fn long_line_in_small_chunks_stays_bounded() {
    let max = 1024;
    let mut d = LineDecoder::new(max);
    let chunk = [b'a'; 7];
    for _ in 0..10_000 {
        d.feed(&chunk);
        assert!(d.buffered_bytes() <= max + 1);
    }
    d.feed(b"\nASK\n");
    let got: Vec<_> = all(&mut d);
    assert_eq!(
        got,
        vec![Err(TextError::TooBig { max_line_bytes: max }), Ok(TextCommand::Ask { queue: "default".into() })]
    );
}

#[test]
fn non_utf8_data_kept_byte_for_byte() {
    let got = decode(100, b"SCHED \x00\xff\xc3\x28 \t@q:1\n");
    assert_eq!(got, vec![sched(b"\x00\xff\xc3\x28 \t", "q:1")]);
}

/// Lines a client might send, good and bad, to build inputs from.
fn line_strategy() -> impl Strategy<Value = Vec<u8>> {
    let fixed = prop::sample::select(vec![
        &b"SCHED x"[..],
        b"sched {\"a\":\"b@c.d\"}@q",
        b"ASK",
        b"ask q",
        b"ACK",
        b"DCL",
        b"DEL",
        b"END",
        b"ACK x",
        b"ASK bad/q",
        b"HELLO",
        b"",
        b"  ",
        b"SCHED",
        b"SCHED a@",
        b"GET / HTTP/1.1",
    ]);
    prop_oneof![
        fixed.prop_map(|l| l.to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
        prop::collection::vec(prop::sample::select(b"ab@ q\r:".to_vec()), 0..40),
    ]
}

fn input_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((line_strategy(), prop::bool::ANY), 0..20).prop_map(|lines| {
        let mut out = Vec::new();
        for (line, crlf) in lines {
            out.extend_from_slice(&line);
            out.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        out
    })
}

proptest! {
    #[test]
    fn any_split_gives_the_same_commands(input in input_strategy(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let max = 24;
        let whole = decode(max, &input);
        prop_assert_eq!(&whole, &model(max, &input));
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut d = LineDecoder::new(max);
        let mut from = 0;
        for c in cuts.into_iter().chain([input.len()]) {
            d.feed(&input[from..c]);
            prop_assert!(d.buffered_bytes() <= max + 1);
            from = c;
        }
        prop_assert_eq!(&all(&mut d), &whole);
        let mut d = LineDecoder::new(max);
        for b in &input {
            d.feed(std::slice::from_ref(b));
        }
        prop_assert_eq!(&all(&mut d), &whole);
    }

    #[test]
    fn random_bytes_never_panic(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..16)) {
        let mut d = LineDecoder::new(16);
        let mut joined = Vec::new();
        for c in &chunks {
            d.feed(c);
            joined.extend_from_slice(c);
            prop_assert!(d.buffered_bytes() <= 17);
        }
        prop_assert_eq!(all(&mut d), model(16, &joined));
    }
}

/// Throughput figure for the report (`cargo test --release -- --ignored
/// decoder_throughput --nocapture`); asserts only the decoded count.
#[test]
#[ignore]
fn decoder_throughput() {
    let mut input = Vec::new();
    for i in 0..1_000_000 {
        input
            .extend_from_slice(format!("SCHED {{\"to\":\"user{i}@example.com\",\"n\":{i}}}@EMAILSERVICE\n").as_bytes());
        input.extend_from_slice(b"ASK EMAILSERVICE\nACK\n");
    }
    let start = std::time::Instant::now();
    let mut d = LineDecoder::new(1 << 20);
    let mut count = 0;
    for chunk in input.chunks(64 * 1024) {
        d.feed(chunk);
        count += d.by_ref().filter(Result::is_ok).count();
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(count, 3_000_000);
    println!(
        "decoded {count} commands, {} MB in {secs:.3} s: {:.0} MB/s, {:.1} M commands/s",
        input.len() / 1_000_000,
        input.len() as f64 / 1e6 / secs,
        count as f64 / 1e6 / secs
    );
}
