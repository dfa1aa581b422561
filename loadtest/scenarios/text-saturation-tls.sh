# TLS's cost on the text protocol: text-16x16's load (16 producers, 16
# consumers with NOPE back-off, 64 B tasks, 8 in flight per producer), 50,000
# tasks, against emq-router in memory mode (no fsync: the cost of the
# protocol and of TLS, not of the disk) over plain TCP (`emq-memory`) and
# over its text_tls listener with a token (`emq-memory-tls`: every
# connection a TLS 1.3 handshake, then AUTH), runs interleaved, 3 each, with
# the router's CPU per job from /proc.
MODE=text
TARGETS="emq-memory emq-memory-tls"
RUNS=3
ARGS="--clients 16 --workers 16 --in-flight 8 --size 64 --requests 50000 --warmup 500ms"
