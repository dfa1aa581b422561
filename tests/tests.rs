mod emqp_router;
