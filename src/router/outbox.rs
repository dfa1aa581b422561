//! [`ShardOutbox`]: where a shard thread's output goes in the running
//! router. Frames go into the egress channel (the I/O thread is woken once
//! per batch, at [`Outbox::flush`]); messages for other shards go straight
//! into their channels; text answers are gathered per port and sent as one
//! message per port per batch.

use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::broker::msg::{Outbox, Outgoing, ShardMsg, TextPort, TextReply};
use crate::zmq_io::egress::EgressTx;

/// The router's [`Outbox`] for one shard thread.
pub struct ShardOutbox {
    index: usize,
    egress: EgressTx,
    shards: Arc<[Sender<ShardMsg>]>,
    /// Frames were handed over since the last wake-up.
    pushed: bool,
    text: Vec<(TextPort, Vec<TextReply>)>,
}

impl ShardOutbox {
    /// The outbox of shard `index`.
    pub fn new(index: usize, egress: EgressTx, shards: Arc<[Sender<ShardMsg>]>) -> ShardOutbox {
        ShardOutbox { index, egress, shards, pushed: false, text: Vec::new() }
    }
}

impl Outbox for ShardOutbox {
    fn emqp(&mut self, out: Outgoing) {
        self.egress.push(out);
        self.pushed = true;
    }

    fn shard(&mut self, index: usize, msg: ShardMsg) {
        let sent = self.shards.get(index).map(|tx| tx.send(msg).is_ok());
        if sent != Some(true) {
            tracing::error!(shard = self.index, to = index, "shard channel closed; message lost at shutdown");
        }
    }

    fn text(&mut self, port: &TextPort, reply: TextReply) {
        match self.text.iter_mut().find(|(p, _)| p.id == port.id) {
            Some((_, replies)) => replies.push(reply),
            None => self.text.push((port.clone(), vec![reply])),
        }
    }

    fn flush(&mut self) {
        if std::mem::take(&mut self.pushed) {
            self.egress.wake();
        }
        for (port, replies) in self.text.drain(..) {
            // Only a stopped text front end no longer reads its port.
            let _ = port.send(self.index, replies);
        }
    }
}
