//! The broker core: dispatcher shards (queues, workers, selection,
//! in-flight, timers) and the router that wires them to the sockets. Shards
//! talk to the rest only through channels and an [`msg::Outbox`].

pub mod msg;
pub mod selection;
pub mod shard;
pub mod snapshot;
pub mod timers;
pub mod types;
