//! One job through a shard, no sockets: REQUEST (accepted, queued,
//! dispatched to the worker with a free slot, recorded in flight), the
//! worker's job-result REPLY (completed) and its READY (the slot back):
//! the shard's whole cost per job, the I/O thread and ZeroMQ excluded
//! (`loadtest/callgrind.sh` measures the router as a whole).

use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use emq::broker::inbox::ShardMsg;
use emq::broker::outbox::VecOutbox;
use emq::broker::shard::{Shard, ShardContext};
use emq::config::RouterConfig;
use emq::ids::{MsgId, PeerId, QueueName};
use emq::job::JobFrames;

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("shard");
    g.throughput(Throughput::Elements(1));
    let now = Instant::now();
    let config = RouterConfig { shards: 1, ..RouterConfig::default() };
    let mut shard = Shard::new(0, ShardContext::new(Arc::new(config), 1, now), now);
    let mut out = VecOutbox::default();
    let worker = PeerId::from(&b"worker-0000-0000-0000-0000-000000000000"[..]);
    let client = PeerId::from(&b"client-0000-0000-0000-0000-000000000000"[..]);
    let queues = vec![(10, QueueName::named("q"))];
    shard.handle(ShardMsg::WorkerInform { id: worker.clone(), msgid: MsgId::default(), queues }, now, &mut out);
    shard.handle(ShardMsg::WorkerReady { id: worker.clone() }, now, &mut out);
    let msgid = b"0f6a0b4e-8f39-4c8a-9a53-5d7e2a9c1b11";
    let none: &[&[u8]] = &[];
    let frames = JobFrames::new(msgid, b"q", b"", &[b'x'; 64], none).expect("small frames");
    g.bench_function("REQUEST, dispatch, REPLY, READY (64 B)", |b| {
        b.iter(|| {
            let request = ShardMsg::Request { client: client.clone(), frames: frames.clone(), fallback_done: false };
            shard.handle(request, now, &mut out);
            let reply =
                ShardMsg::WorkerReply { id: worker.clone(), request_msgid: MsgId::from(&msgid[..]), failed: false };
            shard.handle(reply, now, &mut out);
            shard.handle(ShardMsg::WorkerReady { id: worker.clone() }, now, &mut out);
            out.emqp.clear();
        })
    });
    g.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
