//! The broker's [`TextBackend`]: every command goes to the shard that owns
//! its queue (or holds its offer), as a [`ShardMsg::Text`], and the
//! connection waits for the answer on a port of its own. Offers live on
//! that shard (text-protocol.md "The offer"), which also owns their
//! timeout and returns the deadline with the offer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::backend::{Pending, TextBackend};
use crate::broker::msg::{ShardMsg, TextCmd, TextOutcome, TextPort, TextRequest};
use crate::broker::types::shard_of;
use crate::ids::{ConnId, OfferId};
use crate::protocol::text::ErrorCode;

/// [`TextBackend`] over the dispatcher shards.
pub struct ShardBackend {
    shards: Arc<[Sender<ShardMsg>]>,
    next_port: AtomicU64,
}

impl ShardBackend {
    /// A backend over `shards`.
    pub fn new(shards: Arc<[Sender<ShardMsg>]>) -> ShardBackend {
        ShardBackend { shards, next_port: AtomicU64::new(1) }
    }

    fn shard(&self, cmd: &TextCmd) -> usize {
        match cmd {
            TextCmd::Sched { queue, .. } | TextCmd::Ask { queue } => shard_of(&queue.0, self.shards.len()),
            TextCmd::Answer { offer, .. } | TextCmd::Release { offer } => offer.shard,
        }
    }

    fn send(&self, conn: ConnId, cmd: TextCmd, port: TextPort) -> Result<(), ErrorCode> {
        let tx = self.shards.get(self.shard(&cmd)).ok_or(ErrorCode::NoTask)?;
        let msg = ShardMsg::Text { port, cmds: vec![TextRequest { conn, cmd }] };
        tx.send(msg).map_err(|_| ErrorCode::ShuttingDown)
    }
}

impl TextBackend for ShardBackend {
    fn call(&self, conn: ConnId, cmd: TextCmd) -> TextOutcome {
        self.submit(conn, cmd).wait()
    }

    fn submit(&self, conn: ConnId, cmd: TextCmd) -> Pending {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let port = TextPort { id: self.next_port.fetch_add(1, Ordering::Relaxed), tx };
        match self.send(conn, cmd, port) {
            Ok(()) => Pending::Waiting(rx),
            Err(code) => Pending::Ready(TextOutcome::Refused(code)),
        }
    }

    fn release(&self, conn: ConnId, offer: OfferId) {
        let (tx, _) = crossbeam_channel::bounded(1);
        let port = TextPort { id: 0, tx };
        let _ = self.send(conn, TextCmd::Release { offer }, port);
    }
}
