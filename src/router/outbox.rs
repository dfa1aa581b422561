//! [`ShardOutbox`]: where a shard thread's output goes in the running
//! router. Messages for peers are gathered and handed to the I/O thread as
//! one batch at [`Outbox::flush`] (one channel operation and at most one
//! wake-up per shard batch); messages for other shards go straight into
//! their channels, so they always arrive before frames handed over later;
//! text answers are gathered per port and sent as one message per port per
//! batch.

use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::broker::msg::{Outbox, Outgoing, ShardMsg, TextPort, TextReply};
use crate::zmq_io::egress::EgressTx;

/// The router's [`Outbox`] for one shard thread.
pub struct ShardOutbox {
    index: usize,
    egress: EgressTx,
    shards: Arc<[Sender<ShardMsg>]>,
    /// Messages for peers, handed to the I/O thread as one batch at flush.
    emqp: Vec<Outgoing>,
    text: Vec<(TextPort, Vec<TextReply>)>,
}

impl ShardOutbox {
    /// The outbox of shard `index`.
    pub fn new(index: usize, egress: EgressTx, shards: Arc<[Sender<ShardMsg>]>) -> ShardOutbox {
        ShardOutbox { index, egress, shards, emqp: Vec::new(), text: Vec::new() }
    }
}

impl Outbox for ShardOutbox {
    fn emqp(&mut self, out: Outgoing) {
        self.emqp.push(out);
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
        self.egress.send_batch(std::mem::take(&mut self.emqp));
        for (port, replies) in self.text.drain(..) {
            // Only a stopped text front end no longer reads its port.
            let _ = port.send(self.index, replies);
        }
    }
}
