mod client;
mod emqp_router;
mod text;
mod text_broker;
mod worker_e2e;
