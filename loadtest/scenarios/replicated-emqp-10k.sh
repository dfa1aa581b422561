# Replicated durability below saturation (issue 27): eMQP open loop at a
# fixed 10,000 jobs/s for 5 s (64 B, 4 clients × 4 workers with 32 slots;
# latency from the intended send time), against emq-router with durability
# "replicated" (a local 3-node JetStream cluster), "sync" and "memory";
# runs interleaved, 3 each: the acknowledgement latency when neither the
# machine's CPU nor the store is the limit, and the servers' CPU per job at
# a moderate rate. Needs the cluster: loadtest/replicated.sh runs it.
MODE=emqp
TARGETS="emq-replicated emq emq-memory"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --size 64 --rate 10000 --duration 5s --warmup 1s"
