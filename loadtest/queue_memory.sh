#!/usr/bin/env bash
# Resident memory per queued job: a fresh emq-router per protocol, one queue
# filled with N 64-byte jobs that no worker takes (eMQP REQUESTs, then text
# SCHEDs), the router's VmRSS read before and after (`emq-bench fill`).
# Each router gets a temporary data directory (removed afterwards); eMQP
# runs with the default durability ("sync"), text with "async": the fill's
# one text connection sends SCHEDs one at a time, and with "sync" each
# waits for a sync of its own (~0.3 ms, over 5 minutes for 1,000,000); the
# memory a queued job takes is the same either way.
#
#   loadtest/queue_memory.sh [N]        # default 1,000,000
#
# Writes loadtest/results/queue-memory-<rev>.txt. Stops what it starts, by PID.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-1000000}
cargo build --release --quiet --bin emq-bench --bin emq-router
BENCH=$ROOT/target/release/emq-bench
ROUTER=$ROOT/target/release/emq-router
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=$ROOT/loadtest/results/queue-memory-$REV.txt
PID=
DATA=$(mktemp -d /tmp/emq-queue-memory-XXXXXX)
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT

port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()"; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }

measure() { # PROTOCOL
  local fp tp durability=sync
  fp=$(port); tp=$(port)
  [ "$1" = text ] && durability=async
  rm -rf "$DATA"/*
  "$ROUTER" --data-dir "$DATA" --durability "$durability" --frontend-addr "tcp://127.0.0.1:$fp" --backend-addr "tcp://127.0.0.1:$(port)" \
    --admin-addr "tcp://127.0.0.1:$(port)" --text-addr "127.0.0.1:$tp" --metrics off --latency-interval 0s \
    --max-queue-len "$((N + 1))" --log warn &
  PID=$!
  wait_port "$fp"; wait_port "$tp"
  case $1 in
    emqp) "$BENCH" fill --frontend "tcp://127.0.0.1:$fp" --queue default --jobs "$N" --pid "$PID" ;;
    text) "$BENCH" fill --text "127.0.0.1:$tp" --queue fill --jobs "$N" --pid "$PID" ;;
  esac
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
}

{
  echo "# emq-router resident memory per queued 64-byte job, $N jobs, rev $REV"
  for p in emqp text; do echo "$p: $(measure $p)"; done
} | tee "$OUT"
