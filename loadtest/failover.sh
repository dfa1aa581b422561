#!/usr/bin/env bash
# Failover of a replicated router under a probe client (issue 28 part 6):
# time from `kill -9` of the owner to the first acceptance by the standby,
# with JOBS (default 100,000) jobs queued, and what a client saw meanwhile.
#
#   loadtest/failover.sh [ROUNDS]           # default 10 take-overs
#
# Builds nothing: it runs the release binaries in
# ${CARGO_TARGET_DIR:-<repo>/target}/release (emq-router, emq-bench; build
# them first with `cargo build --release --bins`). It starts a local 3-node
# NATS JetStream cluster (loadtest/nats-cluster.sh) in a temporary
# directory, then loadtest/failover_probe.py: router A (owner) and router
# B (`--standby`) under a fresh router name and stream prefix, on fresh
# loopback ports, each with its own --data-dir in the temporary directory;
# JOBS 64-byte jobs queued on queue `fill` (text SCHEDs, `emq-bench fill
# --text`, then STATUS until all wait); a probe client sending an eMQP
# REQUEST every 20 ms to both frontends (one DEALER, ZMQ_IMMEDIATE=1,
# re-sending a request unanswered for 1 s with the same msgid); ROUNDS
# times: kill -9 the owner, measure, restart it as `--standby` and wait
# until its STATUS says standby (roles alternate).
#
# Results: loadtest/results/<date>-<rev>-failover/ (EMQ_BENCH_OUT
# overrides): rounds.csv, rounds.json, probe-events.csv (every send,
# re-send, blocked send, acceptance, refusal), run.json, the routers' and
# servers' logs, summary.md and failover.svg. Everything started is stopped
# by PID at the end, also on failure or Ctrl-C; the temporary directory is
# removed. Env: JOBS, EMQ_NATS_SERVER (the nats-server binary), EMQ_BIN_DIR
# (another directory holding emq-router and emq-bench).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ROUNDS=${1:-10}
JOBS=${JOBS:-100000}
BIN=${EMQ_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
PY=${EMQ_BENCH_PYTHON:-}
if [ -z "$PY" ]; then
  for p in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python python3; do
    if "$p" -c 'import zmq' 2>/dev/null; then PY=$p; break; fi
  done
fi
[ -n "$PY" ] || { echo "no python with pyzmq (set EMQ_BENCH_PYTHON)" >&2; exit 1; }
for b in emq-router emq-bench; do
  [ -x "$BIN/$b" ] || { echo "no $BIN/$b: cargo build --release --bins first" >&2; exit 1; }
done
if [ -z "${EMQ_NATS_SERVER:-}" ] && [ ! -x "$ROOT/.venv-nats/bin/nats-server" ] && [ -x /work/main/.venv-nats/bin/nats-server ]; then
  export EMQ_NATS_SERVER=/work/main/.venv-nats/bin/nats-server
fi
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${EMQ_BENCH_OUT:-$ROOT/loadtest/results/$(date -u +%Y-%m-%d-%H%M)-$REV-failover}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/emq-failover-XXXXXX)
NATS_DIR=$WORK/nats
PROBE=
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$PROBE" ] && kill -0 "$PROBE" 2>/dev/null; then
    kill -TERM "$PROBE" 2>/dev/null || true
    wait "$PROBE" 2>/dev/null || true
  fi
  local f pid
  for f in "$WORK"/pids/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ -d "$NATS_DIR" ] && loadtest/nats-cluster.sh stop "$NATS_DIR" || true
  for n in 1 2 3; do [ -f "$NATS_DIR/n$n.log" ] && cp "$NATS_DIR/n$n.log" "$OUT/nats-n$n.log"; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

uptime >"$OUT/uptime-start.txt"
started=$(loadtest/nats-cluster.sh start "$NATS_DIR")
URLS=$(sed -n 's/^urls=//p' <<<"$started")
PIDS=$(sed -n 's/^pids=//p' <<<"$started")
{
  echo "cluster: $(tr '\n' ' ' <<<"$started")"
  "${EMQ_NATS_SERVER:-$ROOT/.venv-nats/bin/nats-server}" --version 2>&1 || true
  echo "binaries: $BIN ($(stat -c %y "$BIN/emq-router"))"
} >"$OUT/cluster.txt"
set +e
"$PY" loadtest/failover_probe.py run --bin "$BIN" --nats-urls "$URLS" --nats-pids "$PIDS" --work "$WORK" \
  --out "$OUT" --rounds "$ROUNDS" --jobs "$JOBS" &
PROBE=$!
wait "$PROBE"
rc=$?
PROBE=
set -e
uptime >"$OUT/uptime-end.txt"
"$PY" loadtest/failover_probe.py report --out "$OUT" --rev "$REV" --cores "$(nproc)" \
  --cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" || rc=1
echo "results: $OUT" >&2
exit "$rc"
