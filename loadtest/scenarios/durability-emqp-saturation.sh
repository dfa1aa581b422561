# Durability at saturation (issue 12): emqp-saturation's load (64 B, 4
# clients × 4 workers with 32 slots, 128 in flight per client, 100,000
# jobs) against emq-router with durability "sync" (sync thread, and on the
# shard thread), "async" and "memory", runs interleaved, 3 each.
MODE=emqp
TARGETS="emq emq-shard-sync emq-async emq-memory"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --in-flight 128 --size 64 --requests 100000 --warmup 500ms"
