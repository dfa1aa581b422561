#!/usr/bin/env bash
# Write-ahead log figures (issue 12): for each protocol, a fresh emq-router
# (its own temporary data directory) gets N queued 64-byte jobs
# (`emq-bench fill`: eMQP REQUESTs to `default` with durability "sync",
# then text SCHEDs with "async": the fill's one connection sends SCHEDs one
# at a time, and with "sync" each would wait for a sync of its own; the log
# is the same), then
#   * disk bytes per queued job: the log's bytes (STATUS emq.wal) / N;
#   * recovery: the router is killed (kill -9) and started again on the
#     same data directory; reported are the router's own recovery time
#     (its "write-ahead log recovered" line), the time from exec until its
#     ports accept connections, the router's CPU time (user + system,
#     /proc/PID/stat) until then, and the jobs STATUS shows waiting (must
#     be N). RESTARTS (default 3) restarts with the log in the page cache
#     (warm); as root, one more after dropping the page cache gives the cold
#     figure.
#
#   loadtest/recovery.sh [N]        # default 1,000,000
#
# Writes loadtest/results/recovery-<rev>.txt. Stops what it starts, by PID,
# and removes its data directories.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-1000000}
RESTARTS=${RESTARTS:-3}
cargo build --release --quiet --bin emq-bench --bin emq-router --bin emq-cli
BENCH=$ROOT/target/release/emq-bench
ROUTER=$ROOT/target/release/emq-router
CLI=$ROOT/target/release/emq-cli
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=$ROOT/loadtest/results/recovery-$REV.txt
PID= DATA=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  [ -n "$DATA" ] && rm -rf "$DATA"
  true
}
trap cleanup EXIT

port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()"; }
wait_port() { for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.01; done; return 1; }
now() { date +%s.%N; }

start() { # LOG [FLAGS…]: the router on FP BP AP TP and DATA, logging to LOG
  local log=$1
  shift
  "$ROUTER" "$@" --frontend-addr "tcp://127.0.0.1:$FP" --backend-addr "tcp://127.0.0.1:$BP" \
    --admin-addr "tcp://127.0.0.1:$AP" --text-addr "127.0.0.1:$TP" --metrics off --latency-interval 0s \
    --max-queue-len "$((N + 1))" --data-dir "$DATA" --log info >"$log" 2>&1 &
  PID=$!
}

status() { EMQ_ADMIN_ADDR="tcp://127.0.0.1:$AP" "$CLI" status --json; }

cpu_ms() { # PID: its user + system CPU time so far, in ms (/proc/PID/stat)
  python3 -c "import os,sys; f=open('/proc/%s/stat'%sys.argv[1]).read().rsplit(')',1)[1].split(); print(round((int(f[11])+int(f[12]))*1000/os.sysconf('SC_CLK_TCK')))" "$1"
}

restart() { # LABEL
  local t0 t1 log=$DATA.log cpu
  t0=$(now); start "$log"; wait_port "$FP"; wait_port "$TP"; t1=$(now)
  cpu=$(cpu_ms "$PID")
  local ms waiting
  ms=$(grep -o 'write-ahead log recovered.*millis=[0-9]*' "$log" | grep -o 'millis=[0-9]*' | cut -d= -f2)
  waiting=$(status | python3 -c "import json,sys; print(sum(json.load(sys.stdin)['waiting_messages_by_queue'].values()))")
  echo "  $1: recovered $waiting jobs; recovery ${ms} ms in the router; exec to listening $(python3 -c "print(round(($t1-$t0)*1000))") ms; router CPU to listening ${cpu} ms"
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
}

measure() { # PROTOCOL
  DATA=$(mktemp -d /tmp/emq-recovery-XXXXXX)
  FP=$(port) BP=$(port) AP=$(port) TP=$(port)
  local durability=sync
  [ "$1" = text ] && durability=async
  start "$DATA.fill.log" --durability "$durability"
  wait_port "$FP"; wait_port "$TP"
  local fill
  case $1 in
    emqp) fill=$("$BENCH" fill --frontend "tcp://127.0.0.1:$FP" --queue default --jobs "$N" --pid "$PID") ;;
    text) fill=$("$BENCH" fill --text "127.0.0.1:$TP" --queue fill --jobs "$N" --pid "$PID") ;;
  esac
  local bytes
  bytes=$(status | python3 -c "import json,sys; print(sum(s['log_bytes'] for s in json.load(sys.stdin)['emq']['wal']['shards']))")
  echo "$1: fill $fill"
  echo "  log: $bytes bytes for $N jobs = $(python3 -c "print(round($bytes/$N, 1))") bytes per queued job (du: $(du -sb "$DATA/wal" | cut -f1))"
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
  for i in $(seq "$RESTARTS"); do restart "warm restart $i (log in the page cache)"; done
  if [ -w /proc/sys/vm/drop_caches ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches
    restart "cold restart (page cache dropped)"
  fi
  rm -rf "$DATA" "$DATA".*log; DATA=
}

{
  echo "# emq-router write-ahead log: disk per queued 64-byte job and recovery of $N jobs, rev $REV, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for p in emqp text; do measure "$p"; done
} | tee "$OUT"
