# Text protocol as text-16x16, but consumers long-poll: emq `ASK <queue>
# 1000` (waits on the broker up to 1 s for a task), beanstalkd
# `reserve-with-timeout 1`; no client-side back-off after an empty answer.
MODE=text
TARGETS="emq emq-memory beanstalkd"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 20000 --warmup 500ms --ask-wait 1s"
