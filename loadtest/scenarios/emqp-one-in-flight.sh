# Latency with one job in flight (issue 13): 1 client, 1 worker with 1 slot,
# 64 B, 20,000 jobs; emq-router vs the zero-logic forwarder processes (one
# message per job, and the five of an eMQP job: `--wire emqp`), runs
# interleaved, 3 each.
MODE=emqp
TARGETS="emq forwarder forwarder-emqp"
RUNS=3
ARGS="--clients 1 --workers 1 --slots 1 --in-flight 1 --size 64 --requests 20000 --warmup 500ms"
