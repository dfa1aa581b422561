# Durability on the text protocol (issue 12): text-16x16's load (16
# producers, 16 consumers, 64 B, 8 in flight per producer) against
# emq-router with durability "sync" (sync thread, and on the shard thread),
# "async" and "memory", and beanstalkd with a binlog fsynced at every write
# (`-b DIR -f 0`) and every 50 ms (`-b DIR`, its default), runs
# interleaved, 3 each.
MODE=text
TARGETS="emq emq-shard-sync emq-async emq-memory beanstalkd-b0 beanstalkd-b50"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 20000 --warmup 500ms"
