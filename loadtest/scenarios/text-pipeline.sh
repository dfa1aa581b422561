# Pipelined submission, producers only: 4 connections each write 200 jobs
# per write, at most 2,000 unacknowledged; emq SCHED (a barrier line per
# batch, since SCHED has no success reply) vs beanstalkd `put` (each
# answered INSERTED). Throughput = jobs stored per second.
MODE=text
TARGETS="emq emq-memory beanstalkd"
RUNS=3
ARGS="--pipeline --clients 4 --in-flight 2000 --batch 200 --size 64 --requests 400000 --warmup 300ms"
# The router stops with the jobs still queued and logs each one: not kept.
ROUTER_ARGS="--drain-timeout 0s"
ROUTER_LOG=/dev/null
