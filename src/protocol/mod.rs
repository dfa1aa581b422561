//! Pure codecs: eMQP frames, headers, queue lists, text lines. No sockets,
//! no clocks.

pub mod emqp;
pub mod headers;
pub mod queues;
pub mod text;
