//! The broker core: dispatcher shards (queues, workers, selection,
//! in-flight, timers). Shards talk to the rest only through their
//! contracts, one a file: messages in ([`inbox::ShardMsg`]), the text
//! front end's commands and answers ([`text_port`]), frames for ZeroMQ
//! peers ([`egress`]), and an [`outbox::Outbox`] out; src/router wires
//! them to channels and threads.

pub mod admin;
pub mod counts;
pub mod dead;
pub mod egress;
pub mod inbox;
pub mod outbox;
pub mod retry;
pub mod selection;
pub mod shard;
pub mod snapshot;
pub mod text_port;
pub mod timers;
pub mod types;
