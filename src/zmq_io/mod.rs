//! The only code that calls the zmq crate on the router side: the I/O
//! thread, the egress path with its wake-up, and socket set-up. Start-up,
//! shutdown and the admin thread are in [`crate::router`].

pub mod curve;
pub mod egress;
pub mod frames;
pub mod handshakes;
pub mod io_thread;
pub mod sockets;
pub mod zap;
