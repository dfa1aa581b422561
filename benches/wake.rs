//! The cost of waking the I/O thread out of `zmq::poll` to hand it one
//! outgoing message, three ways (a ZeroMQ socket lives on one
//! thread; which way wakes it fastest?):
//!
//! * `push_pull_frames`: the message's frames travel over an inproc
//!   PUSH → PULL pair that is one of the poll items (emq before issue 9);
//! * `channel_inproc_token`: the message goes into a crossbeam channel, an
//!   empty frame over inproc PUSH → PULL wakes the poll;
//! * `channel_eventfd`: the message goes into a crossbeam channel, an
//!   eventfd in the poll wakes it, written only when the poller is armed
//!   (emq's [`Wake`]).
//!
//! Each iteration is a round trip: the bench thread hands one 64-byte job
//! message over and waits until the poller thread (blocked in `zmq::poll`)
//! has taken it and answered over a crossbeam channel. The answer path is
//! the same in all three, so the differences are the wake-up and hand-over.

use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use emq::wake::Wake;

const ENDPOINT: &str = "inproc://bench-wake";

type Frames = Vec<Vec<u8>>;

fn frames() -> Frames {
    vec![b"B".to_vec(), b"worker-identity-0001".to_vec(), b"".to_vec(), b"eMQP/1.0".to_vec(), vec![7u8; 64]]
}

/// Runs `iters` round trips through `send`, the poller answering on `ack`.
fn round_trips(iters: u64, send: impl Fn(), ack: &Receiver<()>) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        send();
        let _ = ack.recv();
    }
    start.elapsed()
}

fn push_pull_frames(iters: u64) -> Duration {
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).unwrap();
    pull.bind(ENDPOINT).unwrap();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(ENDPOINT).unwrap();
    let (ack_tx, ack_rx) = bounded::<()>(1);
    let poller = thread::spawn(move || {
        for _ in 0..iters {
            let mut items = [pull.as_poll_item(zmq::POLLIN)];
            zmq::poll(&mut items, -1).unwrap();
            let m = pull.recv_multipart(zmq::DONTWAIT).unwrap();
            assert_eq!(m.len(), 5);
            ack_tx.send(()).unwrap();
        }
    });
    let d = round_trips(iters, || push.send_multipart(frames(), 0).unwrap(), &ack_rx);
    poller.join().unwrap();
    d
}

fn channel_inproc_token(iters: u64) -> Duration {
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).unwrap();
    pull.bind(ENDPOINT).unwrap();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(ENDPOINT).unwrap();
    let (tx, rx): (Sender<Frames>, Receiver<Frames>) = unbounded();
    let (ack_tx, ack_rx) = bounded::<()>(1);
    let poller = thread::spawn(move || {
        let mut got = 0;
        while got < iters {
            let mut items = [pull.as_poll_item(zmq::POLLIN)];
            zmq::poll(&mut items, -1).unwrap();
            while pull.recv_bytes(zmq::DONTWAIT).is_ok() {}
            while let Ok(m) = rx.try_recv() {
                assert_eq!(m.len(), 5);
                got += 1;
                ack_tx.send(()).unwrap();
            }
        }
    });
    let d = round_trips(
        iters,
        || {
            tx.send(frames()).unwrap();
            push.send(&b""[..], 0).unwrap();
        },
        &ack_rx,
    );
    poller.join().unwrap();
    d
}

fn channel_eventfd(iters: u64) -> Duration {
    let wake = std::sync::Arc::new(Wake::new().unwrap());
    let (tx, rx): (Sender<Frames>, Receiver<Frames>) = unbounded();
    let (ack_tx, ack_rx) = bounded::<()>(1);
    let poller_wake = wake.clone();
    let poller = thread::spawn(move || {
        let mut got = 0;
        while got < iters {
            while let Ok(m) = rx.try_recv() {
                assert_eq!(m.len(), 5);
                got += 1;
                ack_tx.send(()).unwrap();
            }
            if got == iters {
                break;
            }
            poller_wake.arm();
            let timeout = if rx.is_empty() { -1 } else { 0 };
            let mut items = [zmq::PollItem::from_fd(poller_wake.fd(), zmq::POLLIN)];
            zmq::poll(&mut items, timeout).unwrap();
            poller_wake.disarm();
        }
    });
    let d = round_trips(
        iters,
        || {
            tx.send(frames()).unwrap();
            wake.wake();
        },
        &ack_rx,
    );
    poller.join().unwrap();
    d
}

fn wake(c: &mut Criterion) {
    let mut g = c.benchmark_group("wake_io_thread");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("push_pull_frames", |b| b.iter_custom(push_pull_frames));
    g.bench_function("channel_inproc_token", |b| b.iter_custom(channel_inproc_token));
    g.bench_function("channel_eventfd", |b| b.iter_custom(channel_eventfd));
    g.finish();
}

criterion_group!(benches, wake);
criterion_main!(benches);
