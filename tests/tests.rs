mod bench;
mod emqp_router;
