//! The text protocol front end (docs/text-protocol.md): an acceptor pool on one
//! listener and one blocking thread per connection.
//!
//! Queue operations go through [`TextBackend`], the broker's text contract
//! ([`crate::broker::msg::TextCmd`] in, [`crate::broker::msg::TextOutcome`]
//! out); [`shard_backend::ShardBackend`] implements it over the shards, and
//! the tests implement it in one mutex. Connection counters for STATUS are
//! in [`TextStats`]. The router starts the server (src/router).

mod accept;
pub mod backend;
mod conn;
pub mod shard_backend;
mod stats;

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use backend::TextBackend;
pub use stats::{TextStats, TextStatsSnapshot};

use crate::config::TextConfig;
use crate::ids::ConnId;
use crate::limits::TEXT_SHUTDOWN_WAIT as SHUTDOWN_WAIT;

/// State shared by the acceptors and the connection threads.
struct Shared {
    backend: Arc<dyn TextBackend>,
    stats: Arc<TextStats>,
    config: TextConfig,
    /// A clone of every open connection's stream, to shut them down.
    streams: Mutex<HashMap<ConnId, TcpStream>>,
    next_conn: AtomicU64,
    stopping: AtomicBool,
}

/// A running text protocol server. Dropping it shuts it down.
pub struct TextServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    acceptors: Vec<JoinHandle<()>>,
}

impl TextServer {
    /// Binds `addr` (port 0 picks a free port) and starts
    /// `config.acceptors` acceptor threads (`emq-text-accept-N`).
    ///
    /// # Errors
    /// Binding or thread creation failed.
    pub fn start(
        addr: SocketAddr,
        config: TextConfig,
        backend: Arc<dyn TextBackend>,
        stats: Arc<TextStats>,
    ) -> io::Result<TextServer> {
        let listener = accept::bind(addr)?;
        let local_addr = listener.local_addr()?;
        let acceptors_wanted = config.acceptors.max(1);
        let shared = Arc::new(Shared {
            backend,
            stats,
            config,
            streams: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        });
        let mut server = TextServer { shared, local_addr, acceptors: Vec::new() };
        for n in 0..acceptors_wanted {
            let listener = listener.try_clone()?;
            let shared = Arc::clone(&server.shared);
            let handle = std::thread::Builder::new()
                .name(format!("emq-text-accept-{n}"))
                .spawn(move || accept::accept_loop(shared, listener))?;
            server.acceptors.push(handle);
        }
        tracing::info!(addr = %local_addr, "text protocol listening");
        Ok(server)
    }

    /// The bound address (with the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The live counters.
    pub fn stats(&self) -> &Arc<TextStats> {
        &self.shared.stats
    }

    /// Stops accepting, closes every connection (held offers go back to the
    /// front of their queues) and waits up to 5 s for the threads to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.shared.stopping.swap(true, Relaxed) {
            return;
        }
        let mut wake = self.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
        }
        for handle in self.acceptors.drain(..) {
            while !handle.is_finished() {
                // Each connection wakes one blocked `accept`.
                if TcpStream::connect_timeout(&wake, Duration::from_millis(200)).is_err() {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let _ = handle.join();
        }
        for stream in self.shared.streams.lock().values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let until = Instant::now() + SHUTDOWN_WAIT;
        while self.shared.stats.connections_open.load(Relaxed) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for TextServer {
    fn drop(&mut self) {
        self.stop();
    }
}
