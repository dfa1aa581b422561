mod client;
mod common;
mod emqp_router;
mod interop;
mod text;
mod text_broker;
mod worker_e2e;
