//! eMQP: decode and decode_ref on every socket agree, a decoded message
//! encodes to frames that decode to it again, and what the router's I/O
//! thread builds from a decoded message (job frames, INFORM queue lists,
//! SCHEDULE checks) never panics.
//!
//! Input: the first byte picks the socket; the rest are frames separated
//! by `\n`.
#![no_main]

use emq::job::JobFrames;
use emq::broker::inbox::Schedule;
use emq::ids::PeerId;
use emq::protocol::emqp::{decode, decode_ref, Command, PeerType, Socket};
use emq::protocol::queues::parse_queue_list;
use emq::scheduler::schedule::check_schedule;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

const SOCKETS: [Socket; 7] = [
    Socket::Frontend,
    Socket::Backend,
    Socket::Admin,
    Socket::WorkerSide,
    Socket::SchedulerSide,
    Socket::ClientSide,
    Socket::PubIn,
];

fuzz_target!(|data: &[u8]| common::timed(|| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let frames: Vec<&[u8]> = rest.split(|b| *b == b'\n').collect();
    let socket = SOCKETS[usize::from(pick) % SOCKETS.len()];
    // Every socket sees the same frames; the picked one is also dispatched.
    for s in SOCKETS {
        let owned = decode(&frames, s);
        let borrowed = decode_ref(&frames, s);
        assert_eq!(owned, borrowed.as_ref().map(|m| m.to_owned_frames()).map_err(Clone::clone), "decode vs decode_ref");
        if let Ok(m) = &owned {
            let _ = m.command.word();
            let again = decode(&m.encode(), s);
            assert_eq!(again.as_ref(), Ok(m), "encode then decode on {s:?}");
        }
        let _ = emq::protocol::emqp::ShowFrames(&frames).to_string();
    }
    let Ok(msg) = decode_ref(&frames, socket) else { return };
    match (socket, &msg.command) {
        (Socket::Frontend, Command::Request { queue, headers, body, extra }) => {
            if let Ok(job) = JobFrames::new(msg.msgid, queue, headers, body, extra) {
                assert_eq!(job.msgid(), msg.msgid);
                assert_eq!(job.body(), *body);
            }
        }
        (Socket::Backend, Command::Inform { peer: PeerType::Worker, queues, .. }) => {
            if let Ok(list) = parse_queue_list(queues) {
                assert!(!list.is_empty());
            }
        }
        (Socket::Frontend, Command::Schedule(_) | Command::Unschedule(_)) => {
            let owned: Vec<Vec<u8>> = frames.iter().map(|f| f.to_vec()).collect();
            let sched = Schedule::from_frames(PeerId::from(&b"client"[..]), owned).expect("a decoded SCHEDULE");
            let _ = check_schedule(&sched.body, sched.unschedule);
        }
        _ => {}
    }
}));
