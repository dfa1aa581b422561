#!/usr/bin/env bash
# Instructions per job, counted by valgrind's callgrind (identical from run
# to run, whatever else the machine does), for emq-router and for the
# zero-logic forwarders under the same eMQP load: `forwarder` (`emq-bench
# forwarder`, one message per job) and `forwarder-emqp` (`--wire emqp`, the
# five messages of an eMQP job).
#
#   loadtest/callgrind.sh [emq|forwarder|forwarder-emqp ...]   # default: all three
#
# Each target runs twice under callgrind, with N1 and N2 jobs (EMQ_CG_N1,
# EMQ_CG_N2; default 2,000 and 10,000); instructions per job is the slope
# (Ir(N2) - Ir(N1)) / (N2 - N1), so start-up, shutdown and idle heartbeats
# cancel out. The load: 2 clients, 2 workers with 16 slots, 32 in flight
# per client, 64-byte bodies, no warm-up. Writes the callgrind files and
# callgrind-summary.txt to loadtest/results/callgrind-<rev>/ (override:
# EMQ_CG_OUT); `callgrind_annotate <file>` shows where the instructions go.
# emq-router runs with a fresh data directory under /tmp per run (removed
# after it) and durability EMQ_CG_DURABILITY (default "sync", its default).
# Stops what it starts, by PID.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
cargo build --release --quiet --bin emq-bench --bin emq-router
BENCH=$ROOT/target/release/emq-bench
ROUTER=${EMQ_CG_ROUTER:-$ROOT/target/release/emq-router}
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${EMQ_CG_OUT:-$ROOT/loadtest/results/callgrind-$REV}
N1=${EMQ_CG_N1:-2000}
N2=${EMQ_CG_N2:-10000}
DURABILITY=${EMQ_CG_DURABILITY:-sync}
TARGETS=${*:-emq forwarder forwarder-emqp}
mkdir -p "$OUT"

PID=
DATA=
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  if [ -n "$DATA" ]; then rm -rf "$DATA"; fi
}
trap cleanup EXIT

free_port() {
  python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()"
}

wait_port() { # PORT: until something listens (120 s: valgrind starts slowly)
  for _ in $(seq 1200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || { echo "target exited" >&2; return 1; }
    sleep 0.1
  done
  echo "nothing listens on $1" >&2; return 1
}

# run TARGET N -> prints total instructions (Ir) of the target for N jobs.
# Runs in a command substitution (a subshell of its own): its trap stops
# its target and removes its data directory however it ends.
run() {
  trap cleanup EXIT
  local target=$1 n=$2 fp bp file
  fp=$(free_port); bp=$(free_port)
  file=$OUT/$target-$n.callgrind
  local cg=(valgrind --tool=callgrind --callgrind-out-file="$file" --separate-threads=no)
  case $target in
    emq) DATA=$(mktemp -d /tmp/emq-callgrind-XXXXXX)
         "${cg[@]}" "$ROUTER" --data-dir "$DATA" --durability "$DURABILITY" --frontend-addr "tcp://127.0.0.1:$fp" --backend-addr "tcp://127.0.0.1:$bp" \
           --admin-addr "tcp://127.0.0.1:$(free_port)" --text-addr off --metrics off --latency-interval 0s \
           --log warn >"$OUT/$target-$n.log" 2>&1 &
         ;;
    forwarder|forwarder-emqp)
         local wire=one
         [ "$target" = forwarder-emqp ] && wire=emqp
         "${cg[@]}" "$BENCH" forwarder --wire "$wire" --frontend-addr "tcp://127.0.0.1:$fp" \
           --backend-addr "tcp://127.0.0.1:$bp" >"$OUT/$target-$n.log" 2>&1 &
         ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
  PID=$!
  wait_port "$fp"; wait_port "$bp"
  "$BENCH" emqp --frontend "tcp://127.0.0.1:$fp" --backend "tcp://127.0.0.1:$bp" --target-name "$target" \
    --clients 2 --workers 2 --slots 16 --in-flight 32 --size 64 --requests "$n" --warmup 0s \
    --probe-timeout 60s --drain-timeout 120s --no-progress --out "$OUT" --name "$target-$n" >/dev/null
  kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=
  callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}

{
  echo "# instructions per job (callgrind slope between $N1 and $N2 jobs), rev $REV"
  for t in $TARGETS; do
    a=$(run "$t" "$N1"); b=$(run "$t" "$N2")
    echo "$t: Ir($N1)=$a Ir($N2)=$b per_job=$(( (b - a) / (N2 - N1) ))"
  done
} | tee "$OUT/callgrind-summary.txt"
