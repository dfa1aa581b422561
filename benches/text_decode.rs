//! Text-protocol line decoder (`emq::protocol::text::LineDecoder`): the
//! producer stream (64 B `SCHED <data>@<queue>` lines) and the consumer
//! stream (`ASK <queue>` / `ACK` pairs), fed in 4 KiB reads and in one
//! piece; the line limit is the default `TEXT_MAX_LINE_BYTES`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use emq::limits::TEXT_MAX_LINE_BYTES;
use emq::protocol::text::LineDecoder;

/// `n` SCHED lines whose data is `size` bytes, to queue `bench-0`.
fn sched_stream(n: usize, size: usize) -> Vec<u8> {
    let mut s = Vec::new();
    for i in 0..n {
        let mut data = format!("[\"bench\",0,{i},123456789,\"").into_bytes();
        data.resize(size.saturating_sub(2), b'x');
        s.extend_from_slice(b"SCHED ");
        s.extend_from_slice(&data);
        s.extend_from_slice(b"\"]@bench-0\n");
    }
    s
}

/// Decodes `input` in reads of `chunk` bytes; the number of commands.
fn decode(input: &[u8], chunk: usize) -> usize {
    let mut d = LineDecoder::new(TEXT_MAX_LINE_BYTES);
    let mut n = 0;
    for piece in input.chunks(chunk) {
        d.feed(piece);
        n += d.by_ref().filter(Result::is_ok).count();
    }
    n
}

fn lines(c: &mut Criterion) {
    const LINES: usize = 1000;
    let mut g = c.benchmark_group("text_decode");
    g.throughput(Throughput::Elements(LINES as u64));
    for size in [64, 1024] {
        let sched = sched_stream(LINES, size);
        assert_eq!(decode(&sched, 4096), LINES);
        g.bench_function(format!("{LINES} SCHED {size} B, 4 KiB reads"), |b| b.iter(|| decode(&sched, 4096)));
        g.bench_function(format!("{LINES} SCHED {size} B, one read"), |b| b.iter(|| decode(&sched, sched.len())));
    }
    let consumer: Vec<u8> = b"ASK bench-0\nACK\n".repeat(LINES / 2);
    assert_eq!(decode(&consumer, 4096), LINES);
    g.bench_function(format!("{LINES} ASK/ACK lines, 4 KiB reads"), |b| b.iter(|| decode(&consumer, 4096)));
    g.finish();
}

criterion_group!(benches, lines);
criterion_main!(benches);
