//! The router's per-job latency recording (`ShardLatency::record`, three
//! calls per eMQP job: queue wait at dispatch, service and end to end at the
//! REPLY), to show it is small next to a job's cost (~100 µs at 10k jobs/s).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use emq::ids::QueueName;
use emq::metrics::latency::{Kind, ShardLatency};

fn record(c: &mut Criterion) {
    let mut lat = ShardLatency::default();
    let queues: Vec<QueueName> = (0..8).map(|i| QueueName::named(&format!("queue-{i}"))).collect();
    let mut i = 0usize;
    c.bench_function("latency record (3 figures, 8 queues)", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let q = &queues[i % queues.len()];
            let d = Duration::from_micros((i % 50_000) as u64);
            lat.record(q.as_bytes(), Kind::QueueWait, d);
            lat.record(q.as_bytes(), Kind::Service, d);
            lat.record(q.as_bytes(), Kind::EndToEnd, d);
        })
    });
}

criterion_group!(benches, record);
criterion_main!(benches);
