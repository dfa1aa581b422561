# Replicated durability on the text protocol (issue 27): text-16x16's load
# (16 producers × 16 consumers, 64 B, 8 in flight per producer, 20,000
# jobs) against emq-router with durability "replicated" (a local 3-node
# JetStream cluster), "sync" and "memory"; runs interleaved, 3 each.
# Needs the cluster: loadtest/replicated.sh runs it.
MODE=text
TARGETS="emq-replicated emq emq-memory"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 20000 --warmup 500ms"
