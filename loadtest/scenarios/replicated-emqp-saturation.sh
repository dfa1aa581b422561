# Replicated durability at saturation (issue 27): emqp-saturation's load
# (64 B, 4 clients × 4 workers with 32 slots, 128 in flight per client,
# 100,000 jobs) against emq-router with durability "replicated" (a local
# 3-node JetStream cluster, R3, sync_interval always), "sync" and
# "memory", and the raw per-message JetStream baseline (`emq-bench
# jetstream`, 100,000 jobs of 64 B, 256 PubAcks in flight) on the same
# cluster; runs interleaved, 3 each. Needs the cluster:
# loadtest/replicated.sh runs it.
MODE=emqp
TARGETS="emq-replicated emq emq-memory jetstream"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --in-flight 128 --size 64 --requests 100000 --warmup 500ms"
JETSTREAM_ARGS="--jobs 100000 --size 64 --in-flight 256"
