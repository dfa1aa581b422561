mod client;
mod emqp_router;
mod text;
