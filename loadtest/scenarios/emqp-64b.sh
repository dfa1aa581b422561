# 64 B eMQP jobs, 4 clients and 4 workers (1 slot each), closed loop with
# 16 jobs in flight per client; emq-router vs the zero-logic baselines (one
# message per job, and the five of an eMQP job) vs the Python EventMQ 0.3.13
# router, 3 runs each (medians in summary.md).
MODE=emqp
TARGETS="emq baseline baseline-emqp python"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 1 --in-flight 16 --size 64 --requests 20000 --warmup 500ms"
