# Durability on eMQP (issue 12): emqp-64b's load (64 B, 4 clients × 4
# workers, 16 in flight per client) against emq-router with durability
# "sync" (emq: the per-shard sync thread releases a batch's output after
# its fdatasync; emq-shard-sync: the shard thread syncs itself), "async"
# and "memory", runs interleaved, 3 each.
MODE=emqp
TARGETS="emq emq-shard-sync emq-async emq-memory"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 1 --in-flight 16 --size 64 --requests 20000 --warmup 500ms"
