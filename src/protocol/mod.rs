//! Pure codecs: eMQP frames, headers, queue lists, text lines, and JSON as
//! Python's `json` module reads and writes it. No sockets, no clocks.

pub mod emqp;
pub mod headers;
pub mod pyjson;
pub mod queues;
pub mod text;
