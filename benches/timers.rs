//! The shard's timer heap (`Timers`): arm + pop one due event with 1,000 and
//! 100,000 timers armed (one heartbeat timer per worker), and
//! `next_deadline`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use emq::broker::timers::Timers;

fn timers(c: &mut Criterion) {
    let mut g = c.benchmark_group("timers");
    for n in [1_000u64, 100_000] {
        let t0 = Instant::now();
        let mut t = Timers::default();
        for i in 0..n {
            t.arm(t0 + Duration::from_micros(i), i);
        }
        let mut next = n;
        g.bench_with_input(BenchmarkId::new("re-arm earliest", n), &n, |b, _| {
            b.iter(|| {
                let far = t0 + Duration::from_secs(3600);
                let e = t.pop_due(far);
                next += 1;
                t.arm(t0 + Duration::from_micros(next), e.unwrap_or(next));
                e
            })
        });
        g.bench_with_input(BenchmarkId::new("next_deadline", n), &n, |b, _| b.iter(|| t.next_deadline()));
    }
    g.finish();
}

criterion_group!(benches, timers);
criterion_main!(benches);
