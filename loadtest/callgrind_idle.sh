#!/usr/bin/env bash
# Instructions per heartbeat message, counted by callgrind: emq-router with
# W idle workers (emq-bench idle: INFORM once, then a HEARTBEAT every 3 s)
# for T1 and T2 seconds; per heartbeat = (Ir(T2) - Ir(T1)) / (messages in
# T2 - T1), where messages = W / 3 s in plus W / heartbeat_interval out.
#
#   loadtest/callgrind_idle.sh [W] [T1] [T2]     # default 1000 20 60
#
# Writes loadtest/results/callgrind-idle-<rev>.txt. Stops what it starts.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
W=${1:-1000}
T1=${2:-20}
T2=${3:-60}
cargo build --release --quiet --bin emq-bench --bin emq-router
BENCH=$ROOT/target/release/emq-bench
ROUTER=$ROOT/target/release/emq-router
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIR=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$DIR"; }
trap cleanup EXIT
port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()"; }
wait_port() { for _ in $(seq 1200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

run() { # SECONDS -> Ir
  local bp
  bp=$(port)
  valgrind --tool=callgrind --callgrind-out-file="$DIR/idle-$1.cg" "$ROUTER" \
    --frontend-addr "tcp://127.0.0.1:$(port)" --backend-addr "tcp://127.0.0.1:$bp" \
    --admin-addr "tcp://127.0.0.1:$(port)" --text-addr off --latency-interval 0s --log warn \
    --data-dir "$DIR/router-$1" --metrics "" 2>/dev/null &
  PID=$!
  wait_port "$bp"
  "$BENCH" idle --backend "tcp://127.0.0.1:$bp" --workers "$W" --duration "${1}s" --probe-timeout 120s \
    --out "$DIR" --name "idle-$1" >/dev/null
  kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=
  callgrind_annotate "$DIR/idle-$1.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}

a=$(run "$T1"); b=$(run "$T2")
msgs=$(( (T2 - T1) * W * 2 / 3 ))
echo "# emq-router, $W idle workers, rev $REV: Ir(${T1}s)=$a Ir(${T2}s)=$b heartbeat messages in between=$msgs per_message=$(( (b - a) / msgs ))" \
  | tee "$ROOT/loadtest/results/callgrind-idle-$REV.txt"
