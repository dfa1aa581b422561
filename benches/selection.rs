//! Weighted worker selection (`Candidates::select`, EventMQ rule, docs/emqp.md "Selection")
//! with 10, 100 and 1,000 workers: every worker free (the common case) and
//! only the last worker free (the longest walk).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use emq::broker::selection::Candidates;
use emq::broker::types::WorkerShared;
use emq::ids::{PeerId, QueueName, WorkerKey};

fn candidates(n: usize, weights: usize) -> (Candidates, Vec<Arc<WorkerShared>>) {
    let mut c = Candidates::default();
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let w = Arc::new(WorkerShared::new(
                WorkerKey(i as u64),
                PeerId::from(format!("worker-{i}").into_bytes()),
                0,
                vec![(10, QueueName::named("q"))],
            ));
            c.add((i % weights) as i64, w.clone());
            w
        })
        .collect();
    (c, workers)
}

fn selection(c: &mut Criterion) {
    let mut g = c.benchmark_group("select");
    for n in [10, 100, 1000] {
        let (mut all_free, workers) = candidates(n, 3);
        workers.iter().for_each(|w| w.add_slot());
        g.bench_with_input(BenchmarkId::new("all free, 3 weights", n), &n, |b, _| {
            b.iter(|| {
                let w = all_free.select();
                if let Some(w) = &w {
                    w.add_slot();
                }
                w
            })
        });
        let (mut one_free, _) = candidates(n, 1);
        // The slot goes back to whichever worker was chosen, and the
        // rotation moves it to the back, so the walk stays the whole list.
        let last = one_free.iter().last().map(|(_, w)| w.clone());
        last.iter().for_each(|w| w.add_slot());
        g.bench_with_input(BenchmarkId::new("one free", n), &n, |b, _| {
            b.iter(|| {
                let w = one_free.select();
                if let Some(w) = &w {
                    w.add_slot();
                }
                w
            })
        });
    }
    g.finish();
}

criterion_group!(benches, selection);
criterion_main!(benches);
