# CURVE's cost at saturation: emqp-saturation's load (64 B eMQP jobs, 4
# clients × 4 workers with 32 slots each, 128 jobs in flight per client,
# 100,000 jobs) against emq-router over plain TCP (`emq`) and over its CURVE
# endpoints (`emq-curve`: every client and worker a CURVE client), runs
# interleaved, 3 each, with the router's CPU per job from /proc.
MODE=emqp
TARGETS="emq emq-curve"
RUNS=3
ARGS="--clients 4 --workers 4 --slots 32 --in-flight 128 --size 64 --requests 100000 --warmup 500ms"
