#!/usr/bin/env bash
# Recovery of a replicated job log (issue 27, point 8): an emq-router with
# durability "replicated" gets N queued 64-byte jobs (`emq-bench fill`,
# eMQP REQUESTs to `default`, each acknowledged after its batch's PubAck),
# is killed (kill -9), and once its lease on the router name has expired
# (nats_lease, 10 s, plus a second) a new router with the same name and an
# empty data directory recovers the jobs from the streams alone. Reported:
#   * the fill: jobs/s, and the streams' messages and bytes per queued job
#     (JetStream's own count, one replica);
#   * per restart (RESTARTS, default 3): the router's own recovery time
#     (its "replicated job log recovered from JetStream ... millis=" line:
#     connecting, the lease, reading every stream, replaying, making the
#     streams), the time from exec until its ports accept connections, the
#     router's CPU time until then, the three nats-servers' CPU time over
#     the same span (when their PIDs are known), and the jobs STATUS shows
#     waiting (must be N).
#
#   loadtest/recovery-replicated.sh [N]     # default 1,000,000
#
# Uses the cluster at EMQ_NATS_URLS (with EMQ_NATS_PIDS for the servers'
# CPU) when set, else starts a local 3-node cluster (loadtest/nats-cluster.sh)
# in a temporary directory and stops it at the end. Writes
# loadtest/results/recovery-replicated-<rev>.txt (RESULT overrides). Stops
# what it starts, by PID; deletes its streams and buckets and removes its
# directories.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
N=${1:-1000000}
RESTARTS=${RESTARTS:-3}
LEASE_S=10
cargo build --release --quiet --bin emq-bench --bin emq-router --bin emq-cli
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${RESULT:-$ROOT/loadtest/results/recovery-replicated-$REV.txt}
PREFIX=emqrec$$ NAME=recovery
PID= DATA= NATS_DIR=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  [ -n "$DATA" ] && rm -rf "$DATA" "$DATA".*log
  [ -n "${EMQ_NATS_URLS:-}" ] && python3 loadtest/nats_streams.py "$EMQ_NATS_URLS" delete "^(KV_)?${PREFIX}_" >/dev/null
  if [ -n "$NATS_DIR" ]; then loadtest/nats-cluster.sh stop "$NATS_DIR"; rm -rf "$NATS_DIR"; fi
  true
}
trap cleanup EXIT

if [ -z "${EMQ_NATS_URLS:-}" ]; then
  NATS_DIR=$(mktemp -d /tmp/emq-nats-XXXXXX)
  started=$(loadtest/nats-cluster.sh start "$NATS_DIR")
  EMQ_NATS_URLS=$(sed -n 's/^urls=//p' <<<"$started")
  EMQ_NATS_PIDS=$(sed -n 's/^pids=//p' <<<"$started")
fi

port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1]); s.close()"; }
wait_port() { for _ in $(seq 12000); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.01; done; return 1; }
now() { date +%s.%N; }
cpu_s() { # PID…: their user + system CPU time so far together, in seconds (/proc/PID/stat)
  python3 -c "import os,sys
t=0
for p in sys.argv[1:]:
    f=open('/proc/%s/stat'%p).read().rsplit(')',1)[1].split(); t+=int(f[11])+int(f[12])
print(t/os.sysconf('SC_CLK_TCK'))" "$@"
}
servers_cpu_s() { if [ -n "${EMQ_NATS_PIDS:-}" ]; then cpu_s ${EMQ_NATS_PIDS//,/ }; else echo 0; fi; }

start() { # LOG: the router on FP BP AP TP and a fresh empty DATA, logging to LOG
  "$BIN/emq-router" --durability replicated --nats-urls "$EMQ_NATS_URLS" --nats-stream-prefix "$PREFIX" \
    --router-name "$NAME" --frontend "tcp://127.0.0.1:$FP" --backend "tcp://127.0.0.1:$BP" \
    --admin "tcp://127.0.0.1:$AP" --text "127.0.0.1:$TP" --metrics off --latency-interval 0s \
    --max-queue-len "$((N + 1))" --data-dir "$DATA" --log info >"$1" 2>&1 &
  PID=$!
}
status() { EMQ_ADMIN_ADDR="tcp://127.0.0.1:$AP" "$BIN/emq-cli" status --json; }
kill_router() { kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=; rm -rf "$DATA"; DATA=; }
fresh_data() { DATA=$(mktemp -d /tmp/emq-recovery-XXXXXX); }

restart() { # LABEL
  fresh_data
  local log=$DATA.log t0 t1 cpu servers0 servers
  servers0=$(servers_cpu_s)
  t0=$(now); start "$log"; wait_port "$FP"; wait_port "$TP"; t1=$(now)
  cpu=$(cpu_s "$PID"); servers=$(python3 -c "print(round(($(servers_cpu_s)-$servers0)*1000))")
  local ms waiting
  ms=$(grep -o 'replicated job log recovered from JetStream.*millis=[0-9]*' "$log" | grep -o 'millis=[0-9]*' | cut -d= -f2)
  waiting=$(status | python3 -c "import json,sys; print(sum(json.load(sys.stdin)['waiting_messages_by_queue'].values()))")
  echo "  $1: recovered $waiting jobs; recovery ${ms} ms in the router; exec to listening" \
    "$(python3 -c "print(round(($t1-$t0)*1000))") ms; router CPU to listening $(python3 -c "print(round($cpu*1000))") ms;" \
    "nats-servers' CPU meanwhile ${servers} ms; load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -o 'replicated job log recovered from JetStream.*' "$log" | sed 's/^/    /'
  kill_router
  rm -f "$log"
}

{
  echo "# emq-router replicated job log: recovery of $N queued 64-byte jobs from JetStream, rev $REV, $(nproc) cores," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cluster: $EMQ_NATS_URLS (servers $("${EMQ_NATS_SERVER:-$ROOT/.venv-nats/bin/nats-server}" --version 2>&1)," \
    "PIDs ${EMQ_NATS_PIDS:-unknown})"
  FP=$(port) BP=$(port) AP=$(port) TP=$(port)
  fresh_data
  start "$DATA.fill.log"
  wait_port "$FP"; wait_port "$TP"
  fill=$("$BIN/emq-bench" fill --frontend "tcp://127.0.0.1:$FP" --queue default --jobs "$N" --pid "$PID")
  echo "fill (eMQP, acknowledged after the PubAck): $fill"
  echo "  jobs/s: $(python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(round(r['jobs']/r['seconds']))" "$fill")"
  streams=$(python3 loadtest/nats_streams.py "$EMQ_NATS_URLS" list "^${PREFIX}_${NAME}_")
  for s in $streams; do
    echo "  stream $s: $(python3 loadtest/nats_streams.py "$EMQ_NATS_URLS" info "$s" | python3 -c "import json,sys
st=json.load(sys.stdin); print(f\"{st['messages']} messages, {st['bytes']} bytes = {st['bytes']/$N:.1f} bytes per queued job (all streams: sum)\")")"
  done
  status | python3 -c "import json,sys
for s in json.load(sys.stdin)['emq']['wal']['shards']:
    print(f\"  shard {s['shard']}: live_jobs {s['live_jobs']}, stream_bytes {s['stream_bytes']}, published {s['published']} messages\")"
  rm -f "$DATA.fill.log"
  kill_router
  for i in $(seq "$RESTARTS"); do
    sleep $((LEASE_S + 1))
    restart "restart $i (kill -9 before, lease waited out, empty data directory)"
  done
} | tee "$OUT"
