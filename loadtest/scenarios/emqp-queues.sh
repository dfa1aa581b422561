# Many queues with weights: 8 queues (requests round-robin over them),
# 8 workers serving all of them with weights 10,10,5,5,2,2,1,1.
MODE=emqp
TARGETS="emq baseline baseline-emqp"
RUNS=3
ARGS="--clients 4 --workers 8 --slots 2 --in-flight 16 --size 64 --queues 8 --weights 10,10,5,5,2,2,1,1 --requests 20000 --warmup 500ms"
