# Text protocol: 16 producers (SCHED) and 16 consumers (ASK/ACK with NOPE
# back-off), 64 B tasks on one queue, 8 in flight per producer; the same
# load against beanstalkd (put; reserve-with-timeout 0/delete, same back-off).
# emq runs with its default durability (sync: every answer waits for the
# fdatasync of its batch) and in memory mode; beanstalkd without a binlog
# (durability-text compares emq sync with beanstalkd -b -f 0).
MODE=text
TARGETS="emq emq-memory beanstalkd"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 20000 --warmup 500ms"
