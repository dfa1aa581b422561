mod client;
mod emqp_router;
