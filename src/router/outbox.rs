//! [`ShardOutbox`]: where a shard thread's output goes in the running
//! router. Messages for peers are gathered and handed to the I/O thread as
//! one batch at [`Outbox::flush`] (one channel operation and at most one
//! wake-up per shard batch); messages for other shards go straight into
//! their channels, so they always arrive before frames handed over later;
//! text answers are gathered per port and sent as one message per port per
//! batch.
//!
//! With `durability = "sync"`, a batch's frames for workers leave at once,
//! but its frontend frames (acceptance REPLYs, ERRORs) and text answers are
//! handed to the shard's sync thread ([`Outbox::flush_after_sync`]), which
//! releases them once the batch's log records are durable; while any such
//! release is outstanding, later batches' frontend frames and answers go
//! the same way, so they keep their order. (With the sync on the shard's
//! thread, [`Outbox::flush_early`] hands over the workers' frames before
//! the sync.)

use std::sync::Arc;

use crossbeam_channel::Sender;

use crate::broker::msg::{Dest, Outbox, Outgoing, ShardMsg, TextPort, TextReply};
use crate::wal::sync::{SyncThread, SyncWait};
use crate::zmq_io::egress::EgressTx;

/// The router's [`Outbox`] for one shard thread.
pub struct ShardOutbox {
    index: usize,
    egress: EgressTx,
    shards: Arc<[Sender<ShardMsg>]>,
    /// Messages for frontend peers, handed to the I/O thread as one batch
    /// at flush (after the sync, when the log has one to wait for).
    emqp: Vec<Outgoing>,
    /// Messages for workers (backend), which never wait for a sync.
    backend: Vec<Outgoing>,
    text: Vec<(TextPort, Vec<TextReply>)>,
    /// The shard's sync thread, when its log syncs on one.
    sync: Option<SyncThread>,
}

impl ShardOutbox {
    /// The outbox of shard `index`, releasing through `sync` when given.
    pub fn new(
        index: usize,
        egress: EgressTx,
        shards: Arc<[Sender<ShardMsg>]>,
        sync: Option<SyncThread>,
    ) -> ShardOutbox {
        ShardOutbox { index, egress, shards, emqp: Vec::new(), backend: Vec::new(), text: Vec::new(), sync }
    }

    /// What was gathered since the last flush, as one release.
    fn take_release(&mut self) -> impl FnOnce() + Send + 'static {
        let (egress, emqp) = (self.egress.clone(), std::mem::take(&mut self.emqp));
        let (index, text) = (self.index, std::mem::take(&mut self.text));
        move || release(index, &egress, emqp, text)
    }
}

/// Hands frames to the I/O thread and answers to text ports.
fn release(index: usize, egress: &EgressTx, emqp: Vec<Outgoing>, text: Vec<(TextPort, Vec<TextReply>)>) {
    egress.send_batch(emqp);
    for (port, replies) in text {
        // Only a stopped text front end no longer reads its port.
        let _ = port.send(index, replies);
    }
}

impl Outbox for ShardOutbox {
    fn emqp(&mut self, out: Outgoing) {
        match out.dest {
            Dest::Backend => self.backend.push(out),
            _ => self.emqp.push(out),
        }
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
        if self.sync.as_ref().is_some_and(SyncThread::busy) {
            self.flush_early();
            let rel = self.take_release();
            if let Some(sync) = &self.sync {
                sync.release_after(None, Box::new(rel));
            }
            return;
        }
        let mut all = std::mem::take(&mut self.backend);
        all.append(&mut self.emqp);
        release(self.index, &self.egress, all, std::mem::take(&mut self.text));
    }

    fn flush_after_sync(&mut self, wait: SyncWait) {
        self.flush_early();
        let rel = self.take_release();
        match &self.sync {
            Some(sync) => sync.release_after(Some(wait), Box::new(rel)),
            None => rel(),
        }
    }

    fn flush_early(&mut self) {
        if !self.backend.is_empty() {
            self.egress.send_batch(std::mem::take(&mut self.backend));
        }
    }
}
