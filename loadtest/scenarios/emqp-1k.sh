# 1 KiB eMQP jobs, otherwise as emqp-64b.
MODE=emqp
TARGETS="emq baseline baseline-emqp"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 1 --in-flight 16 --size 1024 --requests 20000 --warmup 500ms"
