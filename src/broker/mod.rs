//! Dispatcher shards (work in progress).
