//! ZeroMQ I/O (work in progress).
