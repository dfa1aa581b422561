# emqp-saturation with emq in durability "memory" against the forwarders
# (one message per job, and the five of an eMQP job): the router's own cost
# per job without its write-ahead log (issue 13).
MODE=emqp
TARGETS="emq-memory forwarder forwarder-emqp"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --in-flight 128 --size 64 --requests 100000 --warmup 500ms"
