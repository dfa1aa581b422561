# The router at saturation (issue 13): 64 B eMQP jobs, 4 clients × 4
# workers with 32 slots each, 128 jobs in flight per client, 100,000 jobs;
# emq-router vs the zero-logic forwarders as processes of their own (one
# message per job, and the five messages of an eMQP job: `--wire emqp`) vs
# the Python EventMQ 0.3.13 router, runs interleaved, 3 each, with each
# broker's CPU per job from /proc.
MODE=emqp
TARGETS="emq forwarder forwarder-emqp python"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --in-flight 128 --size 64 --requests 100000 --warmup 500ms"
