mod scheduler;
