#!/usr/bin/env bash
# System calls the router makes per job, counted by `perf stat` (tracepoints
# syscalls:sys_enter_*; counts, not times, so they hold on a busy machine).
#
#   loadtest/syscalls.sh [ROUTER ...]     # default: target/release/emq-router
#
# For each router binary given: starts it with durability "memory" on fresh
# loopback ports and a fresh data directory under /tmp, runs the emqp load
# (EMQ_SC_ARGS, default the emqp-saturation load: 4 clients x 4 workers
# with 32 slots, 128 in flight per client, 64 B) for EMQ_SC_JOBS jobs
# (default 40,000) while `perf stat -p` counts the router's epoll_ctl,
# epoll_wait, sendto, recvfrom, write, read and poll calls and its context
# switches, then prints each per job. Needs perf (Debian's linux-perf) and
# root or perf_event_paranoid <= 1. Stops what it starts, by PID.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
cargo build --release --quiet --bin emq-bench --bin emq-router
BENCH=$ROOT/target/release/emq-bench
JOBS=${EMQ_SC_JOBS:-40000}
ARGS=${EMQ_SC_ARGS:---clients 4 --workers 4 --slots 32 --in-flight 128 --size 64}
EVENTS=syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_poll,context-switches
ROUTERS=("$@")
[ ${#ROUTERS[@]} -gt 0 ] || ROUTERS=("$ROOT/target/release/emq-router")

PID=
DATA=
TMP=$(mktemp -d /tmp/emq-syscalls-XXXXXX)
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
  if [ -n "$DATA" ]; then rm -rf "$DATA"; fi
}
trap cleanup EXIT

for router in "${ROUTERS[@]}"; do
  read -r FE BE AD TX < <(python3 -c "import socket
ss=[socket.socket() for _ in range(4)]
[s.bind(('127.0.0.1',0)) for s in ss]
print(' '.join(str(s.getsockname()[1]) for s in ss), flush=True)
[s.close() for s in ss]")
  DATA=$(mktemp -d /tmp/emq-syscalls-data-XXXXXX)
  "$router" --log warn --frontend "tcp://127.0.0.1:$FE" --backend "tcp://127.0.0.1:$BE" \
    --admin "tcp://127.0.0.1:$AD" --text "127.0.0.1:$TX" --metrics off --data-dir "$DATA" \
    --durability memory >"$TMP/router.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$BE") 2>/dev/null && break; sleep 0.1; done
  perf stat -e "$EVENTS" -p "$PID" -o "$TMP/stat" &
  STAT=$!
  sleep 0.3
  # shellcheck disable=SC2086
  "$BENCH" emqp --frontend "tcp://127.0.0.1:$FE" --backend "tcp://127.0.0.1:$BE" $ARGS \
    --requests "$JOBS" --warmup 0s --pid "$PID" --out "$TMP" --name syscalls >"$TMP/bench.log" 2>&1
  kill -INT "$STAT"; wait "$STAT" 2>/dev/null || true
  kill "$PID"; wait "$PID" 2>/dev/null || true
  PID=
  rm -rf "$DATA"; DATA=
  echo "== $router ($JOBS jobs; $(grep -o '"broker_cpu_us_per_job":[0-9.]*' "$TMP/bench.log" | head -1))"
  awk -v n="$JOBS" '/syscalls:|context-switches/ {gsub(",","",$1); sub("syscalls:sys_enter_","",$2);
    printf "  %-18s %9d  %.3f per job\n", $2, $1, $1/n}' "$TMP/stat"
done
