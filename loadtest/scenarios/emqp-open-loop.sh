# Latency at a fixed offered load: open loop at 5,000 jobs/s for 5 s,
# latency from the intended send time (coordinated omission corrected).
MODE=emqp
TARGETS="emq baseline baseline-emqp"
RUNS=1
ARGS="--clients 4 --workers 4 --slots 4 --size 64 --rate 5000 --duration 5s --warmup 1s"
