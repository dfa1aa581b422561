//! The broker core: dispatcher shards (queues, workers, selection,
//! in-flight, timers). Shards talk to the rest only through messages in
//! ([`msg::ShardMsg`]) and an [`msg::Outbox`] out; src/router wires them to
//! channels and threads.

pub mod counts;
pub mod dead;
pub mod msg;
pub mod retry;
pub mod selection;
pub mod shard;
pub mod snapshot;
pub mod timers;
pub mod types;
