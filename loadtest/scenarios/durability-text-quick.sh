# durability-text's load (16 producers × 16 consumers, 64 B, 8 in flight
# per producer) with 5,000 measured jobs, against emq-router with
# durability "sync" and "memory" and beanstalkd with `-b DIR -f 0`, runs
# interleaved, 3 each: a quicker check of the sync/memory and
# sync/beanstalkd ratios (beanstalkd -f 0 does a few hundred jobs/s on a
# contended disk).
MODE=text
TARGETS="emq emq-memory beanstalkd-b0"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 5000 --warmup 500ms"
