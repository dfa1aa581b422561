//! eMQP codec: encode and decode of the messages on the hot path
//! (REQUEST in both directions, READY, job-result REPLY), 64 B and 1 KiB
//! bodies; `decode_ref` is what the router's I/O thread runs (no copies),
//! `decode` what clients run (owned frames).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use emq::protocol::emqp::{decode, decode_ref, Command, Message, Socket};

fn request(body_len: usize) -> Message {
    let body = vec![b'x'; body_len];
    Message::new(Command::Request {
        queue: b"default".to_vec(),
        headers: b"reply-requested,timeout:30".to_vec(),
        body,
        extra: Vec::new(),
    })
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("emqp");
    g.throughput(Throughput::Elements(1));
    for len in [64, 1024] {
        let msg = request(len);
        let frames = msg.encode();
        g.bench_function(format!("encode REQUEST {len} B"), |b| b.iter(|| msg.encode()));
        g.bench_function(format!("decode REQUEST {len} B (frontend)"), |b| {
            b.iter(|| decode(&frames, Socket::Frontend))
        });
        g.bench_function(format!("decode_ref REQUEST {len} B (router frontend)"), |b| {
            b.iter(|| decode_ref(&frames, Socket::Frontend).map(|m| m.msgid.len()))
        });
        g.bench_function(format!("decode REQUEST {len} B (worker side)"), |b| {
            b.iter_batched(|| frames.clone(), |f| decode(&f, Socket::WorkerSide), BatchSize::SmallInput)
        });
    }
    let ready = Message::new(Command::Ready).encode();
    g.bench_function("decode READY", |b| b.iter(|| decode(&ready, Socket::Backend)));
    let reply = Message::new(Command::JobReply {
        result: b"{\"value\": null}".to_vec(),
        request_msgid: emq::protocol::emqp::new_msgid(),
        failed: false,
    })
    .encode();
    g.bench_function("decode job-result REPLY", |b| b.iter(|| decode(&reply, Socket::Backend)));
    g.bench_function("decode_ref job-result REPLY (router backend)", |b| {
        b.iter(|| decode_ref(&reply, Socket::Backend).map(|m| m.msgid.len()))
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
