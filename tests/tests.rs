mod scheduler;
mod scheduler_e2e;
