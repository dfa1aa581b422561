mod client;
mod emqp_router;
mod text;
mod text_broker;
